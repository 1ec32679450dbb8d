// The executor: trains a model in a log directory laid out as Lingvo's —
//   <logdir>/train/    checkpoints, the state file, train events and metrics.jsonl
//   <logdir>/control/  params.txt (the model's params text), model_analysis.txt (every variable's
//                      shape and count, and the total)
// It restores the latest checkpoint (or, when there is none, applies init_from_checkpoint_rules),
// runs train loops until max_steps, saves when save_interval_steps / save_interval_seconds have
// passed and at the end, and stops cleanly (finishing the step and saving) on RequestStop().
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

#include "glossa/model/model_registry.h"
#include "glossa/optim/ema.h"
#include "glossa/runtime/saver.h"

namespace glossa {

class EventWriter;

struct ExecutorOptions {
  std::string logdir;
  // Console lines (the step line, saves); null: stdout.
  std::function<void(const std::string&)> log;
  // Wall time in seconds (save intervals); injectable.
  std::function<double()> clock;
  // Model Params per dataset the program schedule evaluates or decodes in the trainer
  // (GetModelParams(key, dataset, ...)); variables are copied from the trained model (its EMA
  // when there is one) before each program.
  std::map<std::string, Params> dataset_params;
};

// Every tensor a checkpoint holds for a model: variables, learner slots, EMA shadows, global_step.
std::map<std::string, at::Tensor> CheckpointTensors(const BaseModel& model,
                                                    const ExponentialMovingAverage* ema,
                                                    int64_t global_step);
// The EMA a model's main task asks for (train.ema_decay > 0 or train.ema_schedule), tracking the
// model's variables and installed as its EMA source (eval-mode theta reads it); null otherwise.
std::shared_ptr<ExponentialMovingAverage> MakeModelEma(BaseModel& model);
// Restores variables (names, shapes, dtypes checked; every mismatch reported) and, with `ema`, its
// shadows: what evaluation needs. Returns global_step, or nullopt when the checkpoint has none.
std::optional<int64_t> RestoreForEval(const SafetensorsContents& ckpt, BaseModel& model,
                                      ExponentialMovingAverage* ema);
// RestoreForEval plus the learner slots; returns the global step (DataLoss when absent).
int64_t RestoreCheckpoint(const SafetensorsContents& ckpt, BaseModel& model,
                          ExponentialMovingAverage* ema);

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
  void Save();
  // Runs the schedule's eval and decode programs; true when an MLPerf run reached its target.
  bool RunEvalPrograms(int64_t epoch);
  void MlLog(const std::string& key, const std::string& event_type, const std::string& value_json,
             const std::string& metadata_json = "{}");
  std::map<std::string, std::unique_ptr<BaseModel>> eval_models_;
  std::map<std::string, std::unique_ptr<EventWriter>> eval_writers_;
  Params params_;
  ExecutorOptions options_;
  std::unique_ptr<BaseModel> model_;
  std::shared_ptr<ExponentialMovingAverage> ema_;
  std::unique_ptr<Saver> saver_;
  std::string train_dir_;
  int64_t global_step_ = 0;
  std::atomic<bool> stop_{false};
};

}  // namespace glossa
