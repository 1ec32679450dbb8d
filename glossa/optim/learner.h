// Learner: Lingvo's learner. Computes the gradients of one loss from the task's metrics over the
// selected variables, adjusts them (L2/L1 regularization), scales them (global or per-tensor norm
// clipping, zeroing on NaN/Inf or huge norms), and applies the optimizer with
// learning_rate × lr_schedule(global_step).
//
//   Params p = Learner::Params();
//   p.Set("learning_rate", 1e-3).Set("optimizer", Adam::ParamsA());
//   auto learner = p.Instantiate<Learner>();
//   Metrics m = learner->Apply(task_metrics, LearnerVariables(*model), global_step);
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "glossa/core/params.h"
#include "glossa/layers/base_layer.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"

namespace glossa {

// A metric: a value and the weight it carries when metrics are averaged.
struct Metric {
  at::Tensor value;
  at::Tensor weight;
};
using Metrics = std::map<std::string, Metric>;

// A variable as the learner sees it.
struct LearnerVariable {
  std::string name;  // full name, e.g. "lm/enc/w"
  at::Tensor value;
  bool trainable = true;
  bool skip_lp_regularization = false;
  bool expert_sharded = false;  // kExpertShardedCollection: this rank's experts only
  bool pipeline_stage = false;  // kPipelineStageCollection: a layer of this rank's stage only
  bool model_sharded = false;   // kModelShardedCollection: this rank's block of a model axis
  std::vector<std::string> collections;  // all of them (WeightParams::collections)
  std::shared_ptr<FpropCopy> fprop_copy;  // BaseLayer::VariableInfo's (null: none)
  // Not held by every rank alike: its gradient is not averaged over the world (the gradient
  // sync reduces it over the ranks that hold the same values), and the gradient norm counts
  // each distinct value once.
  bool rank_local() const { return expert_sharded || pipeline_stage || model_sharded; }
};
// Every variable of a layer tree (trainable or not: the learner selects).
std::vector<LearnerVariable> LearnerVariables(const BaseLayer& model);

// Lingvo's GradNormTracker: rejects steps whose log gradient norm exceeds a running
// mean + clip_threshold·std. State (log_mean, log_mean_squared, total_weight, total_rejections)
// is saved with the learner's slots.
class GradNormTracker {
 public:
  // decay (0.995), grad_norm_lower_cap (1e-2), clip_threshold (4.0), grad_norm_clip_cap_min (0.0),
  // dry_run (False).
  static glossa::Params Params();
  explicit GradNormTracker(const glossa::Params& p);
  virtual ~GradNormTracker() = default;
  // 1.0 to keep the step, 0.0 to reject it; updates the state.
  double Update(double grad_norm, bool has_nan_or_inf);
  std::map<std::string, double>& state() { return state_; }

 private:
  glossa::Params params_;
  std::map<std::string, double> state_;
};

// Lingvo's --enable_check_numerics: when on, a gradient with NaN or Inf values is an error
// ("Gradient for <var> is not finite.") instead of a skipped step. Process-wide; off by default
// (Lingvo's default is on; Glossa's default skips such steps and stops after
// max_consecutive_skipped_steps of them).
void SetCheckNumerics(bool enabled);
bool CheckNumericsEnabled();

class Learner {
 public:
  // name ('loss'), loss_name (None: name), learning_rate, lr_schedule, optimizer,
  // clip_gradient_norm_to_value, clip_gradient_single_norm_to_value, grad_norm_to_clip_to_zero,
  // grad_norm_tracker, l2_regularizer_weight, l1_regularizer_weight, bprop_variable_filter,
  // bprop_variable_exclusion, scale_gradients.
  static glossa::Params Params();
  explicit Learner(const glossa::Params& p);
  virtual ~Learner() = default;

  // One training step. `metrics` must hold the loss (a scalar with autograd history). Returns
  // Lingvo's learner metrics: learning_rate, lr_schedule, grad_norm/all, var_norm/all,
  // grad_scale_all, has_nan_or_inf, grad_norm_is_nan_or_inf, and l2_loss / l1_loss when used.
  // When the gradient scale is 0 (NaN/Inf gradients, or a norm above grad_norm_to_clip_to_zero,
  // or a tracker rejection), the optimizer is not run: weights and slots stay as they were.
  // `var_norm` false skips var_norm/all (a full pass over the weights, a few percent of a step);
  // the trainer asks for it only on steps whose metrics it writes or prints.
  Metrics Apply(const Metrics& metrics, const std::vector<LearnerVariable>& vars,
                int64_t global_step, bool var_norm = true);

  // Data parallelism: a GradientSync reduces every selected variable's gradient right after the
  // backward pass, before the NaN checks, clipping and regularization (so those see the reduced,
  // global gradient). A variable the loss does not reach gets a zero gradient while a sync is
  // set, so that every rank passes the same tensors (PyTorch DDP's find_unused_parameters).
  // A sync that overlaps() is told the variables before the backward pass, which then runs as
  // loss.backward() into the variables' .grad, so hooks on their gradient accumulators see each
  // gradient as soon as it is final and can start reducing it while the backward still runs
  // (glossa/runtime/gradient_sync.h's DataParallelGradientSync). Null: no reduction.
  class GradientSync {
   public:
    virtual ~GradientSync() = default;
    virtual bool overlaps() const { return false; }
    // With overlaps(): the variables whose gradients the coming backward pass computes, in the
    // order Reduce will get them.
    virtual void BeforeBackward(const std::vector<at::Tensor>& vars) { (void)vars; }
    // Every variable's gradient, reduced: in place, or replaced by a tensor of the same shape
    // (valid until the next step's backward pass).
    virtual void Reduce(std::vector<at::Tensor>& grads) = 0;
    // The coming step's variables (in BeforeBackward's and Reduce's order), which tell which
    // hold a rank-local share (LearnerVariable::rank_local); called before BeforeBackward and
    // Reduce.
    virtual void SetVariables(const std::vector<LearnerVariable>& vars) { (void)vars; }
    // What variable k's Σ g² counts for in the global norm: 1 / the number of ranks holding the
    // same values (1 without ranks). Rank-local ones only.
    virtual double NormWeight(size_t k) const {
      (void)k;
      return 1.0;
    }
    // The global Σ g² from this rank's sums over replicated and over rank-local gradients, the
    // latter weighted by NormWeight (the replicated ones are already reduced, so every rank has
    // the same sum; rank-local ones differ).
    virtual double GlobalSquaredNorm(double replicated, double sharded) {
      return replicated + sharded;
    }
  };
  void SetGradientSync(std::shared_ptr<GradientSync> sync) { sync_ = std::move(sync); }
  // A sync from a function that reduces the gradients after the backward pass.
  using GradientReducer = std::function<void(const std::vector<at::Tensor>& grads)>;
  void SetGradientReducer(GradientReducer reducer);

  // The variables Apply would update (trainable, filter, exclusion).
  std::vector<LearnerVariable> SelectVariables(const std::vector<LearnerVariable>& vars) const;
  double LearningRate(int64_t global_step) const;
  const glossa::Params& params() const { return params_; }
  const std::string& loss_name() const { return loss_name_; }
  Optimizer& optimizer() { return *optimizer_; }
  const BaseSchedule& lr_schedule() const { return *schedule_; }
  // Optimizer slots and tracker state, by name, for checkpoints.
  std::map<std::string, at::Tensor> Slots() const;
  void SetSlot(const std::string& name, const at::Tensor& value);
  // Steps skipped because their gradient scale was 0 (a non-finite loss or gradient, or a
  // gradient norm over grad_norm_to_clip_to_zero), and whether the last Apply skipped.
  int64_t num_skipped_steps() const { return num_skipped_steps_; }
  bool last_step_skipped() const { return last_step_skipped_; }

 private:
  glossa::Params params_;
  std::string loss_name_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<BaseSchedule> schedule_;
  std::unique_ptr<GradNormTracker> tracker_;
  int64_t num_skipped_steps_ = 0;
  bool last_step_skipped_ = false;
  std::shared_ptr<GradientSync> sync_;
};

}  // namespace glossa
