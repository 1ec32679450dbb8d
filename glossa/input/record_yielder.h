// RecordYielder: streams records from file patterns with Lingvo's semantics: parallel readers, a
// shuffle buffer, file order reshuffled each epoch from (epoch, file_random_seed), every record
// exactly once per epoch, optional sequential order with a repeat count, mixing of several sources
// by weight (each record tagged with its source_id), and sharding between data-parallel replicas.
// End of data is OutOfRangeError, never confused with an error.
//
//   YielderOptions o;  o.file_pattern = {"tfrecord:/data/train@16"};
//   RecordYielder y(o);
//   Record r = y.Next();   // r.value, r.source_id; OutOfRangeError when exhausted
//
// File patterns: "<type>:<pattern>" with type tfrecord, tfrecord_gzip or text; the pattern may be
// a glob, a comma-separated list, or a sharded name "name@N" (name-00000-of-0000N ...) or "name@*".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace glossa {

struct Record {
  std::string value;
  int source_id = 0;
};

struct YielderOptions {
  // One pattern per source; several sources need input_source_weights.
  std::vector<std::string> file_pattern;
  std::vector<double> input_source_weights;
  // 0 means nondeterministic.
  int64_t file_random_seed = 301;
  int64_t file_buffer_size = 10000;
  int64_t file_parallelism = 16;
  bool require_sequential_order = false;
  // Epochs to read; -1 repeats forever.
  int64_t repeat_count = -1;
  int64_t num_input_replicas = 1;
  int64_t input_replica_id = 0;
  bool skip_corrupt_records = false;
  // Text files: longer lines are DataLoss (RecordReaderOptions::max_line_bytes).
  int64_t max_line_bytes = int64_t{1} << 20;
};

// The files a pattern names, sorted, and their type. NotFound naming the pattern when nothing
// matches; InvalidArgument for a malformed pattern.
struct FileList {
  std::string type;
  std::vector<std::string> files;
};
FileList ExpandFilePattern(const std::string& pattern);

class RecordYielder {
 public:
  explicit RecordYielder(const YielderOptions& options);
  ~RecordYielder();
  RecordYielder(const RecordYielder&) = delete;
  RecordYielder& operator=(const RecordYielder&) = delete;

  // The next record (thread-safe). OutOfRangeError at end of data (after repeat_count epochs);
  // DataLoss/NotFound from the files propagate.
  Record Next();
  // Epochs started by source 0 (1-based once reading begins).
  int64_t current_epoch() const;
  // Corrupt records skipped (skip_corrupt_records).
  int64_t num_corrupt_skipped() const;

 private:
  struct Source;
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace glossa
