// Exponential moving averages of a model's trainable variables and moving statistics (batch-norm
// moving means and variances), read by theta() in eval (BaseLayer::SetEma) and by the exporter.
//
//   auto ema = std::make_shared<ExponentialMovingAverage>(ExponentialMovingAverage::Params()
//                                                             .Set("decay", 0.9999));
//   ema->Track(*model);  model->SetEma(ema);
//   ... after each training step: ema->Apply(global_step);
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "glossa/core/params.h"
#include "glossa/layers/base_layer.h"
#include "glossa/optim/schedule.h"

namespace glossa {

class ExponentialMovingAverage : public EmaSource {
 public:
  // decay, ema_schedule (None: decay_t = min(decay, (1 + step)/(10 + step)); else its value).
  static glossa::Params Params();
  explicit ExponentialMovingAverage(const glossa::Params& p);

  // Starts averaging the model's trainable floating-point variables and those in the
  // "moving_vars" collection; each shadow starts at the variable's current value.
  void Track(const BaseLayer& model);
  // The decay used at `global_step`.
  double DecayAt(int64_t global_step) const;
  // shadow -= (1 - decay_t)·(shadow - var) for every tracked variable.
  void Apply(int64_t global_step);
  std::optional<at::Tensor> Average(const std::string& var_full_name) const override;

  // Shadows by checkpoint name "<var>/ExponentialMovingAverage".
  std::map<std::string, at::Tensor> Shadows() const;
  // Sets a shadow by checkpoint name (restore); NotFound for untracked variables.
  void SetShadow(const std::string& checkpoint_name, const at::Tensor& value);
  static constexpr const char* kSuffix = "/ExponentialMovingAverage";

 private:
  glossa::Params params_;
  std::unique_ptr<BaseSchedule> schedule_;
  struct Tracked {
    at::Tensor var;
    at::Tensor shadow;
  };
  std::map<std::string, Tracked> tracked_;
};

// Model and tasks must agree on EMA settings: every (task name, train Params with ema_decay and
// ema_schedule) must match the first (InvalidArgument naming the tasks and values otherwise).
void CheckEmaSettingsAgree(const std::vector<std::pair<std::string, Params>>& task_train_params);

}  // namespace glossa
