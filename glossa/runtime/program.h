// Programs (Lingvo's program.py): a TrainProgram runs steps_per_loop training steps (input →
// FProp → loss → learner → EMA → global step), accumulating weighted metrics over the loop and
// writing summaries; an EvalProgram averages a model's weighted metrics over an eval set; a
// DecodeProgram runs the task's Decode over decode batches and writes its metrics and lines.
//
// Each program run opens a SummaryContext (glossa/summary/summary.h) with one SummaryLoop around
// its steps, so what layers record in FProp (e.g. the MoE layers' over_capacity_1_ratio) is
// reduced over the loop (scalars by mean or sum, tensors stacked) and written at the loop's end:
// scalars as scalar events (and metrics.jsonl lines), tensors as histograms. Per-example
// summaries go with the step's per-example outputs — the train outfeed (ProcessFPropResults), the
// decode output each PostProcessDecodeOut call sees — and train and eval write them as histograms
// too (concatenated over the loop), so a task that keeps no outfeed still shows them.
//
//   TrainProgram train(model, &writer, ema.get());
//   TrainProgram::LoopResult r = train.RunLoop(&global_step);   // advances global_step
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/io/event_file.h"
#include "glossa/model/base_model.h"
#include "glossa/optim/ema.h"

namespace glossa {

class Distributed;

// Weighted sums of metrics over a loop: mean = Σ value·weight / Σ weight.
class MetricsAccumulator {
 public:
  void Add(const Metrics& metrics);
  // name -> (weighted mean, total weight).
  std::map<std::string, std::pair<double, double>> Means() const;
  bool empty() const { return sums_.empty(); }

 private:
  std::map<std::string, std::pair<double, double>> sums_;
};

class TrainProgram {
 public:
  // `writer` and `ema` may be null. `log` receives the console line of each loop.
  TrainProgram(BaseModel& model, EventWriter* writer, ExponentialMovingAverage* ema,
               std::function<void(const std::string&)> log = nullptr);

  struct LoopResult {
    int64_t steps = 0;
    bool reached_max_steps = false;
    bool input_exhausted = false;
    // Steps whose update was skipped (non-finite loss or gradients, or a gradient norm over
    // grad_norm_to_clip_to_zero); a loop with none is healthy, and its checkpoint a good one.
    int64_t skipped_steps = 0;
    std::map<std::string, std::pair<double, double>> metrics;  // loop means and weights
    double steps_per_sec = 0, examples_per_sec = 0;
    // Non-padding tokens per second (of "tgt.paddings", else "paddings"; 0 without either).
    double tokens_per_sec = 0;
  };
  // Called after every step with the new global step (a progress bar).
  void SetStepCallback(std::function<void(int64_t)> fn) { on_step_ = std::move(fn); }
  // Runs up to steps_per_loop steps from *global_step (stopping at max_steps, or early when
  // `stop()` returns true), incrementing it after each step. Aborted ("training diverged") after
  // task.train.max_consecutive_skipped_steps skipped steps in a row.
  LoopResult RunLoop(int64_t* global_step, const std::function<bool()>& stop = nullptr);
  int64_t total_samples() const { return total_samples_; }
  int64_t total_num_params() const { return total_num_params_; }
  int64_t total_skipped() const { return total_skipped_; }
  int64_t consecutive_skipped() const { return consecutive_skipped_; }

 private:
  // RunLoop's parts (program.cc): the state of one loop, one step of it, and its end.
  struct LoopState;
  void TrainStep(LoopState& loop, BaseTask& task, const std::vector<LearnerVariable>& vars,
                 const NestedMap& batch, int64_t* global_step);
  void FinishLoop(LoopState& loop, double secs, int64_t global_step);
  BaseModel& model_;
  EventWriter* writer_;
  ExponentialMovingAverage* ema_;
  std::function<void(const std::string&)> log_;
  std::function<void(int64_t)> on_step_;
  int64_t total_samples_ = 0;
  int64_t total_num_params_ = 0;
  int64_t last_summary_step_ = -1;
  int64_t consecutive_skipped_ = 0, total_skipped_ = 0;
};

// Raised by TrainProgram::RunLoop when training diverged (Aborted).
class TrainingDivergedError : public AbortedError {
 public:
  using AbortedError::AbortedError;
};

class EvalProgram {
 public:
  EvalProgram(BaseModel& model, EventWriter* writer);
  // Resets the input (when it can), then averages metrics over samples_per_summary samples (0:
  // until OutOfRange), in eval mode. Writes the means at `global_step`.
  // `max_batches` >= 0 caps the batches (the program schedule's eval_steps_per_loop).
  std::map<std::string, std::pair<double, double>> Run(int64_t global_step,
                                                       int64_t max_batches = -1);
  // Examples the last Run evaluated (over every rank).
  int64_t last_samples() const { return last_samples_; }

 private:
  BaseModel& model_;
  EventWriter* writer_;
  int64_t last_samples_ = 0;
};

class DecodeProgram {
 public:
  DecodeProgram(BaseModel& model, EventWriter* writer);
  struct Result {
    std::map<std::string, double> metrics;
    std::vector<std::string> lines;
    int64_t batches = 0;
  };
  // Runs the task's Decode and PostProcessDecodeOut over `max_batches` batches (-1: until
  // OutOfRange or decoder_samples_per_summary lines), in eval mode; writes the decoder metrics and
  // summaries at `global_step`, and the lines to `out_dir`/decoder_out_%09d when out_dir is set.
  Result Run(int64_t global_step, int64_t max_batches, const std::string& out_dir = "");
  // A line ("decoding at step S: B batches, N examples, T s") at least every `every_seconds`
  // while Run goes on (a beam search over a test set can take minutes).
  void SetProgressLog(std::function<void(const std::string&)> log, double every_seconds = 30) {
    progress_log_ = std::move(log);
    progress_every_ = every_seconds;
  }

 private:
  BaseModel& model_;
  EventWriter* writer_;
  std::function<void(const std::string&)> progress_log_;
  double progress_every_ = 30;
};

enum class JobKind { kEval, kDecode };

// A program's directory (Lingvo's "<program>_<dataset>"): "<logdir>/eval_<dataset>" or
// "<logdir>/decoder_<dataset>", the dataset lower-cased.
std::string ProgramDir(JobKind kind, const std::string& logdir, const std::string& dataset);

// <dir>/score-%08d.txt (`step`): a "metric: value" line per metric, what the evaler and decoder
// jobs and the trainer's program schedule leave for `glossa report`. Returns its path.
std::string WriteScoreFile(const std::string& dir, int64_t step,
                           const std::map<std::string, double>& values);

// Writes summaries merged from a SummaryContext at `step`: one-element tensors as scalars, others
// as histograms.
void WriteSummaries(EventWriter& writer, const std::map<std::string, at::Tensor>& summaries,
                    int64_t step);

// Lingvo's console line: "step: 1200, steps/sec: 3.41, examples/sec: 54.6, loss: 2.3141, ...".
std::string FormatStepLine(int64_t step, double steps_per_sec, double examples_per_sec,
                           const std::map<std::string, std::pair<double, double>>& metrics);

}  // namespace glossa
