#include "glossa/optim/learner.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <atomic>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <regex>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/squared_norm.h"

namespace glossa {
namespace {

std::optional<std::regex> CompileRegex(const Params& p, const char* key) {
  if (!p.IsSet(key)) return std::nullopt;
  try {
    return std::regex(p.GetString(key));
  } catch (const std::regex_error& e) {
    throw InvalidArgumentError(
        StrCat("learner ", key, ": invalid regex '", p.GetString(key), "': ", e.what()));
  }
}

at::Tensor Scalar(double v) { return at::full({}, v, at::TensorOptions().dtype(at::kDouble)); }

Metric M(double v) { return Metric{Scalar(v), Scalar(1.0)}; }

}  // namespace

std::vector<LearnerVariable> LearnerVariables(const BaseLayer& model) {
  std::vector<LearnerVariable> out;
  for (const auto& [info, value] : model.AllVariables()) {
    const auto& c = info.params.collections;
    out.push_back({info.full_name, value, info.trainable,
                   std::find(c.begin(), c.end(), kSkipLpRegularizationCollection) != c.end(),
                   std::find(c.begin(), c.end(), kExpertShardedCollection) != c.end(),
                   std::find(c.begin(), c.end(), kPipelineStageCollection) != c.end(),
                   std::find(c.begin(), c.end(), kModelShardedCollection) != c.end(), c,
                   info.fprop_copy});
  }
  return out;
}

// ---- GradNormTracker ----

glossa::Params GradNormTracker::Params() {
  glossa::Params p;
  p.Define("cls", ClsOf<GradNormTracker>(), "Cls that this param object is associated with.");
  p.Define("decay", 0.995, "Decay in updating the moving avgs in grad norm stats.");
  p.Define("grad_norm_lower_cap", 1e-2, "The minimal gradient norm value.");
  p.Define("clip_threshold", 4.0,
           "Reject a step when the log norm is this many stds above the mean.");
  p.Define("grad_norm_clip_cap_min", 0.0,
           "Never reject a step whose gradient norm is below this value.");
  p.Define("dry_run", false, "If True, only track the statistics, never reject.");
  return p;
}

GradNormTracker::GradNormTracker(const glossa::Params& p) : params_(p.Copy()) {
  for (const char* k : {"log_mean", "log_mean_squared", "total_weight", "total_rejections"}) {
    state_[k] = 0.0;
  }
}

double GradNormTracker::Update(double grad_norm, bool has_nan) {
  const double decay = params_.GetFloat("decay");
  const double gn = std::max(grad_norm, params_.GetFloat("grad_norm_lower_cap"));
  const double tw = std::max(state_["total_weight"], 1e-6);
  const double mean = state_["log_mean"] / tw;
  const double var = state_["log_mean_squared"] / tw - mean * mean;
  const double std_dev = std::sqrt(std::max(var, 1e-6));
  const double lg = std::log(gn + 1);
  const double cap = std::max(mean + std_dev * params_.GetFloat("clip_threshold"),
                              std::log(params_.GetFloat("grad_norm_clip_cap_min") + 1));
  const bool trigger = (lg > cap && state_["total_weight"] > 0.75) || has_nan;
  const double lgc = std::min(lg, cap);
  if (!has_nan) {
    state_["log_mean"] += (1 - decay) * (lgc - state_["log_mean"]);
    state_["log_mean_squared"] += (1 - decay) * (lgc * lgc - state_["log_mean_squared"]);
    state_["total_weight"] += (1 - decay) * (1 - state_["total_weight"]);
  }
  state_["total_rejections"] += trigger ? 1 : 0;
  return params_.GetBool("dry_run") ? 1.0 : (trigger ? 0.0 : 1.0);
}

// ---- Learner ----

glossa::Params Learner::Params() {
  glossa::Params p;
  p.Define("cls", ClsOf<Learner>(), "Cls that this param object is associated with.");
  p.Define("name", "loss", "Name of this learner; also the default loss_name.");
  p.Define("loss_name", nullptr, "Name of the loss metric to optimize; None means `name`.");
  p.Define("learning_rate", 0.0, "Learning rate; multiplied by lr_schedule's value.");
  p.Define("lr_schedule", ContinuousSchedule::Params(), "Learning rate decay schedule.");
  p.Define("optimizer", Adam::Params(), "Params for the optimizer.");
  p.Define("clip_gradient_norm_to_value", 0.0,
           "Clip the gradients' global norm to this value (0: no clipping).");
  p.Define("clip_gradient_single_norm_to_value", 0.0,
           "Clip each gradient's norm to this value (0: no clipping); not with the global clip.");
  p.Define("grad_norm_to_clip_to_zero", 0.0,
           "If > 0, a step whose gradient norm is at least this is skipped (scale 0).");
  p.Define("grad_norm_tracker", nullptr, "Params for a GradNormTracker, or None.");
  p.Define("l2_regularizer_weight", nullptr, "L2 regularization weight, or None.");
  p.Define("l1_regularizer_weight", nullptr, "L1 regularization weight, or None.");
  p.Define("bprop_variable_filter", nullptr,
           "If set, only variables whose full name matches this regex (search) are trained.");
  p.Define("bprop_variable_exclusion", nullptr,
           "If set, variables whose full name matches this regex (search) are not trained.");
  p.Define("scale_gradients", true,
           "Whether to apply norm clipping, NaN/Inf zeroing and the norm metrics.");
  return p;
}

Learner::Learner(const glossa::Params& p) : params_(p.Copy()) {
  params_.Freeze();
  loss_name_ =
      params_.IsSet("loss_name") ? params_.GetString("loss_name") : params_.GetString("name");
  if (params_.GetFloat("clip_gradient_norm_to_value") > 0 &&
      params_.GetFloat("clip_gradient_single_norm_to_value") > 0) {
    throw InvalidArgumentError(
        "learner: clip_gradient_norm_to_value and clip_gradient_single_norm_to_value are "
        "mutually exclusive");
  }
  CompileRegex(params_, "bprop_variable_filter");
  CompileRegex(params_, "bprop_variable_exclusion");
  optimizer_ = params_.GetParams("optimizer").Instantiate<Optimizer>();
  schedule_ = params_.GetParams("lr_schedule").Instantiate<BaseSchedule>();
  if (params_.IsSet("grad_norm_tracker")) {
    tracker_ = std::make_unique<GradNormTracker>(params_.GetParams("grad_norm_tracker"));
  }
}

double Learner::LearningRate(int64_t global_step) const {
  return params_.GetFloat("learning_rate") * schedule_->Value(global_step);
}

std::vector<LearnerVariable> Learner::SelectVariables(
    const std::vector<LearnerVariable>& vars) const {
  auto filter = CompileRegex(params_, "bprop_variable_filter");
  auto exclusion = CompileRegex(params_, "bprop_variable_exclusion");
  std::vector<LearnerVariable> out;
  for (const auto& v : vars) {
    if (!v.trainable || !v.value.requires_grad()) continue;
    if (filter && !std::regex_search(v.name, *filter)) continue;
    if (exclusion && std::regex_search(v.name, *exclusion)) continue;
    out.push_back(v);
  }
  return out;
}

namespace {
// Σ x² without temporaries (glossa/kernels/squared_norm.h).
double SumOfSquares(const at::Tensor& t) { return SumsOfSquares({t.detach()})[0]; }
}  // namespace

namespace {
std::atomic<bool> g_check_numerics{false};
}  // namespace

void SetCheckNumerics(bool enabled) { g_check_numerics.store(enabled); }
bool CheckNumericsEnabled() { return g_check_numerics.load(); }

void Learner::SetGradientReducer(GradientReducer reducer) {
  class FunctionSync : public GradientSync {
   public:
    explicit FunctionSync(GradientReducer f) : f_(std::move(f)) {}
    void Reduce(std::vector<at::Tensor>& grads) override { f_(grads); }

   private:
    GradientReducer f_;
  };
  sync_ = reducer ? std::make_shared<FunctionSync>(std::move(reducer)) : nullptr;
}

namespace {

// The loss metric `loss_name` of metrics; throws when it is missing or not a scalar.
const at::Tensor& FindLoss(const Metrics& metrics, const Params& p, const std::string& loss_name) {
  auto it = metrics.find(loss_name);
  if (it == metrics.end()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : metrics) keys.push_back(k);
    throw NotFoundError(StrCat("learner '", p.GetString("name"), "': loss ",
                               KeyErrorString(loss_name, keys), " not in metrics"));
  }
  const at::Tensor& loss = it->second.value;
  if (loss.dim() != 0) {
    throw InvalidArgumentError(
        StrCat("learner: loss '", loss_name, "' must be a scalar, got shape ", loss.sizes()));
  }
  return loss;
}

// The gradients of loss with respect to the selected variables (backward into .grad when the
// sync overlaps), reduced by the sync when there is one.
std::vector<VarGrad> ComputeGradients(const at::Tensor& loss,
                                      const std::vector<LearnerVariable>& selected,
                                      const std::shared_ptr<Learner::GradientSync>& sync) {
  std::vector<VarGrad> var_grads;
  std::vector<at::Tensor> inputs;
  for (const auto& v : selected) inputs.push_back(v.value);
  std::vector<at::Tensor> grads;
  if (sync) sync->SetVariables(selected);
  bool overlap = sync && sync->overlaps();
  for (const auto& v : inputs) overlap = overlap && v.is_leaf();
  if (overlap) {
    // Into .grad, so that the sync's accumulator hooks see each gradient as it is final.
    for (auto& v : inputs) v.mutable_grad() = at::Tensor();
    sync->BeforeBackward(inputs);
    torch::autograd::backward({loss}, {}, c10::nullopt, false, inputs);
    for (auto& v : inputs) {
      grads.push_back(v.grad());
      v.mutable_grad() = at::Tensor();
    }
  } else {
    grads = torch::autograd::grad({loss}, inputs, {}, c10::nullopt, false,
                                  /*allow_unused=*/true);
  }
  for (size_t i = 0; i < selected.size(); ++i) {
    if (!grads[i].defined()) {
      if (!sync) continue;  // not connected to the loss: dropped, as in Lingvo
      grads[i] = at::zeros_like(selected[i].value);
    }
    var_grads.push_back({selected[i].name, selected[i].value, grads[i].detach(),
                         selected[i].rank_local(), sync ? sync->NormWeight(i) : 1.0,
                         selected[i].fprop_copy});
  }
  if (sync) {
    std::vector<at::Tensor> to_reduce;
    for (const auto& vg : var_grads) to_reduce.push_back(vg.grad);
    sync->Reduce(to_reduce);
    for (size_t i = 0; i < var_grads.size(); ++i) var_grads[i].grad = to_reduce[i];
  }
  return var_grads;
}

// L2 / L1 regularization: adjusts the gradients (the loss itself is unchanged, as in Lingvo)
// and reports l2_loss / l1_loss.
void Regularize(const Params& p, const std::vector<LearnerVariable>& selected,
                std::vector<VarGrad>& var_grads, Metrics& out) {
  auto skip_lp = [&](const std::string& name) {
    for (const auto& v : selected) {
      if (v.name == name) return v.skip_lp_regularization;
    }
    return false;
  };
  at::NoGradGuard no_grad;
  if (p.IsSet("l2_regularizer_weight")) {
    const double w = p.GetFloat("l2_regularizer_weight");
    double l2 = 0;
    for (auto& vg : var_grads) {
      if (skip_lp(vg.name)) continue;
      l2 += SumOfSquares(vg.var);
      vg.grad = vg.grad + vg.var.detach() * w;
    }
    out["l2_loss"] = M(0.5 * w * l2);
  }
  if (p.IsSet("l1_regularizer_weight")) {
    const double w = p.GetFloat("l1_regularizer_weight");
    double l1 = 0;
    for (auto& vg : var_grads) {
      if (skip_lp(vg.name)) continue;
      l1 += vg.var.to(at::kDouble).abs().sum().item<double>();
      vg.grad = vg.grad + at::sign(vg.var.detach()) * w;
    }
    out["l1_loss"] = M(w * l1);
  }
}

// scale_gradients: the norm metrics, NaN/Inf detection and norm clipping (per tensor, or global
// with grad_norm_to_clip_to_zero and the tracker). Returns the gradient scale (0: skip the step).
double ScaleGradients(const Params& p, GradNormTracker* tracker, bool var_norm,
                      std::vector<VarGrad>& var_grads, Learner::GradientSync* sync, Metrics& out) {
  double grad_scale = 1.0;
  at::NoGradGuard no_grad;
  double grad_sq = 0, sharded_sq = 0, var_sq = 0, sharded_var_sq = 0;
  bool has_nan = false;
  // Every norm in one pass over the tensors (each Σ x² by itself: the sums are added in order).
  std::vector<at::Tensor> tensors;
  for (const auto& vg : var_grads) {
    tensors.push_back(vg.grad.detach());
    if (var_norm) tensors.push_back(vg.var.detach());
  }
  const std::vector<double> sq = SumsOfSquares(tensors);
  size_t next = 0;
  for (const auto& vg : var_grads) {
    const double g = sq[next++], v = var_norm ? sq[next++] : 0.0;
    if (vg.sharded) {
      sharded_sq += g * vg.norm_weight;
      sharded_var_sq += v * vg.norm_weight;
    } else {
      grad_sq += g;
      var_sq += v;
    }
  }
  // With variables sharded over ranks, every rank decides on the norm of the whole model's
  // gradient.
  grad_sq = sync ? sync->GlobalSquaredNorm(grad_sq, sharded_sq) : grad_sq + sharded_sq;
  if (var_norm) var_sq = sync ? sync->GlobalSquaredNorm(var_sq, sharded_var_sq) : var_sq + sharded_var_sq;
  // Squares are non-negative, so Σ g² is NaN or Inf exactly when some gradient element is (or
  // when the sum overflows): one check instead of one isfinite pass per variable.
  has_nan = !std::isfinite(grad_sq);
  const double grad_norm = std::sqrt(grad_sq), var_norm_value = std::sqrt(var_sq);
  const bool norm_nan = !std::isfinite(grad_norm);
  has_nan = has_nan || norm_nan;
  out["grad_norm_is_nan_or_inf"] = M(norm_nan ? 1.0 : 0.0);
  out["has_nan_or_inf"] = M(has_nan ? 1.0 : 0.0);
  const double single = p.GetFloat("clip_gradient_single_norm_to_value");
  if (single > 0) {
    for (auto& vg : var_grads) {
      const double n = std::sqrt(SumOfSquares(vg.grad));
      vg.grad = vg.grad * (single / std::max(n, single));
    }
    if (has_nan) grad_scale = 0.0;
  } else {
    const double clip = p.GetFloat("clip_gradient_norm_to_value");
    if (clip > 0) grad_scale = std::min(1.0, clip / grad_norm);
    const double to_zero = p.GetFloat("grad_norm_to_clip_to_zero");
    if (to_zero > 0 && !(grad_norm < to_zero)) grad_scale = 0.0;
    if (tracker) grad_scale *= tracker->Update(grad_norm, has_nan);
    if (has_nan) grad_scale = 0.0;
    out["grad_norm/all"] = M(grad_norm);
    if (var_norm) out["var_norm/all"] = M(var_norm_value);
    out["grad_scale_all"] = M(grad_scale);
    if (grad_scale != 1.0 && grad_scale != 0.0) {
      for (auto& vg : var_grads) vg.grad = vg.grad * grad_scale;
    }
  }
  return grad_scale;
}

}  // namespace

Metrics Learner::Apply(const Metrics& metrics, const std::vector<LearnerVariable>& vars,
                       int64_t global_step, bool var_norm) {
  const at::Tensor& loss = FindLoss(metrics, params_, loss_name_);
  Metrics out;
  const double schedule_value = schedule_->Value(global_step);
  const double lr = params_.GetFloat("learning_rate") * schedule_value;
  out["lr_schedule"] = M(schedule_value);
  std::vector<LearnerVariable> selected = SelectVariables(vars);
  std::vector<VarGrad> var_grads;
  if (!selected.empty() && loss.requires_grad()) {
    RECORD_USER_SCOPE("learner/gradients");  // a profiler's (bench_train_throughput --profile_ops)
    var_grads = ComputeGradients(loss, selected, sync_);
  }
  if (CheckNumericsEnabled()) {
    for (const auto& vg : var_grads) {
      if (!at::isfinite(vg.grad).all().item<bool>()) {
        throw InvalidArgumentError(StrCat("Gradient for ", vg.name, " is not finite."));
      }
    }
  }
  Regularize(params_, selected, var_grads, out);
  double grad_scale = 1.0;
  if (params_.GetBool("scale_gradients")) {
    RECORD_USER_SCOPE("learner/scale_gradients");
    grad_scale = ScaleGradients(params_, tracker_.get(), var_norm, var_grads, sync_.get(), out);
  }
  out["learning_rate"] = M(lr);
  // A non-finite loss is a diverged step whatever its gradients say (and without
  // scale_gradients nothing else would catch it).
  const bool loss_nan = !std::isfinite(loss.detach().to(at::kDouble).item<double>());
  if (loss_nan) grad_scale = 0.0;
  last_step_skipped_ = grad_scale == 0.0;
  if (grad_scale == 0.0) {
    ++num_skipped_steps_;
  } else if (!var_grads.empty()) {
    RECORD_USER_SCOPE("learner/optimizer");
    optimizer_->Apply(lr, var_grads, global_step);
  }
  return out;
}

std::map<std::string, at::Tensor> Learner::Slots() const {
  std::map<std::string, at::Tensor> out = optimizer_->slots();
  if (tracker_) {
    for (const auto& [k, v] : tracker_->state()) {
      out[params_.GetString("name") + "/grad_norm_tracker/" + k] = Scalar(v);
    }
  }
  return out;
}

void Learner::SetSlot(const std::string& name, const at::Tensor& value) {
  const std::string prefix = params_.GetString("name") + "/grad_norm_tracker/";
  if (tracker_ && name.rfind(prefix, 0) == 0) {
    const std::string key = name.substr(prefix.size());
    if (!tracker_->state().count(key)) {
      throw NotFoundError(StrCat("learner: unknown grad_norm_tracker state '", name, "'"));
    }
    tracker_->state()[key] = value.item<double>();
    return;
  }
  optimizer_->SetSlot(name, value);
}

GLOSSA_REGISTER_CLASS(Learner, "glossa.optim.Learner");
GLOSSA_REGISTER_CLASS(GradNormTracker, "glossa.optim.GradNormTracker");

}  // namespace glossa
