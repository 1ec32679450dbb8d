#include "glossa/optim/learner.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/optim/ema.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

Params SgdLearner(double lr) {
  Params p = Learner::Params();
  p.Set("learning_rate", lr)
      .Set("optimizer", SGD::Params())
      .Set("lr_schedule", ConstantSchedule::Params());
  return p;
}

at::Tensor Var(std::vector<double> values) {
  return at::tensor(values, at::kDouble).requires_grad_(true);
}

double Get(const Metrics& m, const std::string& key) { return m.at(key).value.item<double>(); }

TEST(Learner, TrainsALinearRegressionToTheKnownSolution) {
  auto p = ProjectionLayer::Params();
  p.Set("name", "reg").Set("input_dim", 3).Set("output_dim", 1).Set("activation", "NONE");
  p.Set("has_bias", true).Set("random_seed", 5).Set("dtype", DType::kFloat64);
  auto model = InstantiateLayer<ProjectionLayer>(p);
  at::Tensor w_true = at::tensor({1.5, -2.0, 0.5}, at::kDouble).view({3, 1});
  const double b_true = 0.25;
  Params lp = Learner::Params();
  lp.Set("learning_rate", 0.05)
      .Set("optimizer", Adam::Params())
      .Set("lr_schedule", ConstantSchedule::Params());
  auto learner = lp.Instantiate<Learner>();
  at::Generator gen = MakeSeededGenerator({1, 2});
  for (int64_t step = 0; step < 600; ++step) {
    at::Tensor x = at::normal(0.0, 1.0, {32, 3}, gen, at::TensorOptions().dtype(at::kDouble));
    at::Tensor y = at::matmul(x, w_true) + b_true;
    at::Tensor loss = (model->FProp(model->theta(), x) - y).square().mean();
    learner->Apply({{"loss", {loss, at::full({}, 32.0)}}}, LearnerVariables(*model), step);
  }
  EXPECT_TRUE(at::allclose(model->GetVariable("w"), w_true, 0, 1e-3)) << model->GetVariable("w");
  EXPECT_NEAR(model->GetVariable("b").item<double>(), b_true, 1e-3);
}

TEST(Learner, ReportsLingvosMetricsAndScheduledLearningRate) {
  Params p = SgdLearner(0.5);
  p.Set("lr_schedule", PiecewiseConstantSchedule::Params()
                           .Set("boundaries", ParamValue::List{10})
                           .Set("values", ParamValue::List{1.0, 0.1}));
  auto learner = p.Instantiate<Learner>();
  at::Tensor w = Var({3.0, 4.0});
  Metrics m =
      learner->Apply({{"loss", {(w * w).sum() / 2, at::ones({})}}}, {{"w", w, true, false}}, 12);
  EXPECT_DOUBLE_EQ(Get(m, "learning_rate"), 0.05);
  EXPECT_DOUBLE_EQ(Get(m, "lr_schedule"), 0.1);
  EXPECT_DOUBLE_EQ(Get(m, "grad_norm/all"), 5.0);  // gradient = w
  EXPECT_DOUBLE_EQ(Get(m, "var_norm/all"), 5.0);
  EXPECT_DOUBLE_EQ(Get(m, "grad_scale_all"), 1.0);
  EXPECT_DOUBLE_EQ(Get(m, "has_nan_or_inf"), 0.0);
  EXPECT_FALSE(m.count("l2_loss"));
  EXPECT_TRUE(at::allclose(w, at::tensor({3.0 * 0.95, 4.0 * 0.95}, at::kDouble)));
}

TEST(Learner, VarNormCanBeSkippedWithoutChangingTheUpdate) {
  auto with = SgdLearner(0.5).Instantiate<Learner>();
  auto without = SgdLearner(0.5).Instantiate<Learner>();
  at::Tensor w1 = Var({3.0, 4.0}), w2 = Var({3.0, 4.0});
  Metrics m1 = with->Apply({{"loss", {(w1 * w1).sum() / 2, at::ones({})}}},
                           {{"w", w1, true, false}}, 0, /*var_norm=*/true);
  Metrics m2 = without->Apply({{"loss", {(w2 * w2).sum() / 2, at::ones({})}}},
                              {{"w", w2, true, false}}, 0, /*var_norm=*/false);
  EXPECT_DOUBLE_EQ(Get(m1, "var_norm/all"), 5.0);
  EXPECT_FALSE(m2.count("var_norm/all"));
  EXPECT_DOUBLE_EQ(Get(m2, "grad_norm/all"), 5.0);
  EXPECT_TRUE(at::equal(w1, w2));
}

TEST(Learner, GlobalNormClipScalesEveryGradient) {
  Params p = SgdLearner(1.0);
  p.Set("clip_gradient_norm_to_value", 1.0);
  auto learner = p.Instantiate<Learner>();
  at::Tensor a = Var({3.0}), b = Var({4.0});
  Metrics m = learner->Apply({{"loss", {(a * a + b * b).sum() / 2, at::ones({})}}},
                             {{"a", a, true, false}, {"b", b, true, false}}, 0);
  EXPECT_DOUBLE_EQ(Get(m, "grad_scale_all"), 0.2);  // min(1, 1 / 5)
  EXPECT_NEAR(a.item<double>(), 3.0 - 0.6, 1e-12);
  EXPECT_NEAR(b.item<double>(), 4.0 - 0.8, 1e-12);
}

TEST(Learner, SingleNormClipIsPerTensorAndExclusiveWithGlobal) {
  Params p = SgdLearner(1.0);
  p.Set("clip_gradient_single_norm_to_value", 1.0);
  auto learner = p.Instantiate<Learner>();
  at::Tensor a = Var({3.0, 4.0}), b = Var({0.5});
  Metrics m = learner->Apply({{"loss", {(a * a).sum() / 2 + (b * b).sum() / 2, at::ones({})}}},
                             {{"a", a, true, false}, {"b", b, true, false}}, 0);
  EXPECT_TRUE(at::allclose(a, at::tensor({3.0 - 0.6, 4.0 - 0.8}, at::kDouble)));  // norm 5 -> 1
  EXPECT_NEAR(b.item<double>(), 0.0, 1e-12);  // norm 0.5 < 1: unclipped
  EXPECT_FALSE(m.count("grad_norm/all"));
  Params both = SgdLearner(1.0);
  both.Set("clip_gradient_single_norm_to_value", 1.0).Set("clip_gradient_norm_to_value", 1.0);
  EXPECT_ERROR_CONTAINS(both.Instantiate<Learner>(), InvalidArgumentError, "mutually exclusive");
}

TEST(Learner, NanOrInfGradientsLeaveWeightsAndSlotsUnchanged) {
  Params p = Learner::Params();
  p.Set("learning_rate", 0.1).Set("lr_schedule", ConstantSchedule::Params());
  auto learner = p.Instantiate<Learner>();
  at::Tensor w = Var({1.0, 2.0});
  learner->Apply({{"loss", {(w * w).sum(), at::ones({})}}}, {{"w", w, true, false}}, 0);
  const at::Tensor w_before = w.detach().clone();
  std::map<std::string, at::Tensor> slots_before;
  for (const auto& [k, v] : learner->Slots()) slots_before[k] = v.clone();
  at::Tensor bad = at::tensor({std::nan(""), 1.0}, at::kDouble);
  Metrics m =
      learner->Apply({{"loss", {(w * bad).sum(), at::ones({})}}}, {{"w", w, true, false}}, 1);
  EXPECT_DOUBLE_EQ(Get(m, "has_nan_or_inf"), 1.0);
  EXPECT_DOUBLE_EQ(Get(m, "grad_scale_all"), 0.0);
  EXPECT_TRUE(at::equal(w, w_before));
  for (const auto& [k, v] : learner->Slots()) EXPECT_TRUE(at::equal(v, slots_before.at(k))) << k;
  EXPECT_EQ(learner->num_skipped_steps(), 1);
  at::Tensor inf = at::tensor({INFINITY, 1.0}, at::kDouble);
  m = learner->Apply({{"loss", {(w * inf).sum(), at::ones({})}}}, {{"w", w, true, false}}, 2);
  EXPECT_DOUBLE_EQ(Get(m, "has_nan_or_inf"), 1.0);
  EXPECT_TRUE(at::equal(w, w_before));
}

TEST(Learner, HugeGradientNormsAreClippedToZero) {
  Params p = SgdLearner(1.0);
  p.Set("grad_norm_to_clip_to_zero", 10.0);
  auto learner = p.Instantiate<Learner>();
  at::Tensor w = Var({30.0, 40.0});
  Metrics m =
      learner->Apply({{"loss", {(w * w).sum() / 2, at::ones({})}}}, {{"w", w, true, false}}, 0);
  EXPECT_DOUBLE_EQ(Get(m, "grad_scale_all"), 0.0);
  EXPECT_DOUBLE_EQ(Get(m, "has_nan_or_inf"), 0.0);
  EXPECT_TRUE(at::equal(w, at::tensor({30.0, 40.0}, at::kDouble)));
}

TEST(Learner, L2AndL1AdjustGradientsAndSkipMarkedVariables) {
  Params p = SgdLearner(1.0);
  p.Set("l2_regularizer_weight", 0.1).Set("l1_regularizer_weight", 0.01);
  auto learner = p.Instantiate<Learner>();
  at::Tensor w = Var({2.0, -3.0}), s = Var({5.0});
  Metrics m = learner->Apply({{"loss", {w.sum() * 0 + s.sum() * 0, at::ones({})}}},
                             {{"w", w, true, false}, {"s", s, true, true}}, 0);
  EXPECT_NEAR(Get(m, "l2_loss"), 0.5 * 0.1 * (4 + 9), 1e-12);
  EXPECT_NEAR(Get(m, "l1_loss"), 0.01 * 5, 1e-12);
  // g = 0 + 0.1·w + 0.01·sign(w)
  EXPECT_TRUE(at::allclose(w, at::tensor({2.0 - 0.21, -3.0 + 0.31}, at::kDouble)));
  EXPECT_DOUBLE_EQ(s.item<double>(), 5.0);  // skip_lp_regularization
}

TEST(Learner, FilterAndExclusionSelectVariablesByRegexSearch) {
  Params p = SgdLearner(1.0);
  p.Set("bprop_variable_filter", "enc/").Set("bprop_variable_exclusion", "bias");
  auto learner = p.Instantiate<Learner>();
  std::vector<LearnerVariable> vars = {{"model/enc/w", Var({1.0}), true, false},
                                       {"model/enc/bias", Var({1.0}), true, false},
                                       {"model/dec/w", Var({1.0}), true, false},
                                       {"model/enc/frozen", Var({1.0}), false, false}};
  auto selected = learner->SelectVariables(vars);
  ASSERT_EQ(selected.size(), 1u);
  EXPECT_EQ(selected[0].name, "model/enc/w");
  at::Tensor loss = vars[0].value.sum() + vars[1].value.sum() + vars[2].value.sum();
  learner->Apply({{"loss", {loss, at::ones({})}}}, vars, 0);
  EXPECT_DOUBLE_EQ(vars[0].value.item<double>(), 0.0);
  EXPECT_DOUBLE_EQ(vars[1].value.item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(vars[2].value.item<double>(), 1.0);
  EXPECT_ERROR_CONTAINS(SgdLearner(1.0).Set("bprop_variable_filter", "(").Instantiate<Learner>(),
                        InvalidArgumentError, "invalid regex");
}

TEST(Learner, LossIsFoundByNameAndMustBeScalar) {
  Params p = SgdLearner(1.0);
  p.Set("loss_name", "xent");
  auto learner = p.Instantiate<Learner>();
  at::Tensor w = Var({1.0});
  EXPECT_ERROR_CONTAINS(
      learner->Apply({{"loss", {w.sum(), at::ones({})}}}, {{"w", w, true, false}}, 0),
      NotFoundError, "loss xent");
  EXPECT_ERROR_CONTAINS(
      learner->Apply({{"xent", {w * 2, at::ones({})}}}, {{"w", w, true, false}}, 0),
      InvalidArgumentError, "must be a scalar");
}

TEST(Learner, GradNormTrackerRejectsOutliers) {
  Params p = SgdLearner(0.0);
  p.Set("grad_norm_tracker", GradNormTracker::Params());
  auto learner = p.Instantiate<Learner>();
  at::Tensor w = Var({1.0});
  for (int step = 0; step < 400; ++step) {
    learner->Apply({{"loss", {w.sum(), at::ones({})}}}, {{"w", w, true, false}}, step);
  }
  Metrics m =
      learner->Apply({{"loss", {w.sum() * 1e6, at::ones({})}}}, {{"w", w, true, false}}, 400);
  EXPECT_DOUBLE_EQ(Get(m, "grad_scale_all"), 0.0);
  EXPECT_EQ(learner->Slots().at("loss/grad_norm_tracker/total_rejections").item<double>(), 1.0);
}

TEST(Ema, DecayFollowsNumUpdatesOrTheSchedule) {
  ExponentialMovingAverage ema(ExponentialMovingAverage::Params().Set("decay", 0.999));
  EXPECT_DOUBLE_EQ(ema.DecayAt(0), 0.1);
  EXPECT_DOUBLE_EQ(ema.DecayAt(10), 11.0 / 20.0);
  EXPECT_DOUBLE_EQ(ema.DecayAt(1000000), 0.999);
  ExponentialMovingAverage scheduled(ExponentialMovingAverage::Params().Set(
      "ema_schedule", ConstantSchedule::Params().Set("value", 0.5)));
  EXPECT_DOUBLE_EQ(scheduled.DecayAt(0), 0.5);
}

TEST(Ema, ShadowsTrackTrainableAndMovingVariablesAndFeedEvalTheta) {
  auto bn = BatchNormLayer::Params();
  bn.Set("name", "bn").Set("dim", 2);
  auto model = InstantiateLayer<BatchNormLayer>(bn);
  auto ema = std::make_shared<ExponentialMovingAverage>(ExponentialMovingAverage::Params().Set(
      "ema_schedule", ConstantSchedule::Params().Set("value", 0.75)));
  ema->Track(*model);
  model->SetEma(ema);
  auto shadows = ema->Shadows();
  EXPECT_EQ(shadows.size(), 4u);  // beta, gamma, moving_mean, moving_variance
  EXPECT_TRUE(shadows.count("bn/moving_mean/ExponentialMovingAverage"));
  {
    at::NoGradGuard no_grad;
    model->GetVariable("beta").fill_(4.0);
  }
  ema->Apply(0);  // shadow -= 0.25·(shadow - var): 0 -> 1
  EXPECT_TRUE(at::allclose(*ema->Average("bn/beta"), at::full({2}, 1.0)));
  ema->Apply(1);  // 1 -> 1.75
  EXPECT_TRUE(at::allclose(*ema->Average("bn/beta"), at::full({2}, 1.75)));
  {
    EvalModeScope eval;
    EXPECT_TRUE(at::allclose(model->theta().GetTensor("beta"), at::full({2}, 1.75)));
  }
  EXPECT_TRUE(at::allclose(model->theta().GetTensor("beta"), at::full({2}, 4.0)));
  ema->SetShadow("bn/beta/ExponentialMovingAverage", at::full({2}, 9.0));
  EXPECT_TRUE(at::allclose(*ema->Average("bn/beta"), at::full({2}, 9.0)));
  EXPECT_THROW(ema->SetShadow("bn/nope/ExponentialMovingAverage", at::zeros({2})), NotFoundError);
  EXPECT_THROW(ema->SetShadow("bn/beta", at::zeros({2})), InvalidArgumentError);
  EXPECT_FALSE(ema->Average("bn/nope").has_value());
}

TEST(Ema, TasksMustAgree) {
  Params a, b;
  a.Define("ema_decay", 0.999, "").Define("ema_schedule", nullptr, "");
  b.Define("ema_decay", 0.99, "").Define("ema_schedule", nullptr, "");
  EXPECT_NO_THROW(CheckEmaSettingsAgree({{"a", a}, {"a2", a}}));
  EXPECT_ERROR_CONTAINS(CheckEmaSettingsAgree({{"a", a}, {"b", b}}), InvalidArgumentError,
                        "task 'a' has ema_decay = 0.999, task 'b' has ema_decay = 0.99");
}

TEST(Docs, TrainingGuideListsEveryOptimClassWithItsParams) {
  const std::string doc = testing::ReadSourceFile("docs/training.md");
  int classes = 0;
  for (const auto& key : ClassRegistry::Keys()) {
    if (key.rfind("glossa.optim.", 0) != 0) continue;
    ++classes;
    EXPECT_NE(doc.find("`" + key + "`"), std::string::npos) << key << " is not in docs/training.md";
    const auto& entry = ClassRegistry::Get(key);
    ASSERT_TRUE(entry.default_params) << key;
    for (const auto& e : entry.default_params()) {
      if (e.name == "cls") continue;
      EXPECT_NE(doc.find("| `" + e.name + "` |"), std::string::npos)
          << key << " param " << e.name << " is not in docs/training.md";
    }
  }
  EXPECT_GE(classes, 25);
}

}  // namespace
}  // namespace glossa
