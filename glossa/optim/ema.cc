#include "glossa/optim/ema.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/params_repr.h"

namespace glossa {

glossa::Params ExponentialMovingAverage::Params() {
  glossa::Params p;
  p.Define("cls", ClsOf<ExponentialMovingAverage>(),
           "Cls that this param object is associated with.");
  p.Define("decay", 0.999, "The EMA decay; with num_updates, decay_t = min(decay, (1+t)/(10+t)).");
  p.Define("ema_schedule", nullptr,
           "A schedule whose value at the global step is the decay (instead of decay).");
  return p;
}

ExponentialMovingAverage::ExponentialMovingAverage(const glossa::Params& p) : params_(p.Copy()) {
  const double decay = params_.GetFloat("decay");
  if (!(decay >= 0.0 && decay <= 1.0)) {
    throw InvalidArgumentError(StrCat("EMA decay must be in [0, 1], got ", PyFloatRepr(decay)));
  }
  if (params_.IsSet("ema_schedule")) {
    schedule_ = params_.GetParams("ema_schedule").Instantiate<BaseSchedule>();
  }
}

void ExponentialMovingAverage::Track(const BaseLayer& model) {
  at::NoGradGuard no_grad;
  for (const auto& [info, value] : model.AllVariables()) {
    if (!value.is_floating_point()) continue;
    const auto& c = info.params.collections;
    const bool moving = std::find(c.begin(), c.end(), kMovingVarsCollection) != c.end();
    if (!info.trainable && !moving) continue;
    tracked_[info.full_name] = Tracked{value, value.detach().clone()};
  }
}

double ExponentialMovingAverage::DecayAt(int64_t global_step) const {
  if (schedule_) return schedule_->Value(global_step);
  const double t = static_cast<double>(global_step);
  return std::min(params_.GetFloat("decay"), (1.0 + t) / (10.0 + t));
}

void ExponentialMovingAverage::Apply(int64_t global_step) {
  at::NoGradGuard no_grad;
  const double d = DecayAt(global_step);
  for (auto& [name, t] : tracked_) {
    if (t.shadow.device() != t.var.device()) t.shadow = t.shadow.to(t.var.device());
    t.shadow.sub_((t.shadow - t.var.detach()) * (1.0 - d));
  }
}

std::optional<at::Tensor> ExponentialMovingAverage::Average(const std::string& name) const {
  auto it = tracked_.find(name);
  if (it == tracked_.end()) return std::nullopt;
  return it->second.shadow;
}

std::map<std::string, at::Tensor> ExponentialMovingAverage::Shadows() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : tracked_) out[name + kSuffix] = t.shadow;
  return out;
}

void ExponentialMovingAverage::SetShadow(const std::string& checkpoint_name,
                                         const at::Tensor& value) {
  const std::string suffix = kSuffix;
  if (checkpoint_name.size() <= suffix.size() ||
      checkpoint_name.compare(checkpoint_name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    throw InvalidArgumentError(
        StrCat("EMA shadow name '", checkpoint_name, "' must end in ", suffix));
  }
  const std::string var = checkpoint_name.substr(0, checkpoint_name.size() - suffix.size());
  auto it = tracked_.find(var);
  if (it == tracked_.end()) {
    throw NotFoundError(StrCat("EMA does not track variable '", var, "'"));
  }
  if (it->second.shadow.sizes() != value.sizes()) {
    throw InvalidArgumentError(StrCat("EMA shadow '", checkpoint_name, "' has shape ",
                                      it->second.shadow.sizes(), ", got ", value.sizes()));
  }
  at::NoGradGuard no_grad;
  it->second.shadow.copy_(value);
}

void CheckEmaSettingsAgree(const std::vector<std::pair<std::string, Params>>& tasks) {
  if (tasks.empty()) return;
  const auto& [first_name, first] = tasks.front();
  for (const auto& [name, p] : tasks) {
    for (const char* key : {"ema_decay", "ema_schedule"}) {
      const ParamValue a = first.Contains(key) ? first.Get(key) : ParamValue();
      const ParamValue b = p.Contains(key) ? p.Get(key) : ParamValue();
      if (!(a == b)) {
        throw InvalidArgumentError(
            StrCat("EMA settings must agree across the model's tasks: task '", first_name, "' has ",
                   key, " = ", internal::TextValue(a), ", task '", name, "' has ", key, " = ",
                   internal::TextValue(b)));
      }
    }
  }
}

GLOSSA_REGISTER_CLASS(ExponentialMovingAverage, "glossa.optim.ExponentialMovingAverage");

}  // namespace glossa
