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
#include <vector>

#include "glossa/base/file.h"
#include "glossa/model/base_model.h"
#include "glossa/optim/ema.h"
#include "glossa/checkpoint/checkpointer.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/parallel_plan.h"

namespace glossa {

class Distributed;
class EventWriter;
class DataParallelGradientSync;
class ProgressBar;

struct ExecutorOptions {
  std::string logdir;
  // Console lines (the progress line, saves); null: stdout, with a progress bar redrawn in place
  // between the lines when stdout is a terminal (glossa/base/progress.h).
  std::function<void(const std::string&)> log;
  // 0: no per-loop lines; 1: one concise progress line per loop ("step 400/1200 (33%) · loss
  // ... · ETA 1:30"); 2: also Lingvo's full metric line.
  int verbosity = 1;
  // The progress line at most every this many steps (0: every train loop); the last always.
  int64_t log_every_n_steps = 0;
  // Within a loop, a line after the run's first step and then at least this often (a long loop on a
  // loaded machine is never silent); negative: none.
  double heartbeat_seconds = 30;
  // Wall time in seconds (save intervals); injectable.
  std::function<double()> clock;
  // Model Params per dataset the program schedule evaluates or decodes in the trainer
  // (GetModelParams(key, dataset, ...)). Only the eval task's input is taken from them: the
  // programs run the trained model (its EMA in eval mode when it keeps one) on that input.
  std::map<std::string, Params> dataset_params;
  // Data-parallel workers (glossa/runtime/distributed.h, docs/distributed.md); null: one. Every
  // rank checks that all run the same configuration, reads its shard of the input (the batch in
  // the Params is the global batch), starts from rank 0's state (its checkpoint, or its
  // initialization) and averages gradients over the ranks; rank 0 alone holds the logdir's lock
  // and writes checkpoints, events, metrics.jsonl, control/ and the MLPerf log.
  Distributed* distributed = nullptr;
  // Gradient buckets (PyTorch DDP's bucket_cap_mb), and whether their allreduce starts while the
  // backward pass still runs.
  int64_t grad_bucket_bytes = 25 << 20;
  bool overlap_grad_reduce = true;
  // The device mesh over the workers, "data:D,expert:E" or "pipe:S" (ParseMesh); empty: the
  // expert axis over every rank.
  std::string mesh;
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
  // With several ranks: one line on the gradient allreduce (bytes and exposed time per step).
  std::string GradientSyncSummary() const;

 private:
  void Log(const std::string& line);
  // Ends a diverged run: waits for a pending save, closes `writer` and throws
  // TrainingDivergedError naming the last healthy checkpoint (no final save).
  [[noreturn]] void Diverged(const std::string& message, EventWriter* writer);
  // Lingvo's EarlyStop over task.train.early_stop's metric history; true: stop training.
  bool EarlyStopCheck();
  // What Run sets up for its train loops (executor.cc), and the loops themselves.
  struct RunState;
  void TrainLoops(RunState& run);
  // Saves at global_step_ when `due` on the chief and returns whether it did. A sharded model's
  // ranks agree first; each writes its experts' shard, all wait, then the chief writes the
  // checkpoint (so none is visible before every shard is complete).
  bool SaveCheckpoint(bool due, bool healthy);
  Params params_;
  ExecutorOptions options_;
  std::unique_ptr<DirectoryLock> lock_;  // one trainer per logdir
  std::unique_ptr<ProgressBar> bar_;
  // With several ranks: the parallel plan (before the model, which outlives it: its layers keep
  // the plan's axes in their BuildContext).
  std::unique_ptr<ParallelPlan> plan_;
  std::unique_ptr<BaseModel> model_;
  std::shared_ptr<ExponentialMovingAverage> ema_;
  std::unique_ptr<Checkpointer> checkpointer_;
  // With several ranks: builds the plan and the model in its context; joins the ranks' state;
  // logs each axis's traffic.
  void BuildModel();
  void JoinRanks(Distributed& dist);
  void LogModelParallelSummary(int64_t first_step);
  std::string train_dir_;
  bool chief_ = true;
  std::vector<std::shared_ptr<DataParallelGradientSync>> syncs_;
  int64_t global_step_ = 0;
  // Some variable was initialized from the per-process random seed (no random_seed set).
  bool used_process_seed_ = false;
  std::atomic<bool> stop_{false};
};

}  // namespace glossa
