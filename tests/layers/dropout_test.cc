#include "glossa/layers/dropout.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "glossa/core/step_seed.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(DeterministicDropout, FollowsLingvosFormulaAndReplaysTheSeed) {
  at::Tensor x = at::rand({64, 32}) + 1.0;
  at::Tensor y = DeterministicDropout(x, 0.7, {11, 3});
  // Every element is either dropped or x / keep_prob.
  at::Tensor kept = y.ne(0);
  EXPECT_TRUE(at::allclose(y.masked_select(kept), (x / 0.7).masked_select(kept)));
  const double kept_fraction = kept.to(at::kFloat).mean().item<double>();
  EXPECT_NEAR(kept_fraction, 0.7, 0.03);
  // The mask is floor(keep_prob + U) with U drawn from the seed pair's generator.
  at::Generator gen = MakeSeededGenerator({11, 3});
  at::Tensor u = at::empty({64, 32}).uniform_(0.0, 1.0, gen);
  EXPECT_TRUE(at::equal(kept, at::floor(u + 0.7f).ne(0)));
  EXPECT_TRUE(at::equal(y, DeterministicDropout(x, 0.7, {11, 3})));
  EXPECT_FALSE(at::equal(y, DeterministicDropout(x, 0.7, {11, 4})));
  EXPECT_TRUE(at::equal(DeterministicDropout(x, 1.0, {1, 1}), x));
  EXPECT_THROW(DeterministicDropout(x, 0.0, {1, 1}), InvalidArgumentError);
  EXPECT_THROW(DeterministicDropout(x, 1.5, {1, 1}), InvalidArgumentError);
}

TEST(DeterministicDropout, NoiseShapeBroadcasts) {
  at::Tensor x = at::ones({8, 16});
  at::Tensor y = DeterministicDropout(x, 0.5, {1, 2}, std::vector<int64_t>{8, 1});
  for (int64_t i = 0; i < 8; ++i) {
    const double first = y[i][0].item<double>();
    EXPECT_TRUE(y[i].eq(first).all().item<bool>()) << "row " << i;
  }
}

TEST(DropoutLayer, DeterministicLayerReplaysStepsAndSkipsEvalAndInference) {
  auto p = DeterministicDropoutLayer::Params();
  p.Set("name", "drop").Set("keep_prob", 0.5).Set("random_seed", 9);
  auto layer = InstantiateLayer<DropoutLayer>(p);
  at::Tensor x = at::ones({100});
  GlobalStepContext step(3);
  ResetStepSeed();
  at::Tensor a = layer->FProp(layer->theta(), x);
  at::Tensor b = layer->FProp(layer->theta(), x);  // next step seed: another mask
  EXPECT_FALSE(at::equal(a, b));
  ResetStepSeed();
  EXPECT_TRUE(at::equal(a, layer->FProp(layer->theta(), x)));
  // The mask is the one DeterministicDropout draws from (step + seed, step_seed + seed).
  EXPECT_TRUE(at::equal(a, DeterministicDropout(x, 0.5, {3 + 9, 0 + 9})));
  {
    EvalModeScope eval;
    EXPECT_TRUE(at::equal(layer->FProp(layer->theta(), x), x));
  }
  p.Set("dropout_at_eval", true);
  auto at_eval = InstantiateLayer<DropoutLayer>(p);
  {
    EvalModeScope eval;
    EXPECT_FALSE(at::equal(at_eval->FProp(at_eval->theta(), x), x));
  }
  p.Set("is_inference", true);
  auto inference = InstantiateLayer<DropoutLayer>(p);
  EXPECT_TRUE(at::equal(inference->FProp(inference->theta(), x), x));
}

TEST(DropoutLayer, PlainDropoutScalesKeptValues) {
  auto p = DropoutLayer::Params();
  p.Set("name", "drop")
      .Set("keep_prob", 0.8)
      .Set("noise_shape_broadcast_dims", ParamValue::List{-1});
  auto layer = InstantiateLayer<DropoutLayer>(p);
  at::Tensor x = at::ones({200, 10});
  at::Tensor y = layer->FProp(layer->theta(), x);
  EXPECT_TRUE((y.eq(0) | y.eq(1.0f / 0.8f)).all().item<bool>());
  EXPECT_TRUE(y.eq(y.select(1, 0).unsqueeze(1)).all().item<bool>());  // whole rows kept or dropped
  EXPECT_NEAR(y.ne(0).to(at::kFloat).mean().item<double>(), 0.8, 0.08);
  p.Set("noise_shape_broadcast_dims", ParamValue::List{5});
  auto bad = InstantiateLayer<DropoutLayer>(p);
  EXPECT_ERROR_CONTAINS(bad->FProp(bad->theta(), x), InvalidArgumentError, "invalid broadcast dim");
  p.Set("keep_prob", 0.0);
  EXPECT_THROW(InstantiateLayer<DropoutLayer>(p), InvalidArgumentError);
}

}  // namespace
}  // namespace glossa
