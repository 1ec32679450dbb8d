// RecordBatcher: processor threads turn records into (NestedMap, bucket key) pairs and group them
// into batches by bucket, with Lingvo's rules: a record goes to the first bucket whose
// bucket_upper_bound is >= its key; keys above the last bound are skipped and counted; negative
// keys drop the record (counted); a bucket emits a batch as soon as it holds bucket_batch_limit[i]
// samples; with flush_every_n, all buckets are flushed after every n processed records; at end of
// data partial buckets are flushed, then OutOfRange. Tensors are padded to the longest in the batch
// along every dimension that differs (pad value from pad_values, else 1 for keys ending in
// "paddings", else 0) and stacked. With BatcherOptions::packing, several examples share a row
// instead (Lingvo's packed_input). Finished batches wait in a prefetch queue (the infeed).
//
//   RecordBatcher b(yielder, options, [](const Record& r) { return Process(r); });
//   NestedMap batch = b.Next();
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "glossa/core/nested_map.h"
#include "glossa/input/record_yielder.h"
#include "glossa/input/sequence_packer.h"

namespace glossa {

struct BatcherOptions {
  std::vector<int64_t> bucket_upper_bound = {100};
  std::vector<int64_t> bucket_batch_limit = {16};
  int64_t num_batcher_threads = 1;
  // Flush every bucket after this many processed records; 0: never.
  int64_t flush_every_n = 0;
  // Batches kept ready ahead of the consumer.
  int64_t prefetch = 4;
  // Pad values by flattened key (e.g. "ids" -> 2 for EOS padding).
  std::map<std::string, double> pad_values;
  // With packing.rows > 0, examples are packed into rows (glossa/input/sequence_packer.h) instead
  // of bucketed: a negative key still drops a record, an example longer than a row is counted as
  // too long, flush_every_n and the end of data flush the open rows.
  PackingOptions packing;
};

// A processed record and its bucket key; nullopt drops the record.
using RecordProcessor = std::function<std::optional<std::pair<NestedMap, int64_t>>(const Record&)>;

// Pads the tensors of `examples` to a common shape and stacks them along a new dim 0 (strings and
// numbers become lists). InvalidArgument when structures or ranks differ.
NestedMap PadAndStack(const std::vector<NestedMap>& examples,
                      const std::map<std::string, double>& pad_values = {});

class RecordBatcher {
 public:
  // InvalidArgument for unsorted or mismatched bucket params.
  RecordBatcher(std::shared_ptr<RecordYielder> yielder, const BatcherOptions& options,
                RecordProcessor processor);
  ~RecordBatcher();
  RecordBatcher(const RecordBatcher&) = delete;
  RecordBatcher& operator=(const RecordBatcher&) = delete;

  // The next batch; OutOfRangeError after the last one. Errors from reading or processing
  // propagate.
  NestedMap Next();

  int64_t num_skipped_too_long() const;
  int64_t num_dropped() const;
  int64_t num_processed() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace glossa
