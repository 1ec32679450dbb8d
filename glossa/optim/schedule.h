// Learning-rate schedules: the multiplier of the learner's learning_rate at a global step, each
// with Lingvo's formula, defaults and edge behaviour (docs/training.md lists them all).
//
//   Params p = TransformerSchedule::Params();
//   p.Set("warmup_steps", 4000).Set("model_dim", 512);
//   double lr_multiplier = p.Instantiate<BaseSchedule>()->Value(global_step);
#pragma once

#include <memory>
#include <vector>

#include "glossa/core/params.h"

namespace glossa {

class BaseSchedule {
 public:
  static glossa::Params Params();  // cls
  explicit BaseSchedule(const glossa::Params& p) : params_(p.Copy()) { params_.Freeze(); }
  virtual ~BaseSchedule() = default;
  virtual double Value(int64_t step) const = 0;
  const glossa::Params& params() const { return params_; }

 private:
  glossa::Params params_;
};

#define GLOSSA_DECLARE_SCHEDULE(Name)          \
  class Name : public BaseSchedule {           \
   public:                                     \
    static glossa::Params Params();            \
    explicit Name(const glossa::Params& p);    \
    double Value(int64_t step) const override; \
                                               \
   private:                                    \
    struct State;                              \
    std::shared_ptr<const State> state_;       \
  };

// value.
GLOSSA_DECLARE_SCHEDULE(ConstantSchedule)
// values[#{i : step >= boundaries[i]}].
GLOSSA_DECLARE_SCHEDULE(PiecewiseConstantSchedule)
// y0 + f·(y1 - y0) on [x0, x1), f = ratio^power (origin 'start') or 1 - (1-ratio)^power
// ('limit'); y0 before, y1 from x1.
GLOSSA_DECLARE_SCHEDULE(PolynomialSchedule)
// PolynomialSchedule with power 1.
GLOSSA_DECLARE_SCHEDULE(LinearSchedule)
// exp of the linear interpolation of log values between start and limit.
GLOSSA_DECLARE_SCHEDULE(ExponentialSchedule)
// decay^floor(step / num_steps_per_decay).
GLOSSA_DECLARE_SCHEDULE(StepwiseExponentialSchedule)
// initial_value · 0.5^((step - start_step)/half_life_steps), 1 before start_step, floored at min.
GLOSSA_DECLARE_SCHEDULE(ContinuousSchedule)
// model_dim^-0.5 · min((s+1)·(warmup·replicas)^(decay_factor-1), (s+start_step+1)^decay_factor).
GLOSSA_DECLARE_SCHEDULE(TransformerSchedule)
// min(max, peak·splits, linear ramp from warmup_init, exponential decay to min).
GLOSSA_DECLARE_SCHEDULE(LinearRampupExponentialDecayScaledByNumSplitSchedule)
// The same with one split and warmup_init 0.
GLOSSA_DECLARE_SCHEDULE(LinearRampupExponentialDecay)
// final + 0.5·(initial - final)·(1 + cos(pi·r/total_steps)).
GLOSSA_DECLARE_SCHEDULE(CosineSchedule)
// min(linear ramp, cosine).
GLOSSA_DECLARE_SCHEDULE(LinearRampupCosineSchedule)
// multiplier / sqrt(max(step - offset, warmup_steps)).
GLOSSA_DECLARE_SCHEDULE(SqrtDecay)
// min over child schedules.
GLOSSA_DECLARE_SCHEDULE(CombinedMinimumSchedule)

#undef GLOSSA_DECLARE_SCHEDULE

}  // namespace glossa
