#include "glossa/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

int64_t FloorMod(int64_t a, int64_t n) { return ((a % n) + n) % n; }

std::pair<double, double> Point(const Params& p, const char* key) {
  const auto& l = p.Get(key).AsList();
  if (l.size() != 2) {
    throw InvalidArgumentError(StrCat("schedule param '", key, "' must be a pair [step, value]"));
  }
  return {l[0].AsFloat(), l[1].AsFloat()};
}

glossa::Params Base(const ClassRef& cls) {
  glossa::Params p = BaseSchedule::Params();
  p.Set("cls", cls);
  return p;
}

double Polynomial(double x, std::pair<double, double> start, std::pair<double, double> limit,
                  double power, const std::string& origin) {
  const auto [x0, y0] = start;
  const auto [x1, y1] = limit;
  if (x0 >= x1) {
    throw InvalidArgumentError(
        StrCat("PolynomialSchedule: start step (", x0, ") must be < limit step (", x1, ")"));
  }
  if (origin != "start" && origin != "limit") {
    throw InvalidArgumentError(
        StrCat("PolynomialSchedule: origin must be 'start' or 'limit', got '", origin, "'"));
  }
  if (x < x0) return y0;
  if (x >= x1) return y1;
  const double ratio = (x - x0) / (x1 - x0);
  const double f = origin == "start" ? std::pow(ratio, power) : 1 - std::pow(1 - ratio, power);
  return y0 + f * (y1 - y0);
}

double Exponential(double x, std::pair<double, double> start, std::pair<double, double> limit) {
  return std::exp(Polynomial(x, {start.first, std::log(start.second)},
                             {limit.first, std::log(limit.second)}, 1.0, "start"));
}

void CheckExponential(std::pair<double, double> start, std::pair<double, double> limit) {
  if (!(start.first < limit.first) || !(start.second > 0) || !(limit.second > 0)) {
    throw InvalidArgumentError(
        "ExponentialSchedule: needs start step < limit step and positive values");
  }
}

double Cosine(int64_t step, double initial, double final_value, int64_t total, bool cyclical,
              bool half_cycle) {
  if (total <= 0) throw InvalidArgumentError("CosineSchedule: total_steps must be > 0");
  const int64_t r = cyclical ? (half_cycle ? FloorMod(step, total) : step) : std::min(step, total);
  const double angle = std::numbers::pi * static_cast<double>(r) / static_cast<double>(total);
  return final_value + 0.5 * (initial - final_value) * (1 + std::cos(angle));
}

}  // namespace

glossa::Params BaseSchedule::Params() {
  glossa::Params p;
  p.Define("cls", nullptr, "Cls that this param object is associated with.");
  return p;
}

// ---- Constant ----
struct ConstantSchedule::State {};
glossa::Params ConstantSchedule::Params() {
  glossa::Params p = Base(ClsOf<ConstantSchedule>());
  p.Define("value", 1.0, "The constant value.");
  return p;
}
ConstantSchedule::ConstantSchedule(const glossa::Params& p) : BaseSchedule(p) {}
double ConstantSchedule::Value(int64_t) const { return params().GetFloat("value"); }

// ---- PiecewiseConstant ----
struct PiecewiseConstantSchedule::State {
  std::vector<double> boundaries, values;
};
glossa::Params PiecewiseConstantSchedule::Params() {
  glossa::Params p = Base(ClsOf<PiecewiseConstantSchedule>());
  p.Define("boundaries", nullptr, "Boundaries at which the learning rate changes (sorted).");
  p.Define("values", nullptr, "The values in each interval; one more than boundaries.");
  return p;
}
PiecewiseConstantSchedule::PiecewiseConstantSchedule(const glossa::Params& p) : BaseSchedule(p) {
  auto s = std::make_shared<State>();
  if (!params().IsSet("boundaries") || !params().IsSet("values")) {
    throw InvalidArgumentError("PiecewiseConstantSchedule: boundaries and values are required");
  }
  for (const auto& v : params().Get("boundaries").AsList()) s->boundaries.push_back(v.AsFloat());
  for (const auto& v : params().Get("values").AsList()) s->values.push_back(v.AsFloat());
  if (s->values.size() != s->boundaries.size() + 1) {
    throw InvalidArgumentError(
        StrCat("PiecewiseConstantSchedule: need len(values) == "
               "len(boundaries) + 1, got ",
               s->values.size(), " and ", s->boundaries.size()));
  }
  if (!std::is_sorted(s->boundaries.begin(), s->boundaries.end())) {
    throw InvalidArgumentError("PiecewiseConstantSchedule: boundaries must be sorted");
  }
  state_ = s;
}
double PiecewiseConstantSchedule::Value(int64_t step) const {
  size_t index = 0;
  for (double b : state_->boundaries) index += static_cast<double>(step) >= b;
  return state_->values[index];
}

// ---- Polynomial / Linear ----
struct PolynomialSchedule::State {};
glossa::Params PolynomialSchedule::Params() {
  glossa::Params p = Base(ClsOf<PolynomialSchedule>());
  p.Define("power", 1, "Polynomial power.");
  p.Define("start", ParamValue::List{0, 1.0}, "The starting point (x0, y0).");
  p.Define("limit", ParamValue::List{1, 1.0}, "The ending point (x1, y1).");
  p.Define("origin", "start",
           "'start': y = y0 + ratio^power·(y1 - y0); 'limit': y = y0 + (1 - (1 - ratio)^power)·"
           "(y1 - y0).");
  return p;
}
PolynomialSchedule::PolynomialSchedule(const glossa::Params& p) : BaseSchedule(p) {}
double PolynomialSchedule::Value(int64_t step) const {
  return Polynomial(static_cast<double>(step), Point(params(), "start"), Point(params(), "limit"),
                    params().GetFloat("power"), params().GetString("origin"));
}

struct LinearSchedule::State {};
glossa::Params LinearSchedule::Params() {
  glossa::Params p = Base(ClsOf<LinearSchedule>());
  p.Define("start", ParamValue::List{0, 1.0}, "The starting point (x0, y0).");
  p.Define("limit", ParamValue::List{1, 1.0}, "The ending point (x1, y1).");
  p.Define("origin", "start", "Unused for power 1 (kept for Lingvo compatibility).");
  return p;
}
LinearSchedule::LinearSchedule(const glossa::Params& p) : BaseSchedule(p) {}
double LinearSchedule::Value(int64_t step) const {
  return Polynomial(static_cast<double>(step), Point(params(), "start"), Point(params(), "limit"),
                    1.0, "start");
}

// ---- Exponential ----
struct ExponentialSchedule::State {};
glossa::Params ExponentialSchedule::Params() {
  glossa::Params p = Base(ClsOf<ExponentialSchedule>());
  p.Define("start", ParamValue::List{0, 1.0}, "The starting point (x0, y0), y0 > 0.");
  p.Define("limit", ParamValue::List{1, 0.5}, "The ending point (x1, y1), y1 > 0.");
  return p;
}
ExponentialSchedule::ExponentialSchedule(const glossa::Params& p) : BaseSchedule(p) {
  CheckExponential(Point(params(), "start"), Point(params(), "limit"));
}
double ExponentialSchedule::Value(int64_t step) const {
  return Exponential(static_cast<double>(step), Point(params(), "start"), Point(params(), "limit"));
}

// ---- StepwiseExponential ----
struct StepwiseExponentialSchedule::State {};
glossa::Params StepwiseExponentialSchedule::Params() {
  glossa::Params p = Base(ClsOf<StepwiseExponentialSchedule>());
  p.Define("decay", 0.99, "Decay factor.");
  p.Define("num_steps_per_decay", 1000, "Number of steps between decays.");
  return p;
}
StepwiseExponentialSchedule::StepwiseExponentialSchedule(const glossa::Params& p)
    : BaseSchedule(p) {
  if (params().GetInt("num_steps_per_decay") <= 0) {
    throw InvalidArgumentError("StepwiseExponentialSchedule: num_steps_per_decay must be > 0");
  }
}
double StepwiseExponentialSchedule::Value(int64_t step) const {
  const double n = std::floor(static_cast<double>(step) /
                              static_cast<double>(params().GetInt("num_steps_per_decay")));
  return std::pow(params().GetFloat("decay"), n);
}

// ---- Continuous ----
struct ContinuousSchedule::State {
  std::pair<double, double> start, limit;
};
glossa::Params ContinuousSchedule::Params() {
  glossa::Params p = Base(ClsOf<ContinuousSchedule>());
  p.Define("initial_value", 1.0, "Initial decay value.");
  p.Define("start_step", 400000, "Starts to decay the learning rate from this step.");
  p.Define("half_life_steps", 100000,
           "Halve the learning rate every this many steps after start_step.");
  p.Define("min", 0.01, "Minimum relative learning rate.");
  return p;
}
ContinuousSchedule::ContinuousSchedule(const glossa::Params& p) : BaseSchedule(p) {
  auto s = std::make_shared<State>();
  const double start = static_cast<double>(params().GetInt("start_step"));
  const double limit = start + static_cast<double>(params().GetInt("half_life_steps")) *
                                   std::log(params().GetFloat("min")) / std::log(0.5);
  s->start = {start, 1.0};
  s->limit = {limit, params().GetFloat("min")};
  CheckExponential(s->start, s->limit);
  state_ = s;
}
double ContinuousSchedule::Value(int64_t step) const {
  return params().GetFloat("initial_value") *
         Exponential(static_cast<double>(step), state_->start, state_->limit);
}

// ---- Transformer ----
struct TransformerSchedule::State {};
glossa::Params TransformerSchedule::Params() {
  glossa::Params p = Base(ClsOf<TransformerSchedule>());
  p.Define("warmup_steps", 4000, "Increase the learning rate linearly for the first warmup_steps.");
  p.Define("model_dim", 512,
           "Model dimension that applies to embedding layers and all Transformer layers.");
  p.Define("worker_replicas", 1, "Number of worker replicas.");
  p.Define("decay_end", nullptr, "Ends the learning rate decay at decay_end-th step.");
  p.Define("decay_factor", -0.5, "Decay factor (exponent of the step in the decay term).");
  p.Define("start_step", 0, "Shifts the decay term left by this many steps.");
  p.Define("cyclical_step", nullptr, "If set, the step is taken modulo this before the formula.");
  return p;
}
TransformerSchedule::TransformerSchedule(const glossa::Params& p) : BaseSchedule(p) {
  if (params().IsSet("cyclical_step") && params().GetInt("cyclical_step") <= 0) {
    throw InvalidArgumentError("TransformerSchedule: cyclical_step must be > 0");
  }
}
double TransformerSchedule::Value(int64_t step) const {
  const glossa::Params& p = params();
  if (p.IsSet("cyclical_step")) step = FloorMod(step, p.GetInt("cyclical_step"));
  double s = static_cast<double>(step);
  const double w = static_cast<double>(p.GetInt("warmup_steps") * p.GetInt("worker_replicas"));
  if (p.IsSet("decay_end")) s = std::min(s, p.GetFloat("decay_end"));
  const double df = p.GetFloat("decay_factor");
  const double warm = (s + 1) * std::pow(w, df - 1);  // +inf when warmup_steps == 0
  const double decay = std::pow(s + static_cast<double>(p.GetInt("start_step")) + 1, df);
  return std::pow(static_cast<double>(p.GetInt("model_dim")), -0.5) * std::min(warm, decay);
}

// ---- LinearRampupExponentialDecayScaledByNumSplit ----
namespace {
struct RampupDecay {
  bool has_ramp;
  std::pair<double, double> ramp_start, ramp_end, decay_start, decay_end;
  double peak, max;
};
RampupDecay MakeRampupDecay(const Params& p, double splits) {
  RampupDecay r;
  const double warmup_end = static_cast<double>(p.GetInt("warmup")) * splits;
  const double decay_start = std::max(warmup_end + 1.0, p.GetFloat("decay_start") / splits);
  r.peak = splits;
  const double decay_end = std::max(decay_start + 1.0, p.GetFloat("decay_end") / splits);
  r.has_ramp = warmup_end > 0;
  r.ramp_start = {0.0, p.GetFloat("warmup_init")};
  r.ramp_end = {warmup_end, r.peak};
  r.decay_start = {decay_start, r.peak};
  r.decay_end = {decay_end, p.GetFloat("min")};
  CheckExponential(r.decay_start, r.decay_end);
  r.max = p.GetFloat("max");
  return r;
}
double RampupDecayValue(const RampupDecay& r, int64_t step) {
  const double x = static_cast<double>(step);
  double v = std::min(r.max, r.peak);
  if (r.has_ramp) v = std::min(v, Polynomial(x, r.ramp_start, r.ramp_end, 1.0, "start"));
  return std::min(v, Exponential(x, r.decay_start, r.decay_end));
}
glossa::Params RampupDecayParams(const ClassRef& cls) {
  glossa::Params p = Base(cls);
  p.Define("warmup", 300,
           "Linearly increase the learning rate for this many steps (times splits).");
  p.Define("warmup_init", 1.0, "The initial learning rate multiplier.");
  p.Define("decay_start", 70000, "Starts to decay at this step (divided by splits).");
  p.Define("decay_end", 100000, "Ends the exponential decay at this step (divided by splits).");
  p.Define("min", 0.01, "The minimum multiplier after decay_end.");
  p.Define("max", 1e8, "The maximum multiplier.");
  p.Define("num_splits", 1,
           "Number of splits (Lingvo infers it from the cluster when 0; here it must be >= 1).");
  return p;
}
}  // namespace

struct LinearRampupExponentialDecayScaledByNumSplitSchedule::State {
  RampupDecay r;
};
glossa::Params LinearRampupExponentialDecayScaledByNumSplitSchedule::Params() {
  return RampupDecayParams(ClsOf<LinearRampupExponentialDecayScaledByNumSplitSchedule>());
}
LinearRampupExponentialDecayScaledByNumSplitSchedule::
    LinearRampupExponentialDecayScaledByNumSplitSchedule(const glossa::Params& p)
    : BaseSchedule(p) {
  const int64_t splits = params().GetInt("num_splits");
  if (splits < 1) {
    throw InvalidArgumentError(
        "LinearRampupExponentialDecayScaledByNumSplitSchedule: num_splits must be >= 1");
  }
  state_ = std::make_shared<State>(State{MakeRampupDecay(params(), static_cast<double>(splits))});
}
double LinearRampupExponentialDecayScaledByNumSplitSchedule::Value(int64_t step) const {
  return RampupDecayValue(state_->r, step);
}

struct LinearRampupExponentialDecay::State {
  RampupDecay r;
};
glossa::Params LinearRampupExponentialDecay::Params() {
  glossa::Params p = RampupDecayParams(ClsOf<LinearRampupExponentialDecay>());
  p.Set("warmup_init", 0.0);
  return p;
}
LinearRampupExponentialDecay::LinearRampupExponentialDecay(const glossa::Params& p)
    : BaseSchedule(p) {
  if (params().GetInt("num_splits") != 1) {
    throw InvalidArgumentError("LinearRampupExponentialDecay: num_splits must be 1");
  }
  state_ = std::make_shared<State>(State{MakeRampupDecay(params(), 1.0)});
}
double LinearRampupExponentialDecay::Value(int64_t step) const {
  return RampupDecayValue(state_->r, step);
}

// ---- Cosine ----
struct CosineSchedule::State {};
glossa::Params CosineSchedule::Params() {
  glossa::Params p = Base(ClsOf<CosineSchedule>());
  p.Define("initial_value", 1.0, "Initial decay value.");
  p.Define("final_value", 0.0, "Final decay value.");
  p.Define("total_steps", 0, "Number of steps to reach the full decay (must be > 0).");
  p.Define("cyclical", false, "Whether the schedule repeats.");
  p.Define("half_cycle", true,
           "When cyclical: restart at initial_value every total_steps (True) or rise back "
           "smoothly over the next total_steps (False).");
  return p;
}
CosineSchedule::CosineSchedule(const glossa::Params& p) : BaseSchedule(p) {
  if (params().GetInt("total_steps") <= 0) {
    throw InvalidArgumentError("CosineSchedule: total_steps must be > 0");
  }
}
double CosineSchedule::Value(int64_t step) const {
  const glossa::Params& p = params();
  return Cosine(step, p.GetFloat("initial_value"), p.GetFloat("final_value"),
                p.GetInt("total_steps"), p.GetBool("cyclical"), p.GetBool("half_cycle"));
}

// ---- LinearRampupCosine ----
struct LinearRampupCosineSchedule::State {
  std::pair<double, double> ramp_start, ramp_end;
  double initial, final_value;
  int64_t total;
  bool cyclical;
};
glossa::Params LinearRampupCosineSchedule::Params() {
  glossa::Params p = Base(ClsOf<LinearRampupCosineSchedule>());
  p.Define("warmup_init", 0.0, "The initial learning rate multiplier.");
  p.Define("warmup_steps", 0, "Linearly increase the learning rate for this many steps.");
  p.Define("initial_value", 1.0, "Initial value of the cosine decay.");
  p.Define("final_value", 0.0, "Final value of the cosine decay.");
  p.Define("total_steps", 0, "Number of steps to reach the full cosine decay.");
  p.Define("cyclical", false, "Whether the cosine decay repeats.");
  p.Define("num_splits", 1, "Number of splits: values are multiplied and steps divided by it.");
  return p;
}
LinearRampupCosineSchedule::LinearRampupCosineSchedule(const glossa::Params& p) : BaseSchedule(p) {
  const int64_t splits = params().GetInt("num_splits");
  if (splits < 1) throw InvalidArgumentError("LinearRampupCosineSchedule: num_splits must be >= 1");
  auto s = std::make_shared<State>();
  const double sd = static_cast<double>(splits);
  const int64_t warmup_end = params().GetInt("warmup_steps") / splits;
  if (warmup_end <= 0) {
    throw InvalidArgumentError(
        "LinearRampupCosineSchedule: warmup_steps // num_splits must be > 0");
  }
  s->ramp_start = {0.0, params().GetFloat("warmup_init") * sd};
  s->ramp_end = {static_cast<double>(warmup_end), params().GetFloat("initial_value") * sd};
  s->initial = params().GetFloat("initial_value") * sd;
  s->final_value = params().GetFloat("final_value") * sd;
  s->total = params().GetInt("total_steps") / splits;
  if (s->total <= 0) {
    throw InvalidArgumentError("LinearRampupCosineSchedule: total_steps // num_splits must be > 0");
  }
  s->cyclical = params().GetBool("cyclical");
  state_ = s;
}
double LinearRampupCosineSchedule::Value(int64_t step) const {
  const State& s = *state_;
  return std::min(Polynomial(static_cast<double>(step), s.ramp_start, s.ramp_end, 1.0, "start"),
                  Cosine(step, s.initial, s.final_value, s.total, s.cyclical, true));
}

// ---- SqrtDecay ----
struct SqrtDecay::State {};
glossa::Params SqrtDecay::Params() {
  glossa::Params p = Base(ClsOf<SqrtDecay>());
  p.Define("warmup_steps", 10000, "Constant until this step (relative to offset).");
  p.Define("multiplier", 1.0, "Multiplier.");
  p.Define("offset", 0.0, "Offset subtracted from the step.");
  return p;
}
SqrtDecay::SqrtDecay(const glossa::Params& p) : BaseSchedule(p) {
  if (params().GetInt("warmup_steps") <= 0) {
    throw InvalidArgumentError("SqrtDecay: warmup_steps must be > 0");
  }
}
double SqrtDecay::Value(int64_t step) const {
  const double x = std::max(static_cast<double>(step) - params().GetFloat("offset"),
                            static_cast<double>(params().GetInt("warmup_steps")));
  return params().GetFloat("multiplier") / std::sqrt(x);
}

// ---- CombinedMinimum ----
struct CombinedMinimumSchedule::State {
  std::vector<std::unique_ptr<BaseSchedule>> children;
};
glossa::Params CombinedMinimumSchedule::Params() {
  glossa::Params p = Base(ClsOf<CombinedMinimumSchedule>());
  p.Define("schedules", ParamValue::List{LinearSchedule::Params()},
           "A list of schedule params; the value is their minimum.");
  return p;
}
CombinedMinimumSchedule::CombinedMinimumSchedule(const glossa::Params& p) : BaseSchedule(p) {
  auto s = std::make_shared<State>();
  for (const auto& v : params().Get("schedules").AsList()) {
    s->children.push_back(v.AsParams().Instantiate<BaseSchedule>());
  }
  if (s->children.empty()) throw InvalidArgumentError("CombinedMinimumSchedule: no schedules");
  state_ = s;
}
double CombinedMinimumSchedule::Value(int64_t step) const {
  double v = state_->children[0]->Value(step);
  for (const auto& c : state_->children) v = std::min(v, c->Value(step));
  return v;
}

GLOSSA_REGISTER_CLASS(ConstantSchedule, "glossa.optim.ConstantSchedule");
GLOSSA_REGISTER_CLASS(PiecewiseConstantSchedule, "glossa.optim.PiecewiseConstantSchedule");
GLOSSA_REGISTER_CLASS(PolynomialSchedule, "glossa.optim.PolynomialSchedule");
GLOSSA_REGISTER_CLASS(LinearSchedule, "glossa.optim.LinearSchedule");
GLOSSA_REGISTER_CLASS(ExponentialSchedule, "glossa.optim.ExponentialSchedule");
GLOSSA_REGISTER_CLASS(StepwiseExponentialSchedule, "glossa.optim.StepwiseExponentialSchedule");
GLOSSA_REGISTER_CLASS(ContinuousSchedule, "glossa.optim.ContinuousSchedule");
GLOSSA_REGISTER_CLASS(TransformerSchedule, "glossa.optim.TransformerSchedule");
GLOSSA_REGISTER_CLASS(LinearRampupExponentialDecayScaledByNumSplitSchedule,
                      "glossa.optim.LinearRampupExponentialDecayScaledByNumSplitSchedule");
GLOSSA_REGISTER_CLASS(LinearRampupExponentialDecay, "glossa.optim.LinearRampupExponentialDecay");
GLOSSA_REGISTER_CLASS(CosineSchedule, "glossa.optim.CosineSchedule");
GLOSSA_REGISTER_CLASS(LinearRampupCosineSchedule, "glossa.optim.LinearRampupCosineSchedule");
GLOSSA_REGISTER_CLASS(SqrtDecay, "glossa.optim.SqrtDecay");
GLOSSA_REGISTER_CLASS(CombinedMinimumSchedule, "glossa.optim.CombinedMinimumSchedule");

}  // namespace glossa
