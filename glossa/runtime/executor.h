// The executor: trains a model in a log directory laid out as Lingvo's —
//   <logdir>/train/    checkpoints, the state file, train events and metrics.jsonl
//   <logdir>/control/  params.txt (the model's params text), model_analysis.txt (every variable's
//                      shape and count, and the total)
//   <logdir>/eval_<dataset>/, decoder_<dataset>/   the program schedule's eval and decode programs
// It ties the runtime's parts together: the Checkpointer restores (or warm-starts) and saves on
// its cadence, the TrainProgram runs train loops until max_steps, the ProgramSchedule runs eval and
// decode programs (and MLPerf logging) between them; RequestStop() stops cleanly (finishing the
// step and saving).
//
//   Executor ex(GetModelParams("lm.austen.TransformerLmTiny", "Train"), {.logdir = "/tmp/lm"});
//   ex.Run();
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "glossa/base/file.h"
#include "glossa/model/base_model.h"
#include "glossa/optim/ema.h"
#include "glossa/runtime/checkpointer.h"

namespace glossa {

struct ExecutorOptions {
  std::string logdir;
  // Console lines (the step line, saves); null: stdout.
  std::function<void(const std::string&)> log;
  // Wall time in seconds (save intervals); injectable.
  std::function<double()> clock;
  // Model Params per dataset the program schedule evaluates or decodes in the trainer
  // (GetModelParams(key, dataset, ...)). Only the eval task's input is taken from them: the
  // programs run the trained model (its EMA in eval mode when it keeps one) on that input.
  std::map<std::string, Params> dataset_params;
};

// model_analysis.txt: every variable with its shape and count, then "total #params: N".
std::string ModelAnalysis(const BaseModel& model);

class Executor {
 public:
  Executor(const Params& model_params, ExecutorOptions options);
  ~Executor();
  // Trains to max_steps (or until RequestStop); returns the final global step.
  int64_t Run();
  // Asks the run to stop after the current step (safe from a signal handler).
  void RequestStop() { stop_.store(true); }
  BaseModel& model() { return *model_; }
  int64_t global_step() const { return global_step_; }

 private:
  void Log(const std::string& line);
  // Lingvo's EarlyStop over task.train.early_stop's metric history; true: stop training.
  bool EarlyStopCheck();
  Params params_;
  ExecutorOptions options_;
  std::unique_ptr<DirectoryLock> lock_;  // one trainer per logdir
  std::unique_ptr<BaseModel> model_;
  std::shared_ptr<ExponentialMovingAverage> ema_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::string train_dir_;
  int64_t global_step_ = 0;
  std::atomic<bool> stop_{false};
};

}  // namespace glossa
