// Decoding and the evaler/decoder jobs (Lingvo's decoder and evaler runners).
//
// DecodeProgram runs a task's Decode over steps_per_loop batches (-1: until OutOfRange), hands each
// batch's output to PostProcessDecodeOut, and writes the lines to `decoder_out_%09d` and the
// decoder metrics as summaries.
//
// RunCheckpointJob polls <logdir>/train for new checkpoints (backoff 1 s doubling to 5 min), runs
// the eval or decode program on each (the newest only, unless eval_all_checkpoints /
// decode_all_checkpoints), records it in <job dir>/processed_ckpts.txt (so a restart skips it),
// writes summaries and score-%08d.txt, and returns after the checkpoint at max_steps.
//
//   JobOptions o{.logdir = "/tmp/lm", .dataset = "Dev"};
//   RunCheckpointJob(JobKind::kEval, GetModelParams(key, "Dev"), o);   // <logdir>/eval_dev/
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "glossa/core/params.h"
#include "glossa/model/model_registry.h"

namespace glossa {

class EventWriter;

class DecodeProgram {
 public:
  DecodeProgram(BaseModel& model, EventWriter* writer);
  struct Result {
    std::map<std::string, double> metrics;
    std::vector<std::string> lines;
    int64_t batches = 0;
  };
  // `max_batches` -1: until OutOfRange. Writes `out_dir`/decoder_out_%09d when out_dir is set.
  Result Run(int64_t global_step, int64_t max_batches, const std::string& out_dir = "");

 private:
  BaseModel& model_;
  EventWriter* writer_;
};

enum class JobKind { kEval, kDecode };

struct JobOptions {
  std::string logdir;
  std::string dataset;  // e.g. "Dev": the job directory is eval_dev / decoder_dev
  std::function<void(const std::string&)> log;  // null: stdout
  std::function<void(double)> sleep;            // null: real sleep
  const std::atomic<bool>* stop = nullptr;      // returns when set
  double max_backoff_seconds = 300;
};

// "<logdir>/eval_<dataset>" or "<logdir>/decoder_<dataset>" (dataset lower-cased).
std::string ProgramDir(JobKind kind, const std::string& logdir, const std::string& dataset);

// Returns the number of checkpoints processed in this run.
int64_t RunCheckpointJob(JobKind kind, const Params& model_params, const JobOptions& options);

}  // namespace glossa
