// Learning-rate schedules at chosen steps, with the numbers of Lingvo's schedule_test.py (and the
// formulas where Lingvo has no test), including boundary steps.
#include "glossa/optim/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "tests/test_util.h"

namespace glossa {
namespace {

void ExpectValues(const Params& p, const std::vector<int64_t>& steps,
                  const std::vector<double>& expected, double tol = 1e-6) {
  auto s = p.Instantiate<BaseSchedule>();
  ASSERT_EQ(steps.size(), expected.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_NEAR(s->Value(steps[i]), expected[i], tol + 1e-6 * std::abs(expected[i]))
        << p.ClsKey() << " at step " << steps[i];
  }
}

TEST(Schedules, Constant) {
  ExpectValues(ConstantSchedule::Params().Set("value", 5.0), {0, 10, 100, 1000000}, {5, 5, 5, 5});
}

TEST(Schedules, PiecewiseConstantSwitchesAtTheBoundary) {
  auto p = PiecewiseConstantSchedule::Params()
               .Set("boundaries", ParamValue::List{300000, 400000, 500000})
               .Set("values", ParamValue::List{1.0, 0.1, 0.01, 0.001});
  ExpectValues(p, {299999, 300000, 399999, 400000, 499999, 599999},
               {1.0, 0.1, 0.1, 0.01, 0.01, 0.001});
  EXPECT_ERROR_CONTAINS(PiecewiseConstantSchedule::Params()
                            .Set("boundaries", ParamValue::List{1})
                            .Set("values", ParamValue::List{1.0})
                            .Instantiate<BaseSchedule>(),
                        InvalidArgumentError, "len(values) == len(boundaries) + 1");
  EXPECT_ERROR_CONTAINS(PiecewiseConstantSchedule::Params()
                            .Set("boundaries", ParamValue::List{2, 1})
                            .Set("values", ParamValue::List{1.0, 2.0, 3.0})
                            .Instantiate<BaseSchedule>(),
                        InvalidArgumentError, "sorted");
}

TEST(Schedules, PolynomialFromStartAndLimit) {
  auto p = PolynomialSchedule::Params()
               .Set("power", 2)
               .Set("start", ParamValue::List{0, 0.0})
               .Set("limit", ParamValue::List{20000, 2.0});
  ExpectValues(p, {0, 10000, 20000, 30000}, {0.0, 0.5, 2.0, 2.0});
  p.Set("origin", "limit");
  ExpectValues(p, {0, 5000, 10000, 15000, 20000}, {0.0, 0.875, 1.5, 1.875, 2.0});
  auto bad = PolynomialSchedule::Params().Set("start", ParamValue::List{5, 1.0});
  EXPECT_ERROR_CONTAINS(bad.Instantiate<BaseSchedule>()->Value(1), InvalidArgumentError,
                        "start step (5) must be < limit step (1)");
}

TEST(Schedules, Linear) {
  ExpectValues(LinearSchedule::Params()
                   .Set("start", ParamValue::List{0, 0.0})
                   .Set("limit", ParamValue::List{10, 1.0}),
               {-5, 2, 4, 10, 12}, {0.0, 0.2, 0.4, 1.0, 1.0});
}

TEST(Schedules, Exponential) {
  ExpectValues(ExponentialSchedule::Params()
                   .Set("start", ParamValue::List{4000000, 8.0})
                   .Set("limit", ParamValue::List{8000000, 0.5}),
               {0, 4000000, 5000000, 6000000, 7000000, 8000000, 9000000},
               {8.0, 8.0, 4.0, 2.0, 1.0, 0.5, 0.5});
  EXPECT_THROW(ExponentialSchedule::Params()
                   .Set("limit", ParamValue::List{1, 0.0})
                   .Instantiate<BaseSchedule>(),
               InvalidArgumentError);
}

TEST(Schedules, StepwiseExponential) {
  ExpectValues(
      StepwiseExponentialSchedule::Params().Set("decay", 0.5).Set("num_steps_per_decay", 1000),
      {0, 999, 1000, 1999, 2000}, {1.0, 1.0, 0.5, 0.5, 0.25});
}

TEST(Schedules, Continuous) {
  auto p = ContinuousSchedule::Params()
               .Set("start_step", 1000)
               .Set("half_life_steps", 100)
               .Set("min", 0.1);
  ExpectValues(p, {0, 500, 1000, 1100, 1200, 1300, 1400, 2000},
               {1.0, 1.0, 1.0, 0.5, 0.25, 0.125, 0.1, 0.1});
  auto s = p.Instantiate<BaseSchedule>();
  for (int64_t step = 1000; step < 1200; step += 25) {
    EXPECT_NEAR(s->Value(step), 2 * s->Value(step + 100), 1e-9);
  }
  ExpectValues(ContinuousSchedule::Params()
                   .Set("initial_value", 2.0)
                   .Set("start_step", 1000)
                   .Set("half_life_steps", 100),
               {0, 1000, 1100, 1200, 1300}, {2.0, 2.0, 1.0, 0.5, 0.25});
}

TEST(Schedules, TransformerMatchesLingvosNumbers) {
  auto p = TransformerSchedule::Params().Set("warmup_steps", 4000).Set("model_dim", 512);
  const std::vector<int64_t> steps = {0, 1000, 2000, 3000, 4000, 4500, 5000};
  ExpectValues(
      p, steps,
      {1.74693e-07, 0.000174867, 0.00034956, 0.000524253, 0.000698684, 0.000658735, 0.000624937});
  ExpectValues(p.Copy().Set("decay_factor", -0.8), steps,
               {1.450966e-08, 1.452417e-05, 2.903383e-05, 4.354349e-05, 5.802700e-05, 5.281020e-05,
                4.854221e-05});
  auto capped = p.Copy().Set("decay_end", 5000).Instantiate<BaseSchedule>();
  EXPECT_NEAR(capped->Value(5000), 0.000624937, 1e-9);
  EXPECT_EQ(capped->Value(5001), capped->Value(5000));
  EXPECT_EQ(capped->Value(6000), capped->Value(5000));
  EXPECT_GT(capped->Value(4999), capped->Value(5000));
  // The formula: model_dim^-0.5 · min((s+1)·W^(df-1), (s+start+1)^df).
  auto shifted = TransformerSchedule::Params()
                     .Set("warmup_steps", 3000)
                     .Set("model_dim", 512)
                     .Set("start_step", 1000)
                     .Instantiate<BaseSchedule>();
  auto base = TransformerSchedule::Params()
                  .Set("warmup_steps", 3000)
                  .Set("model_dim", 512)
                  .Instantiate<BaseSchedule>();
  ExpectValues(TransformerSchedule::Params()
                   .Set("warmup_steps", 3000)
                   .Set("model_dim", 512)
                   .Set("start_step", 1000),
               {0, 1000, 2000, 3000, 4000}, {0, 0.000269, 0.000538, 0.000699, 0.000625}, 1e-6);
  for (int64_t step = 3000; step <= 7000; step += 1000) {
    EXPECT_NEAR(shifted->Value(step), base->Value(step + 1000), 1e-12);
  }
  // warmup_steps 0: pure decay.
  auto no_warmup = TransformerSchedule::Params()
                       .Set("warmup_steps", 0)
                       .Set("model_dim", 4)
                       .Instantiate<BaseSchedule>();
  EXPECT_NEAR(no_warmup->Value(3), 0.5 * std::pow(4.0, -0.5), 1e-12);
  // cyclical_step restarts the schedule.
  auto cyc = p.Copy().Set("cyclical_step", 1000).Instantiate<BaseSchedule>();
  EXPECT_EQ(cyc->Value(2500), cyc->Value(500));
}

TEST(Schedules, LinearRampupExponentialDecayScaledByNumSplit) {
  auto p = LinearRampupExponentialDecayScaledByNumSplitSchedule::Params()
               .Set("warmup", 250000)
               .Set("decay_start", 32000000)
               .Set("decay_end", 64000000)
               .Set("min", 0.5)
               .Set("num_splits", 8);
  std::vector<int64_t> steps;
  for (int64_t i = 0; i < 10; ++i) steps.push_back(i * 1000000);
  ExpectValues(p, steps, {1.0, 4.5, 8.0, 8.0, 8.0, 4.0, 2.0, 1.0, 0.5, 0.5});
  ExpectValues(p.Copy().Set("warmup_init", 0.0), steps,
               {0, 4.0, 8.0, 8.0, 8.0, 4.0, 2.0, 1.0, 0.5, 0.5});
  ExpectValues(p.Copy().Set("max", 5.0), steps, {1.0, 4.5, 5.0, 5.0, 5.0, 4.0, 2.0, 1.0, 0.5, 0.5});
  ExpectValues(p.Copy().Set("warmup", 0), steps,
               {8.0, 8.0, 8.0, 8.0, 8.0, 4.0, 2.0, 1.0, 0.5, 0.5});
  ExpectValues(p.Copy().Set("warmup", 0).Set("decay_start", 0).Set("decay_end", 32000000),
               {0, 1000000, 2000000, 3000000, 4000000, 5000000}, {8.0, 4.0, 2.0, 1.0, 0.5, 0.5});
}

TEST(Schedules, LinearRampupExponentialDecay) {
  ExpectValues(LinearRampupExponentialDecay::Params(), {0, 150, 300, 70000, 85000, 100000, 200000},
               {0.0, 0.5, 1.0, 1.0, 0.1, 0.01, 0.01});
}

TEST(Schedules, Cosine) {
  const double c1 = std::cos(std::numbers::pi / 4) + 2, c3 = std::cos(3 * std::numbers::pi / 4) + 2,
               c5 = std::cos(5 * std::numbers::pi / 4) + 2;
  auto p = CosineSchedule::Params()
               .Set("initial_value", 3.0)
               .Set("final_value", 1.0)
               .Set("total_steps", 400000);
  const std::vector<int64_t> steps = {0, 100000, 200000, 300000, 400000, 500000};
  ExpectValues(p, steps, {3.0, c1, 2.0, c3, 1.0, 1.0});
  ExpectValues(p.Copy().Set("cyclical", true), steps, {3.0, c1, 2.0, c3, 3.0, c1});
  ExpectValues(p.Copy().Set("cyclical", true).Set("half_cycle", false), steps,
               {3.0, c1, 2.0, c3, 1.0, c5});
  EXPECT_THROW(CosineSchedule::Params().Instantiate<BaseSchedule>(), InvalidArgumentError);
}

TEST(Schedules, LinearRampupCosine) {
  const double c1 = std::cos(std::numbers::pi / 4) + 2, c3 = std::cos(3 * std::numbers::pi / 4) + 2;
  auto p = LinearRampupCosineSchedule::Params()
               .Set("warmup_steps", 200)
               .Set("initial_value", 3.0)
               .Set("final_value", 1.0)
               .Set("total_steps", 400000);
  const std::vector<int64_t> steps = {0, 100, 200, 100000, 200000, 300000, 399999, 400000, 500000};
  ExpectValues(p, steps, {0.0, 1.5, 3.0, c1, 2.0, c3, 1.0, 1.0, 1.0});
  ExpectValues(p.Copy().Set("cyclical", true), steps, {0.0, 1.5, 3.0, c1, 2.0, c3, 1.0, 3.0, c1});
  EXPECT_ERROR_CONTAINS(
      LinearRampupCosineSchedule::Params().Set("total_steps", 10).Instantiate<BaseSchedule>(),
      InvalidArgumentError, "warmup_steps // num_splits must be > 0");
}

TEST(Schedules, SqrtDecay) {
  ExpectValues(SqrtDecay::Params(), {0, 10000, 40000}, {0.01, 0.01, 0.005});
  ExpectValues(SqrtDecay::Params().Set("multiplier", 2.0).Set("offset", 30000.0), {70000}, {0.01});
}

TEST(Schedules, CombinedMinimum) {
  auto p = CombinedMinimumSchedule::Params().Set(
      "schedules", ParamValue::List{LinearSchedule::Params()
                                        .Set("start", ParamValue::List{0, 1.0})
                                        .Set("limit", ParamValue::List{2000000, 8.0}),
                                    LinearSchedule::Params()
                                        .Set("start", ParamValue::List{2000000, 8.0})
                                        .Set("limit", ParamValue::List{4000000, 8.0}),
                                    ExponentialSchedule::Params()
                                        .Set("start", ParamValue::List{4000000, 8.0})
                                        .Set("limit", ParamValue::List{8000000, 0.5})});
  std::vector<int64_t> steps;
  for (int64_t i = 0; i < 10; ++i) steps.push_back(i * 1000000);
  ExpectValues(p, steps, {1.0, 4.5, 8.0, 8.0, 8.0, 4.0, 2.0, 1.0, 0.5, 0.5});
}

TEST(Schedules, OverridableFromParamsText) {
  Params p = TransformerSchedule::Params();
  p.FromText("warmup_steps : 4000\nmodel_dim : 512\ndecay_end : 5000\n");
  EXPECT_NEAR(p.Instantiate<BaseSchedule>()->Value(6000), 0.000624937, 1e-9);
}

}  // namespace
}  // namespace glossa
