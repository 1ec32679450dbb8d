// What a person watching training sees (Lingvo's and Marian's console in spirit): one concise
// line per train loop, and on a terminal a progress bar redrawn in place between the lines.
//
//   step 400/1200 (33%) · loss 4.42 · log_pplx 4.42 · lr 1.6e-3 · 8.9 steps/s · 26.1k tok/s ·
//   elapsed 0:45 · ETA 1:30
//
// The full metric set stays in the events and metrics.jsonl (and in the old-style line with
// --verbosity=2).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace glossa {

struct ProgressLine {
  int64_t step = 0, max_steps = 0;
  std::optional<double> loss, log_pplx, learning_rate;
  double steps_per_sec = 0;
  double tokens_per_sec = 0;  // 0: not shown (an input without paddings)
  double elapsed_seconds = 0;
};

// "step 400/1200 (33%) · loss 4.42 · ..." (ETA from steps_per_sec; omitted when unknown).
std::string FormatProgressLine(const ProgressLine& p);
// 45 -> "0:45", 90 -> "1:30", 3723 -> "1:02:03"; "?" for a negative or non-finite value.
std::string FormatDuration(double seconds);
// 26100 -> "26.1k", 1.2e6 -> "1.2M", 950 -> "950".
std::string FormatCount(double value);

// A one-line bar on a terminal: "[=======>          ] 412/1200 34% · 8.9 steps/s · ETA 1:29",
// redrawn in place (carriage return, erase to end of line). Clear() before printing a line.
// Does nothing when `out` is not a terminal.
class ProgressBar {
 public:
  explicit ProgressBar(FILE* out);
  bool enabled() const { return enabled_; }
  void Update(int64_t step, int64_t max_steps, double steps_per_sec);
  void Clear();

 private:
  FILE* out_;
  bool enabled_ = false;
  bool drawn_ = false;
};

// Progress of a long setup step (counting unigrams, training a SentencePiece model), so that no
// pause is silent: "counting unigrams over Train: 1,200 batches (410/s)". On a terminal the count
// is redrawn in place; otherwise a line is printed at most every `every_seconds` and at Done.
class CountProgress {
 public:
  CountProgress(FILE* out, std::string what, std::string unit, double every_seconds = 5);
  void Add(int64_t n = 1);
  // The final line: the count, the rate and `suffix`.
  void Done(const std::string& suffix = "");

 private:
  std::string Text() const;
  FILE* out_;
  std::string what_, unit_;
  double every_;
  bool tty_;
  int64_t count_ = 0;
  double start_, last_print_;
};

// "1,234,567".
std::string WithCommas(int64_t n);

}  // namespace glossa
