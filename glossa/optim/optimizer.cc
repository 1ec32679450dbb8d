#include "glossa/optim/optimizer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/adam.h"
#include "glossa/kernels/cast_together.h"

namespace glossa {
namespace {

glossa::Params WithCls(glossa::Params p, const ClassRef& cls, const std::string& name) {
  p.Set("cls", cls);
  p.Set("name", name);
  return p;
}

void CheckVarGrad(const VarGrad& vg) {
  if (!vg.var.defined() || !vg.grad.defined() || vg.var.sizes() != vg.grad.sizes()) {
    throw InvalidArgumentError(StrCat("optimizer: variable '", vg.name,
                                      "' and its gradient must be defined with equal shapes"));
  }
}

}  // namespace

glossa::Params Optimizer::Params() {
  glossa::Params p;
  p.Define("cls", nullptr, "Cls that this param object is associated with.");
  p.Define("name", "", "Name used in slot names; defaults to the optimizer's class name.");
  return p;
}

Optimizer::Optimizer(const glossa::Params& p) : params_(p.Copy()) {
  name_ = params_.GetString("name");
  if (name_.empty()) {
    throw InvalidArgumentError("optimizer params must set `name` (used in slot names)");
  }
  params_.Freeze();
}

Optimizer::~Optimizer() = default;

void Optimizer::SetSlot(const std::string& name, const at::Tensor& value) {
  auto it = slots_.find(name);
  if (it != slots_.end() && it->second.sizes() != value.sizes()) {
    throw InvalidArgumentError(StrCat("optimizer slot '", name, "' has shape ", it->second.sizes(),
                                      ", cannot set a value of shape ", value.sizes()));
  }
  slots_[name] = value.detach().clone();
  if (const size_t cut = name.rfind('/'); cut != std::string::npos) {
    restored_families_.insert(name.substr(0, cut + 1));
  }
}

at::Tensor& Optimizer::Slot(const std::string& var, const std::string& slot, const at::Tensor& like,
                            double init) {
  const std::string key = var + "/" + name_ + "/" + slot;
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    // A checkpoint that holds this optimizer's state holds every slot of every variable it
    // updated; a variable it trains now must have them all (a zero would silently restart its
    // moments). Variables no learner trains (a variable filter) never get here.
    const std::string family = var + "/" + name_ + "/";
    if (restored_families_.count(family)) {
      auto sibling = slots_.lower_bound(family);
      if (sibling != slots_.end() && sibling->first.rfind(family, 0) == 0) {
        throw InvalidArgumentError(StrCat(
            "the restored checkpoint lacks optimizer slot '", key, "' (it holds '",
            sibling->first, "' of the same variable): a damaged or edited checkpoint; restore "
            "an earlier one"));
      }
    } else {
      // A restored variable's slots ("<var>/<name>/"), not the optimizer's own state ("<name>/").
      const std::string suffix = "/" + name_ + "/";
      const auto other = std::find_if(
          restored_families_.begin(), restored_families_.end(), [&](const std::string& f) {
            return f.size() > suffix.size() &&
                   f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0;
          });
      if (other != restored_families_.end()) {
        throw InvalidArgumentError(StrCat(
            "the restored checkpoint lacks optimizer slot '", key, "': it holds this "
            "optimizer's slots (e.g. of '", other->substr(0, other->size() - suffix.size()),
            "') but none of variable '", var, "', which is trained now: a damaged or edited "
            "checkpoint, or a variable the run did not train before (its learner's variable "
            "filter changed); restore an earlier checkpoint, or train from a new logdir"));
      }
    }
    it = slots_.emplace(key, at::full_like(like.detach(), init)).first;
  } else if (it->second.sizes() != like.sizes()) {
    throw InvalidArgumentError(StrCat("optimizer slot '", key, "' has shape ", it->second.sizes(),
                                      " but the variable has shape ", like.sizes()));
  } else if (it->second.device() != like.device()) {
    it->second = it->second.to(like.device());
  }
  return it->second;
}

at::Tensor& Optimizer::GlobalSlot(const std::string& state, double init) {
  const std::string key = name_ + "/" + state;
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    const std::string suffix = "/" + name_ + "/";
    if (std::any_of(restored_families_.begin(), restored_families_.end(), [&](const auto& f) {
          return f.size() > suffix.size() &&
                 f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0;
        })) {
      throw InvalidArgumentError(StrCat("the restored checkpoint lacks optimizer state '", key,
                                        "' although it holds the optimizer's slots: a damaged "
                                        "or edited checkpoint; restore an earlier one"));
    }
    it = slots_.emplace(key, at::full({}, init, at::TensorOptions().dtype(at::kDouble))).first;
  }
  return it->second;
}

// ---- SGD ----

glossa::Params SGD::Params() { return WithCls(Optimizer::Params(), ClsOf<SGD>(), "SGD"); }

void SGD::Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t) {
  at::NoGradGuard no_grad;
  for (const auto& vg : var_grads) {
    CheckVarGrad(vg);
    vg.var.sub_(vg.grad.to(vg.var.scalar_type()) * lr);
  }
}

// ---- Momentum ----

glossa::Params Momentum::Params() {
  glossa::Params p = WithCls(Optimizer::Params(), ClsOf<Momentum>(), "Momentum");
  p.Define("alpha", 0.9,
           "The damping factor in the momentum optimizer: how the velocity (averaged past "
           "gradients) decays over time.");
  p.Define("use_nesterov", false, "True iff use Nesterov.");
  return p;
}

void Momentum::Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t) {
  at::NoGradGuard no_grad;
  const double alpha = params().GetFloat("alpha");
  const bool nesterov = params().GetBool("use_nesterov");
  for (const auto& vg : var_grads) {
    CheckVarGrad(vg);
    at::Tensor g = vg.grad.to(vg.var.scalar_type());
    at::Tensor& accum = Slot(vg.name, "momentum", vg.var, 0.0);
    accum.mul_(alpha).add_(g);
    if (nesterov) {
      vg.var.sub_(g * lr + accum * (alpha * lr));
    } else {
      vg.var.sub_(accum * lr);
    }
  }
}

// ---- Adam ----

glossa::Params Adam::Params() {
  glossa::Params p = WithCls(Optimizer::Params(), ClsOf<Adam>(), "Adam");
  p.Define("beta1", 0.9, "Beta1 for Adam.");
  p.Define("beta2", 0.999, "Beta2 for Adam.");
  p.Define("epsilon", 1e-6, "Epsilon for Adam.");
  return p;
}

glossa::Params Adam::ParamsA() {
  return Params().Set("beta1", 0.9).Set("beta2", 0.997).Set("epsilon", 1e-9);
}

glossa::Params Adam::ParamsB() {
  return Params().Set("beta1", 0.9).Set("beta2", 0.98).Set("epsilon", 1e-9);
}

void Adam::Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t) {
  at::NoGradGuard no_grad;
  const double b1 = params().GetFloat("beta1"), b2 = params().GetFloat("beta2"),
               eps = params().GetFloat("epsilon");
  // TensorFlow keeps beta1^t and beta2^t as variables starting at beta (t = 1 on the first
  // update) and multiplies them after each update.
  at::Tensor& b1_power = GlobalSlot("beta1_power", b1);
  at::Tensor& b2_power = GlobalSlot("beta2_power", b2);
  const double lr_t = lr * std::sqrt(1 - b2_power.item<double>()) / (1 - b1_power.item<double>());
  for (const auto& vg : var_grads) {
    CheckVarGrad(vg);
    at::Tensor g = vg.grad.to(vg.var.scalar_type());
    at::Tensor& m = Slot(vg.name, "m", vg.var, 0.0);
    at::Tensor& v = Slot(vg.name, "v", vg.var, 0.0);
    if (vg.fprop_copy) {
      // bf16, made in the update's pass where it runs fused (in place of the last one when free)
      at::Tensor copy = vg.fprop_copy->TakeForRewrite();
      AdamUpdate(vg.var, m, v, g, b1, b2, eps, lr_t, &copy);
      vg.fprop_copy->Set(vg.var, std::move(copy));
    } else {
      AdamUpdate(vg.var, m, v, g, b1, b2, eps, lr_t);
    }
  }
  b1_power.mul_(b1);
  b2_power.mul_(b2);
}

// ---- Adagrad ----

glossa::Params Adagrad::Params() {
  glossa::Params p = WithCls(Optimizer::Params(), ClsOf<Adagrad>(), "Adagrad");
  p.Define("initial_accumulator_value", 1.0, "Adagrad's initial_accumulator_value.");
  return p;
}

void Adagrad::Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t) {
  at::NoGradGuard no_grad;
  const double init = params().GetFloat("initial_accumulator_value");
  for (const auto& vg : var_grads) {
    CheckVarGrad(vg);
    at::Tensor g = vg.grad.to(vg.var.scalar_type());
    at::Tensor& accum = Slot(vg.name, "accumulator", vg.var, init);
    accum.add_(g.square());
    vg.var.sub_(g * lr / accum.sqrt());
  }
}

// ---- RMSProp ----

glossa::Params RMSProp::Params() {
  glossa::Params p = WithCls(Optimizer::Params(), ClsOf<RMSProp>(), "RMSProp");
  p.Define("decay", 0.9, "Discounting factor for the history/coming gradient.");
  p.Define("momentum", 0.9, "Momentum in RMSProp.");
  p.Define("epsilon", 1.0, "Epsilon term for RMSProp. Small value to avoid zero denominator.");
  return p;
}

void RMSProp::Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t) {
  at::NoGradGuard no_grad;
  const double decay = params().GetFloat("decay"), momentum = params().GetFloat("momentum"),
               eps = params().GetFloat("epsilon");
  for (const auto& vg : var_grads) {
    CheckVarGrad(vg);
    at::Tensor g = vg.grad.to(vg.var.scalar_type());
    at::Tensor& ms = Slot(vg.name, "rms", vg.var, 1.0);  // TensorFlow starts ms at 1
    at::Tensor& mom = Slot(vg.name, "momentum", vg.var, 0.0);
    ms.mul_(decay).add_(g.square() * (1 - decay));
    mom.mul_(momentum).add_(g * lr / (ms + eps).sqrt());
    vg.var.sub_(mom);
  }
}

// ---- AdaDelta ----

glossa::Params AdaDelta::Params() {
  glossa::Params p = WithCls(Optimizer::Params(), ClsOf<AdaDelta>(), "AdaDelta");
  p.Define("decay", 0.95, "Discounting factor for the history/coming gradient.");
  p.Define("epsilon", 1e-8, "Epsilon term for AdaDelta. Small value to avoid zero denominator.");
  return p;
}

void AdaDelta::Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t) {
  at::NoGradGuard no_grad;
  const double rho = params().GetFloat("decay"), eps = params().GetFloat("epsilon");
  for (const auto& vg : var_grads) {
    CheckVarGrad(vg);
    at::Tensor g = vg.grad.to(vg.var.scalar_type());
    at::Tensor& accum = Slot(vg.name, "accum", vg.var, 0.0);
    at::Tensor& accum_update = Slot(vg.name, "accum_update", vg.var, 0.0);
    accum.mul_(rho).add_(g.square() * (1 - rho));
    at::Tensor update = (accum_update + eps).sqrt() / (accum + eps).sqrt() * g;
    accum_update.mul_(rho).add_(update.square() * (1 - rho));
    vg.var.sub_(update * lr);
  }
}

// ---- GradientAccumulator ----

glossa::Params GradientAccumulator::Params() {
  glossa::Params p =
      WithCls(Optimizer::Params(), ClsOf<GradientAccumulator>(), "GradientAccumulator");
  p.Define("optimizer_tpl", Adam::Params(), "Params for the wrapped optimizer.");
  p.Define("accum_steps", 5,
           "Number of gradient accumulation steps before invoking the wrapped optimizer.");
  return p;
}

GradientAccumulator::GradientAccumulator(const glossa::Params& p) : Optimizer(p) {
  accum_steps_ = params().GetInt("accum_steps");
  if (accum_steps_ <= 0) throw InvalidArgumentError("GradientAccumulator: accum_steps must be > 0");
  inner_ = params().GetParams("optimizer_tpl").Instantiate<Optimizer>();
}

void GradientAccumulator::Apply(double lr, const std::vector<VarGrad>& var_grads,
                                int64_t global_step) {
  std::vector<VarGrad> averaged;
  {
    at::NoGradGuard no_grad;
    for (const auto& vg : var_grads) {
      CheckVarGrad(vg);
      Slot(vg.name, "grad_accumulator", vg.var, 0.0).add_(vg.grad.to(vg.var.scalar_type()));
    }
  }
  if (global_step % accum_steps_ != accum_steps_ - 1) return;
  for (const auto& vg : var_grads) {
    at::Tensor& acc = Slot(vg.name, "grad_accumulator", vg.var, 0.0);
    VarGrad a = vg;
    a.grad = acc / static_cast<double>(accum_steps_);
    averaged.push_back(std::move(a));
  }
  inner_->Apply(lr, averaged, global_step);
  at::NoGradGuard no_grad;
  for (const auto& vg : var_grads) Slot(vg.name, "grad_accumulator", vg.var, 0.0).zero_();
}

std::map<std::string, at::Tensor> GradientAccumulator::slots() const {
  std::map<std::string, at::Tensor> all = slots_;
  for (auto& [k, v] : inner_->slots()) all[k] = v;
  return all;
}

void GradientAccumulator::SetSlot(const std::string& name, const at::Tensor& value) {
  if (name.find("/" + this->name() + "/") != std::string::npos) {
    Optimizer::SetSlot(name, value);
  } else {
    inner_->SetSlot(name, value);
  }
}

GLOSSA_REGISTER_CLASS(SGD, "glossa.optim.SGD");
GLOSSA_REGISTER_CLASS(Momentum, "glossa.optim.Momentum");
GLOSSA_REGISTER_CLASS(Adam, "glossa.optim.Adam");
GLOSSA_REGISTER_CLASS(Adagrad, "glossa.optim.Adagrad");
GLOSSA_REGISTER_CLASS(RMSProp, "glossa.optim.RMSProp");
GLOSSA_REGISTER_CLASS(AdaDelta, "glossa.optim.AdaDelta");
GLOSSA_REGISTER_CLASS(GradientAccumulator, "glossa.optim.GradientAccumulator");

}  // namespace glossa

namespace glossa {
namespace {

// Lingvo's ReduceRms: sqrt(mean(x²)); a scalar is returned as is (signed), as Lingvo does.
at::Tensor ReduceRms(const at::Tensor& x) {
  if (x.dim() == 0) return x;
  return x.square().mean().sqrt();
}

// The two dims to factor over (largest, second largest; ties keep the lower index), or none.
std::optional<std::pair<int64_t, int64_t>> FactoredDims(const at::Tensor& v, bool factored,
                                                        int64_t min_dim) {
  if (!factored || v.dim() < 2) return std::nullopt;
  std::vector<int64_t> order(v.dim());
  for (int64_t i = 0; i < v.dim(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return v.size(a) > v.size(b); });
  if (v.size(order[1]) < min_dim) return std::nullopt;
  return std::make_pair(order[0], order[1]);
}

}  // namespace

glossa::Params Adafactor::Params() {
  glossa::Params p = Optimizer::Params();
  p.Set("cls", ClsOf<Adafactor>());
  p.Set("name", "Adafactor");
  p.Define("beta1", 0.0, "Momentum decay; 0 disables momentum (no slot).");
  p.Define("beta2", 0.999, "Second-moment decay when decay_exponent_pow is None.");
  p.Define("multiply_by_parameter_scale", true,
           "Scale the step by max(RMS(w), epsilon2) (relative updates).");
  p.Define("clipping_threshold", nullptr, "Update clipping threshold on RMS(update); None: none.");
  p.Define("factored", true, "Factor the second moments of matrices.");
  p.Define("decay_exponent_pow", nullptr,
           "If set, decay = 1 - (step - decay_exponent_offset + 1)^-decay_exponent_pow.");
  p.Define("decay_exponent_offset", 0, "Step offset of the decay exponent.");
  p.Define("min_dim_size_to_factor", 128, "Factor only when the second largest dim is this large.");
  p.Define("relative_step", false,
           "Multiply the learning rate by the paper's relative step min(1e-2, 1/sqrt(step + 1)).");
  p.Define("epsilon1", 1e-30, "Regularizer added to squared gradients.");
  p.Define("epsilon2", 1e-3, "Lower bound of the parameter scale.");
  return p;
}

void Adafactor::Apply(double lr, const std::vector<VarGrad>& var_grads, int64_t global_step) {
  at::NoGradGuard no_grad;
  const glossa::Params& p = params();
  const double beta1 = p.GetFloat("beta1"), beta2 = p.GetFloat("beta2");
  const double eps1 = p.GetFloat("epsilon1"), eps2 = p.GetFloat("epsilon2");
  const double step = static_cast<double>(global_step);
  double decay;
  if (p.IsSet("decay_exponent_pow")) {
    decay = 1.0 - std::pow(step - static_cast<double>(p.GetInt("decay_exponent_offset")) + 1.0,
                           -p.GetFloat("decay_exponent_pow"));
  } else {
    const double t = step + 1.0;
    decay = beta2 * (1.0 - std::pow(beta2, t - 1.0)) / (1.0 - std::pow(beta2, t));
  }
  const double mixing = 1.0 - decay;
  if (p.GetBool("relative_step")) lr *= std::min(1e-2, 1.0 / std::sqrt(step + 1.0));
  for (const auto& vg : var_grads) {
    CheckVarGrad(vg);
    at::Tensor g = vg.grad.to(vg.var.scalar_type());
    at::Tensor gsq = g.square() + eps1;
    at::Tensor scale = p.GetBool("multiply_by_parameter_scale")
                           ? at::clamp_min(ReduceRms(vg.var), eps2) * lr
                           : at::full({}, lr, g.options());
    at::Tensor x;
    if (auto dims =
            FactoredDims(vg.var, p.GetBool("factored"), p.GetInt("min_dim_size_to_factor"))) {
      const auto [d0, d1] = *dims;
      at::Tensor& vr = Slot(vg.name, "vr", gsq.mean(d0), 0.0);
      at::Tensor& vc = Slot(vg.name, "vc", gsq.mean(d1), 0.0);
      vr.mul_(decay).add_(gsq.mean(d0) * mixing);
      vc.mul_(decay).add_(gsq.mean(d1) * mixing);
      at::Tensor ltm = vr.mean(-1, /*keepdim=*/true);
      x = g * at::rsqrt(vr / ltm).unsqueeze(d0) * at::rsqrt(vc).unsqueeze(d1);
    } else {
      at::Tensor& v = Slot(vg.name, "v", vg.var, 0.0);
      v.mul_(decay).add_(gsq * mixing);
      x = g * at::rsqrt(v);
    }
    if (p.IsSet("clipping_threshold")) {
      x = x / at::clamp_min(ReduceRms(x) / p.GetFloat("clipping_threshold"), 1.0);
    }
    at::Tensor sub = x * scale;
    if (beta1 != 0.0) {
      at::Tensor& m = Slot(vg.name, "m", vg.var, 0.0);
      m.mul_(beta1).add_(sub * (1 - beta1));
      sub = m;
    }
    vg.var.sub_(sub);
  }
}

GLOSSA_REGISTER_CLASS(Adafactor, "glossa.optim.Adafactor");

}  // namespace glossa
