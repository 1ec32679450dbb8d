// Optimizers with TensorFlow's update rules, as Lingvo's optimizer.py uses them. An optimizer
// updates variables in place from (variable, gradient) pairs and keeps its state in named slots,
// "<variable full name>/<optimizer name>/<slot>" (e.g. "lm/emb/emb_var/Adam/m") and
// "<optimizer name>/<state>" for optimizer-wide state (e.g. "Adam/beta1_power"), which
// checkpoints save and restore.
//
//   auto opt = Adam::ParamsA().Instantiate<Optimizer>();
//   opt->Apply(/*lr=*/1e-3, {{"w", w, grad_w}}, global_step);
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "glossa/core/params.h"

namespace glossa {

class FpropCopy;  // glossa/kernels/cast_together.h

struct VarGrad {
  std::string name;  // the variable's full name (slot names derive from it)
  at::Tensor var;
  at::Tensor grad;
  bool sharded = false;  // not held by every rank alike (LearnerVariable::rank_local)
  // What its Σ g² counts for in the global norm (GradientSync::NormWeight).
  double norm_weight = 1.0;
  // The variable's copy in its layer's fprop dtype (LearnerVariable::fprop_copy): an optimizer that
  // makes it as it updates the variable sets it (Adam); null: none kept.
  std::shared_ptr<FpropCopy> fprop_copy;
};

class Optimizer {
 public:
  // cls, name (the slot-name component; defaults to the optimizer's class name).
  static glossa::Params Params();
  explicit Optimizer(const glossa::Params& p);
  virtual ~Optimizer();
  const glossa::Params& params() const { return params_; }
  const std::string& name() const { return name_; }

  // One update with learning rate `lr` (already scheduled) at `global_step`; variables change in
  // place (without recording autograd history).
  virtual void Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t global_step) = 0;

  // Every slot by full name (wrapping optimizers include their inner optimizer's).
  virtual std::map<std::string, at::Tensor> slots() const { return slots_; }
  // Sets a slot's value (checkpoint restore); later updates continue from it. Once a slot is
  // set, an update that finds a variable with some of its slots restored but not another (a
  // checkpoint missing one) is InvalidArgument naming the missing slot, never a silent zero.
  virtual void SetSlot(const std::string& name, const at::Tensor& value);

 protected:
  // The slot `<var>/<name>/<slot>`, created like `like` filled with `init` on first use.
  at::Tensor& Slot(const std::string& var, const std::string& slot, const at::Tensor& like,
                   double init);
  // The optimizer-wide scalar slot `<name>/<state>` (float64), created as `init`.
  at::Tensor& GlobalSlot(const std::string& state, double init);
  std::map<std::string, at::Tensor> slots_;

 private:
  glossa::Params params_;
  std::string name_;
  // "<var>/<name>/" of every variable with a slot set by SetSlot (restored from a checkpoint).
  std::set<std::string> restored_families_;
};

// w -= lr·g.
class SGD : public Optimizer {
 public:
  static glossa::Params Params();
  explicit SGD(const glossa::Params& p) : Optimizer(p) {}
  void Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t global_step) override;
};

// accum = alpha·accum + g; w -= lr·accum (Nesterov: w -= lr·(g + alpha·accum)).
class Momentum : public Optimizer {
 public:
  // + alpha (0.9), use_nesterov (False).
  static glossa::Params Params();
  explicit Momentum(const glossa::Params& p) : Optimizer(p) {}
  void Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t global_step) override;
};

// TensorFlow's Adam: m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
// w -= lr·sqrt(1-β2^t)/(1-β1^t) · m / (sqrt(v) + ε), t counting this optimizer's updates.
class Adam : public Optimizer {
 public:
  // + beta1 (0.9), beta2 (0.999), epsilon (1e-6).
  static glossa::Params Params();
  // Lingvo's presets: (0.9, 0.997, 1e-9) and (0.9, 0.98, 1e-9).
  static glossa::Params ParamsA();
  static glossa::Params ParamsB();
  explicit Adam(const glossa::Params& p) : Optimizer(p) {}
  void Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t global_step) override;
};

// accum += g²; w -= lr·g / sqrt(accum).
class Adagrad : public Optimizer {
 public:
  // + initial_accumulator_value (1.0).
  static glossa::Params Params();
  explicit Adagrad(const glossa::Params& p) : Optimizer(p) {}
  void Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t global_step) override;
};

// TensorFlow's RMSProp: ms (starts at 1) = decay·ms + (1-decay)·g²;
// mom = momentum·mom + lr·g / sqrt(ms + ε); w -= mom.
class RMSProp : public Optimizer {
 public:
  // + decay (0.9), momentum (0.9), epsilon (1.0): Lingvo's defaults.
  static glossa::Params Params();
  explicit RMSProp(const glossa::Params& p) : Optimizer(p) {}
  void Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t global_step) override;
};

// accum = ρ·accum + (1-ρ)·g²; u = sqrt(accum_update + ε)/sqrt(accum + ε)·g;
// accum_update = ρ·accum_update + (1-ρ)·u²; w -= lr·u.
class AdaDelta : public Optimizer {
 public:
  // + decay (ρ, 0.95), epsilon (1e-8).
  static glossa::Params Params();
  explicit AdaDelta(const glossa::Params& p) : Optimizer(p) {}
  void Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t global_step) override;
};

// Sums gradients in "<var>/<name>/grad_accumulator" and, on the steps where
// global_step % accum_steps == accum_steps - 1, applies the wrapped optimizer to their mean and
// resets the sums (Lingvo's Accumulator).
class GradientAccumulator : public Optimizer {
 public:
  // + optimizer_tpl (Adam), accum_steps (5).
  static glossa::Params Params();
  explicit GradientAccumulator(const glossa::Params& p);
  void Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t global_step) override;
  std::map<std::string, at::Tensor> slots() const override;
  void SetSlot(const std::string& name, const at::Tensor& value) override;
  Optimizer& inner() { return *inner_; }

 private:
  std::unique_ptr<Optimizer> inner_;
  int64_t accum_steps_;
};

}  // namespace glossa

namespace glossa {

// Adafactor (Shazeer & Stern 2018) as Lingvo's XLAShardingAdafactor: factored second moments
// (row and column means over the two largest dims when the second largest is at least
// min_dim_size_to_factor), decay 1 - (step - offset + 1)^-decay_exponent_pow or the Adam-like
// β2·(1 - β2^(t-1))/(1 - β2^t), update clipping by RMS when clipping_threshold is set, step size
// scaled by max(RMS(w), 1e-3) when multiply_by_parameter_scale, optional momentum (beta1 > 0), and
// optionally the paper's relative step size min(1e-2, 1/sqrt(t)) multiplied into the learning rate.
class Adafactor : public Optimizer {
 public:
  // + beta1 (0), beta2 (0.999), multiply_by_parameter_scale (True), clipping_threshold (None),
  // factored (True), decay_exponent_pow (None), decay_exponent_offset (0),
  // min_dim_size_to_factor (128), relative_step (False), epsilon1 (1e-30), epsilon2 (1e-3).
  static glossa::Params Params();
  explicit Adafactor(const glossa::Params& p) : Optimizer(p) {}
  void Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t global_step) override;
};

}  // namespace glossa
