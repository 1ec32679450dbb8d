// TensorBoard event files: `events.out.tfevents.<unix seconds>.<hostname>` in TFRecord framing;
// the first record is Event{wall_time, file_version: "brain.Event:2"}, then one Event per summary
// (scalars as simple_value, histograms, text through the text plugin). A human-readable
// `metrics.jsonl` (one JSON object per scalar: step, wall_time, tag, value) is written next to it.
//
//   EventWriter w("/logdir/train");
//   w.WriteScalar("loss", 2.31, /*step=*/1200);
//   for (const auto& e : ReadEvents(w.path())) ...;
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace glossa {

class EventWriter {
 public:
  // Creates `logdir` if needed and a new event file in it. Flushes every `flush_secs` from a
  // background thread and at Close/destruction. `clock` returns wall time in seconds (injectable).
  explicit EventWriter(const std::string& logdir, double flush_secs = 30.0,
                       std::function<double()> clock = nullptr);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void WriteScalar(const std::string& tag, double value, int64_t step);
  // A histogram of the tensor's values with TensorFlow's default bucket limits.
  void WriteHistogram(const std::string& tag, const at::Tensor& values, int64_t step);
  void WriteText(const std::string& tag, const std::string& text, int64_t step);
  void Flush();
  void Close();
  const std::string& path() const { return path_; }
  const std::string& metrics_log_path() const { return metrics_path_; }

 private:
  void WriteEvent(const std::string& serialized_event, double wall_time);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_, metrics_path_;
};

// Removes the lines of a metrics.jsonl whose step is after `step` (a resumed run replays those
// steps and writes them again). Returns the number removed; the file is rewritten atomically,
// and left alone when there is nothing to remove.
int64_t DropMetricLinesAfter(const std::string& metrics_path, int64_t step);

struct EventRecord {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;  // set on the file_version event
  std::string tag;
  enum class Kind { kFileVersion, kScalar, kHistogram, kText, kOther } kind = Kind::kOther;
  double value = 0;  // scalars
  std::string text;  // text summaries
  double histogram_count = 0;
};

// Every event of a file (one EventRecord per summary value; file_version events as their own).
// DataLoss for corrupt records or unparsable events, naming the file and record; with `damage`,
// the events before the damage instead, and *damage says what it was (empty: none).
std::vector<EventRecord> ReadEvents(const std::string& path, std::string* damage = nullptr);

}  // namespace glossa
