#include "glossa/layers/dropout.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "glossa/core/step_seed.h"
#include "glossa/layers/mesh.h"
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
  // The mask is floor(keep_prob + U) with U the seed pair's counter-based uniforms.
  at::Tensor u = StatelessUniform({11, 3}, {64, 32}, 0, 64, 0, 32);
  EXPECT_TRUE(at::equal(kept, at::floor(u + 0.7f).ne(0)));
  EXPECT_TRUE(at::equal(y, DeterministicDropout(x, 0.7, {11, 3})));
  EXPECT_FALSE(at::equal(y, DeterministicDropout(x, 0.7, {11, 4})));
  EXPECT_TRUE(at::equal(DeterministicDropout(x, 1.0, {1, 1}), x));
  EXPECT_THROW(DeterministicDropout(x, 0.0, {1, 1}), InvalidArgumentError);
  EXPECT_THROW(DeterministicDropout(x, 1.5, {1, 1}), InvalidArgumentError);
}

// The counter-based uniforms: any block drawn alone is that block of the whole draw; they look
// uniform (mean 1/2, variance 1/12, neighbours uncorrelated, every decile filled) and the seeds
// change them.
TEST(StatelessUniform, BlocksAreTheWholeDrawsAndLookUniform) {
  const std::vector<int64_t> whole = {6, 10, 7};
  const at::Tensor all = StatelessUniform({4, 9}, whole, 0, 6, 0, 10);
  ASSERT_EQ(all.sizes(), at::IntArrayRef(whole));
  EXPECT_TRUE(at::equal(StatelessUniform({4, 9}, whole, 2, 3, 4, 5),
                        all.narrow(0, 2, 3).narrow(1, 4, 5)));
  EXPECT_TRUE(at::equal(StatelessUniform({4, 9}, {420}, 100, 50, 0, 1),
                        all.reshape({-1}).narrow(0, 100, 50)));
  EXPECT_FALSE(at::equal(StatelessUniform({4, 10}, whole, 0, 6, 0, 10), all));
  EXPECT_FALSE(at::equal(StatelessUniform({5, 9}, whole, 0, 6, 0, 10), all));
  const at::Tensor u = StatelessUniform({1, 2}, {1 << 20}, 0, 1 << 20, 0, 1).to(at::kDouble);
  EXPECT_GE(u.min().item<double>(), 0.0);
  EXPECT_LT(u.max().item<double>(), 1.0);
  EXPECT_NEAR(u.mean().item<double>(), 0.5, 2e-3);
  EXPECT_NEAR(u.var().item<double>(), 1.0 / 12, 1e-3);
  const at::Tensor a = u.narrow(0, 0, (1 << 20) - 1) - 0.5, b = u.narrow(0, 1, (1 << 20) - 1) - 0.5;
  EXPECT_LT(std::abs((a * b).mean().item<double>() / (1.0 / 12)), 5e-3);
  const at::Tensor counts = at::histc(u, 10, 0.0, 1.0);
  EXPECT_LT((counts / (1 << 20) - 0.1).abs().max().item<double>(), 2e-3);
  EXPECT_THROW(StatelessUniform({1, 2}, {4, 4}, 3, 2, 0, 4), InvalidArgumentError);
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

// A 'model' axis of 2 ranks that exchanges nothing (the layers here only ask where they sit).
class TwoRankAxis : public MeshAxis {
 public:
  int size() const override { return 2; }
  int index() const override { return 0; }
  at::Tensor ExchangeBlocks(const at::Tensor& x) override { return x; }
};

// On a 'model' axis, whose ranks hold activations alike, plain dropout (each process's generator)
// is refused when it would drop; the seeded one draws one process's mask there.
TEST(DropoutLayer, PlainDropoutIsRefusedOnAModelAxis) {
  TwoRankAxis axis;
  const BuildContext on_model = BuildContext().WithAxis("model", &axis);
  const at::Tensor x = at::ones({4, 6});
  auto plain = InstantiateLayer<DropoutLayer>(
      DropoutLayer::Params().Set("name", "drop").Set("keep_prob", 0.5), on_model);
  EXPECT_ERROR_CONTAINS(plain->FProp(plain->theta(), x), FailedPreconditionError,
                        "on the 2 ranks of a 'model' axis, which hold activations alike, it would "
                        "drop different units on each: use DeterministicDropoutLayer");
  auto keep_all = InstantiateLayer<DropoutLayer>(
      DropoutLayer::Params().Set("name", "drop").Set("keep_prob", 1.0), on_model);
  EXPECT_TRUE(at::equal(keep_all->FProp(keep_all->theta(), x), x));
  Params seeded = DeterministicDropoutLayer::Params();
  seeded.Set("name", "drop").Set("keep_prob", 0.5).Set("random_seed", 3);
  auto det = InstantiateLayer<DeterministicDropoutLayer>(seeded, on_model);
  auto one = InstantiateLayer<DeterministicDropoutLayer>(seeded);
  GlobalStepContext step(4);
  ResetStepSeed();
  const at::Tensor on_ranks = det->FProp(det->theta(), x);
  ResetStepSeed();  // the same step seed again
  const at::Tensor alone = one->FProp(one->theta(), x);
  EXPECT_TRUE(at::equal(on_ranks, alone));
  EXPECT_TRUE(on_ranks.eq(0).any().item<bool>());  // it did drop
}

}  // namespace
}  // namespace glossa

namespace glossa {
namespace {

// Rank i of n with its rows of a batch (BatchShardScope) draws rows block i of the masks of the
// whole batch, so n ranks' masks put together are one process's; a mask broadcast over dim 0 is
// the same on every rank; a block out of range is refused.
TEST(DeterministicDropout, ABatchShardDrawsItsRowsOfTheWholeBatchMask) {
  const std::array<int64_t, 2> seeds = {7, 11};
  const at::Tensor x = at::ones({6, 5});
  const at::Tensor whole = DeterministicDropout(x, 0.5, seeds, std::nullopt);
  for (int64_t i = 0; i < 3; ++i) {
    BatchShardScope shard(i, 3);
    const at::Tensor mine = DeterministicDropout(x.narrow(0, 2 * i, 2), 0.5, seeds, std::nullopt);
    EXPECT_TRUE(at::equal(mine, whole.narrow(0, 2 * i, 2))) << "block " << i;
    // A mask broadcast over the rows: the same on every rank as in one process.
    const std::vector<int64_t> one_row = {1, 5};
    const at::Tensor bcast = DeterministicDropout(x.narrow(0, 2 * i, 2), 0.5, seeds, one_row);
    EXPECT_TRUE(at::equal(bcast, DeterministicDropout(x, 0.5, seeds, one_row).narrow(0, 0, 2)));
  }
  // Outside the scope the thread's tensors are the whole batch again.
  EXPECT_TRUE(at::equal(DeterministicDropout(x, 0.5, seeds, std::nullopt), whole));
  EXPECT_EQ(CurrentBatchShard().count, 1);
  EXPECT_THROW(BatchShardScope(3, 3), InvalidArgumentError);
  EXPECT_THROW(BatchShardScope(0, 0), InvalidArgumentError);
}

// The experts of a data × expert mesh: [experts, groups, ...] split along both dims, each rank's
// block (i, j) of the whole draw.
TEST(DeterministicDropout, ATwoDimensionalShardDrawsItsBlockOfTheWholeMask) {
  const std::array<int64_t, 2> seeds = {5, 3};
  const at::Tensor x = at::ones({4, 6, 3});
  const at::Tensor whole = DeterministicDropout(x, 0.5, seeds, std::nullopt);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      BatchShardScope shard(i, 2, j, 3);
      const at::Tensor block = x.narrow(0, 2 * i, 2).narrow(1, 2 * j, 2);
      EXPECT_TRUE(at::equal(DeterministicDropout(block, 0.5, seeds, std::nullopt),
                            whole.narrow(0, 2 * i, 2).narrow(1, 2 * j, 2)))
          << "block " << i << ", " << j;
    }
  }
  EXPECT_THROW(BatchShardScope(0, 1, 2, 2), InvalidArgumentError);
}

}  // namespace
}  // namespace glossa
