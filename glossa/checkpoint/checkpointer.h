// The checkpointer (Lingvo's checkpointer.py): what a model's checkpoint holds, how it is restored,
// and when the trainer saves. It sits on the file-level Saver (saver.h: file layout, state file,
// retention, sanity checks, asynchronous writes) and is shared by the executor (restore, warm
// start, save cadence) and the evaler/decoder jobs (RestoreForEval).
//
//   Checkpointer ckpt(train_dir, model, ema.get(), clock);
//   int64_t step = ckpt.RestoreOrInitialize(log);   // latest checkpoint, or init rules, or 0
//   ... train ...;  ckpt.MaybeSave(step);            // save_interval_steps / _seconds
//   ckpt.SaveIfNew(step);  ckpt.Wait();              // at the end of the run
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "glossa/core/param_value.h"
#include "glossa/model/base_model.h"
#include "glossa/optim/ema.h"
#include "glossa/checkpoint/saver.h"

namespace glossa {

// Every tensor a checkpoint holds for a model: variables, learner slots (a multi-task model's
// under "<task>/"), EMA shadows, global_step.
std::map<std::string, at::Tensor> CheckpointTensors(const BaseModel& model,
                                                    const ExponentialMovingAverage* ema,
                                                    int64_t global_step);
// The EMA a model's main task asks for (train.ema_decay > 0 or train.ema_schedule), tracking the
// model's variables and installed as its EMA source (eval-mode theta reads it); null otherwise.
std::shared_ptr<ExponentialMovingAverage> MakeModelEma(BaseModel& model);
// Restores variables (names, shapes, dtypes checked; every mismatch reported) and, with `ema`, its
// shadows: what evaluation needs. Returns global_step, or nullopt when the checkpoint has none.
// A shadow missing from the checkpoint is NotFound naming the variables (evaluating the shadows'
// initial values would score untrained weights, as Lingvo's EMA saver refuses to); with
// `missing_shadows_from_variables` (resuming training) it starts from the restored variable.
std::optional<int64_t> RestoreForEval(const SafetensorsContents& ckpt, BaseModel& model,
                                      ExponentialMovingAverage* ema,
                                      bool missing_shadows_from_variables = false);
// The checkpoint's global_step, checked: a scalar integer >= 0 that equals the step in the
// prefix's name when it is "ckpt-<N>". DataLoss naming the checkpoint otherwise (absent: nullopt).
std::optional<int64_t> CheckedGlobalStep(const SafetensorsContents& ckpt, const std::string& prefix);

// RestoreForEval plus the learner slots; returns the global step (DataLoss when absent). Tensors
// under the model's RemoteScopes (other pipeline stages') are left out.
int64_t RestoreCheckpoint(const SafetensorsContents& ckpt, BaseModel& model,
                          ExponentialMovingAverage* ema);

// Parses train.init_from_checkpoint_rules ({checkpoint: [[(regex, format), ...], [ignore, ...]]})
// into Saver's InitRules; InvalidArgument naming the checkpoint key when malformed.
std::map<std::string, InitRules> ParseInitFromCheckpointRules(const ParamValue& rules);

class Checkpointer {
 public:
  // Saves to `train_dir` as the model's main task's train Params say: save_interval_steps (or
  // save_interval_seconds), save_max_to_keep, save_keep_checkpoint_every_n_hours,
  // async_checkpointing, checkpoint_finite_check; global_step is checked to lie in
  // [0, max_steps + steps_per_loop]. `clock` returns wall time in seconds.
  Checkpointer(const std::string& train_dir, BaseModel& model, ExponentialMovingAverage* ema,
               std::function<double()> clock);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Restores the latest checkpoint of train_dir (variables, learner slots, EMA shadows) and returns
  // its global step; without one, applies init_from_checkpoint_rules (when set) and returns 0.
  // `log` receives one line saying what was done.
  int64_t RestoreOrInitialize(const std::function<void(const std::string&)>& log);
  // Saves when save_interval_steps (or, unset, save_interval_seconds) have passed since the last
  // save or the restore. Returns whether it saved.
  // `healthy`: no step was skipped since the previous save (Saver::Save).
  bool MaybeSave(int64_t global_step, bool healthy = true);
  // Saves unless `global_step` is already the latest checkpoint (the end of a run).
  // Returns whether it saved.
  bool SaveIfNew(int64_t global_step, bool healthy = true);
  void Save(int64_t global_step, bool healthy = true);
  // Waits for an asynchronous save; rethrows its error.
  void Wait();
  // Whether MaybeSave would save at `global_step`, and whether SaveIfNew would (the ranks of a
  // sharded model agree on it before each writes its shard).
  bool SaveDue(int64_t global_step) const;
  bool IsNew(int64_t global_step) const;
  // Model parallelism: this rank's pieces of the variables it does not hold whole, or that other
  // ranks lack (saver.h: ShardLayout; their slots and averages alike). Restores cut the pieces
  // from the whole checkpoint (any mesh's); Save leaves those variables out of the chief's file,
  // which it marks sharded_ranks = `ranks` (the ranks that write them with SaveRankPieces). A
  // variable of another rank's pipeline stage is in no layout: RestoreCheckpoint drops what the
  // model's RemoteScopes hold.
  void SetShards(ShardLayout layout, int ranks);
  // The checkpoint RestoreOrInitialize restored ("" when none).
  const std::string& restored_prefix() const { return restored_prefix_; }
  const std::string& train_dir() const { return train_dir_; }
  // Whether RestoreOrInitialize restored a checkpoint (false: the model starts from its
  // initialization, or from init_from_checkpoint_rules).
  bool restored() const { return restored_; }

  // Skips every task's training input of `model` to the position saved in `ckpt` (older
  // checkpoints hold none: the input starts over).
  // `stop` (when set) is asked between chunks of batches: true ends the skipping early (a stop
  // request; the run then trains nothing).
  static void RestoreInputPositions(const SafetensorsContents& ckpt, BaseModel& model,
                                    const std::function<void(const std::string&)>& log,
                                    const std::function<bool()>& stop = {});
  // What RestoreOrInitialize asks while it skips the input (the trainer's stop request).
  void SetStopRequested(std::function<bool()> stop) { stop_requested_ = std::move(stop); }

 private:
  std::string train_dir_;
  bool restored_ = false;
  std::string restored_prefix_;
  ShardLayout shard_layout_;
  int shard_ranks_ = 0;
  BaseModel& model_;
  ExponentialMovingAverage* ema_;
  std::function<double()> clock_;
  std::function<bool()> stop_requested_;
  std::unique_ptr<Saver> saver_;
  std::optional<int64_t> save_interval_steps_;
  double save_interval_seconds_ = 0;
  int64_t last_save_step_ = 0;
  double last_save_time_ = 0;
};

}  // namespace glossa
