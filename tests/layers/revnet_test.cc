// RevNet: reconstruction, and the memory-saving custom backward against plain autograd (outputs,
// input and weight gradients), with and without deterministic dropout in f and g; SequentialLayer
// and the Block interface.
#include "glossa/layers/revnet.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include "glossa/base/errors.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/dropout.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/block.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/moe.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/transformer.h"
#include "glossa/summary/summary.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

constexpr int64_t kDim = 6;

// f or g: layer norm → tanh projection → deterministic dropout.
Params SeqBlock(double keep_prob) {
  ParamValue::List sub;
  sub.push_back(LayerNorm::Params().Set("input_dim", kDim));
  sub.push_back(
      FCLayer::Params().Set("input_dim", kDim).Set("output_dim", kDim).Set("activation", "TANH"));
  sub.push_back(DeterministicDropoutLayer::Params().Set("keep_prob", keep_prob));
  return SequentialLayer::Params().Set("sub", sub);
}

Params RevLayer(double keep_prob) {
  return RevNetLayer::Params().Set("f_params", SeqBlock(keep_prob)).Set("g_params", SeqBlock(keep_prob));
}

std::unique_ptr<StackedRevNetLayer> Stack(int layers, double keep_prob, bool custom) {
  ParamValue::List sub;
  for (int i = 0; i < layers; ++i) sub.push_back(RevLayer(keep_prob));
  Params p = StackedRevNetLayer::Params();
  p.Set("name", "rev").Set("random_seed", 5).Set("dtype", DType::kFloat64);
  p.Set("sub_layer_params", sub).Set("custom_gradient", custom);
  return InstantiateLayer<StackedRevNetLayer>(p);
}

TEST(RevNetLayer, ReverseRebuildsTheInputsReplayingDropout) {
  Params p = RevLayer(0.7);
  p.Set("name", "layer").Set("random_seed", 3).Set("dtype", DType::kFloat64);
  auto layer = InstantiateLayer<RevNetLayer>(p);
  at::Tensor x1 = at::randn({3, 4, kDim}, at::kDouble), x2 = at::randn({3, 4, kDim}, at::kDouble);
  GlobalStepContext step(9);
  ResetStepSeed(100);
  auto out = layer->FProp(layer->theta(), x1, x2);
  EXPECT_EQ(out.f_seed, 100);
  EXPECT_GT(out.g_seed, out.f_seed);
  ResetStepSeed(77);  // the reverse must not depend on the current step seed, nor change it
  auto r = layer->ReverseAndGrad(layer->theta(), out.y1, out.y2, at::ones_like(x1),
                                 at::ones_like(x2), out.f_seed, out.g_seed);
  EXPECT_EQ(GetStepSeed(), 77);
  EXPECT_TRUE(at::allclose(r.x1, x1, 0, 1e-12));
  EXPECT_TRUE(at::allclose(r.x2, x2, 0, 1e-12));
  // With the wrong seeds the dropout masks differ and so does the reconstruction.
  auto wrong = layer->ReverseAndGrad(layer->theta(), out.y1, out.y2, at::ones_like(x1),
                                     at::ones_like(x2), out.f_seed + 1, out.g_seed + 1);
  EXPECT_FALSE(at::allclose(wrong.x2, x2, 0, 1e-6));
}

// Runs a stack forward and backward from fresh seeds: outputs, dx1, dx2 and every weight gradient.
std::vector<at::Tensor> RunStack(const StackedRevNetLayer& stack, const at::Tensor& x1,
                                 const at::Tensor& x2, int64_t* seed_after) {
  GlobalStepContext step(4);
  ResetStepSeed(0);
  at::Tensor a = x1.detach().requires_grad_(true), b = x2.detach().requires_grad_(true);
  NestedMap theta = stack.theta();
  auto [y1, y2] = stack.FProp(theta, a, b);
  *seed_after = GetStepSeed();
  at::Tensor w1 = at::linspace(-1, 1, y1.numel(), at::kDouble).view(y1.sizes());
  at::Tensor loss = (y1 * w1).sum() + (y2 * y2).sum() * 0.5;
  std::vector<at::Tensor> wrt = {a, b};
  for (const auto& t : theta.FlattenTensors()) wrt.push_back(t);
  std::vector<at::Tensor> out = {y1.detach(), y2.detach()};
  for (auto& g : torch::autograd::grad({loss}, wrt)) out.push_back(g);
  return out;
}

TEST(StackedRevNetLayer, CustomGradientMatchesPlainBackprop) {
  for (double keep : {1.0, 0.7}) {
    SCOPED_TRACE(keep);
    auto custom = Stack(4, keep, true), plain = Stack(4, keep, false);
    at::Tensor x1 = at::randn({2, 5, kDim}, at::kDouble), x2 = at::randn({2, 5, kDim}, at::kDouble);
    int64_t seed_custom = 0, seed_plain = 0;
    auto c = RunStack(*custom, x1, x2, &seed_custom);
    auto p = RunStack(*plain, x1, x2, &seed_plain);
    ASSERT_EQ(c.size(), p.size());
    ASSERT_EQ(c.size(), 4u + 4 * 2 * 4);  // y1, y2, dx1, dx2, 4 layers x 2 blocks x (ln 2 + fc 2)
    for (size_t i = 0; i < c.size(); ++i) {
      EXPECT_TRUE(at::allclose(c[i], p[i], 1e-10, 1e-11)) << "tensor " << i;
    }
    EXPECT_EQ(seed_custom, seed_plain);
    if (keep < 1.0) {
      EXPECT_GT(seed_plain, 0);  // each dropout drew a seed
    }
  }
  // Dropout is really on at keep 0.7: the outputs differ from keep 1.0.
  int64_t s = 0;
  at::Tensor x = at::randn({2, 5, kDim}, at::kDouble);
  EXPECT_FALSE(at::allclose(RunStack(*Stack(2, 0.7, true), x, x, &s)[0],
                            RunStack(*Stack(2, 1.0, true), x, x, &s)[0]));
}

TEST(StackedRevNetLayer, CustomForwardKeepsNoPerLayerGraph) {
  auto stack = Stack(3, 1.0, true);
  at::Tensor x1 = at::randn({2, 5, kDim}, at::kDouble).requires_grad_(true);
  auto [y1, y2] = stack->FProp(stack->theta(), x1, x1 * 2);
  // The outputs hang off one custom node whose inputs are the stack's inputs and weights only.
  ASSERT_TRUE(y1.grad_fn());
  EXPECT_EQ(y1.grad_fn().get(), y2.grad_fn().get());
  for (const auto& edge : y1.grad_fn()->next_edges()) {
    if (!edge.function) continue;
    const std::string name = edge.function->name();
    EXPECT_TRUE(name.find("AccumulateGrad") != std::string::npos ||
                name.find("MulBackward") != std::string::npos)
        << name;  // weights, x1, and x1 * 2
  }
}

TEST(StackedRevNetLayer, FreesTheStepWithTheGraph) {
  auto stack = Stack(3, 0.7, true);
  at::Tensor x1 = at::randn({2, 5, kDim}, at::kDouble).requires_grad_(true);
  std::weak_ptr<torch::autograd::Node> node;
  {
    auto [y1, y2] = stack->FProp(stack->theta(), x1, x1 * 2);
    node = y1.grad_fn();
    (y1.sum() + y2.sum()).backward();
  }
  EXPECT_TRUE(node.expired());
  EXPECT_TRUE(x1.grad().defined());
}

// A block that counts its calls in a summary.
class SummaryCountingBlock : public BaseLayer, public Block {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseLayer::Params();
    p.Set("cls", ClsOf<SummaryCountingBlock>());
    return p;
  }
  explicit SummaryCountingBlock(const glossa::Params& p) : BaseLayer(p) {}
  at::Tensor FPropBlock(const NestedMap&, const at::Tensor& x, const at::Tensor&) const override {
    summary::Scalar("block_calls", 1.0, SummaryReduce::kSum);
    return at::tanh(x);
  }
};
GLOSSA_REGISTER_CLASS(SummaryCountingBlock, "glossa.testing.SummaryCountingBlock");

TEST(StackedRevNetLayer, TheBackwardReplayRecordsNoSummaries) {
  for (bool custom : {true, false}) {
    SCOPED_TRACE(custom);
    ParamValue::List sub;
    for (int i = 0; i < 3; ++i) {
      sub.push_back(RevNetLayer::Params()
                        .Set("f_params", SummaryCountingBlock::Params())
                        .Set("g_params", SummaryCountingBlock::Params()));
    }
    Params p = StackedRevNetLayer::Params();
    p.Set("name", "rev").Set("dtype", DType::kFloat64);
    p.Set("sub_layer_params", sub).Set("custom_gradient", custom);
    auto stack = InstantiateLayer<StackedRevNetLayer>(p);
    SummaryContext ctx;
    at::Tensor x = at::randn({2, 5, kDim}, at::kDouble).requires_grad_(true);
    {
      SummaryLoop loop;
      auto [y1, y2] = stack->FProp(stack->theta(), x, x * 2);
      (y1.sum() + y2.sum()).backward();  // the custom backward replays f and g of every layer
    }
    ASSERT_TRUE(x.grad().defined());
    const auto all = ctx.MergeAll();
    ASSERT_TRUE(all.count("block_calls/"));
    EXPECT_EQ(all.at("block_calls/").item<double>(), 6.0);  // 3 layers x (f, g), forward only
  }
}

TEST(StackedRevNetLayer, ExtraInputsReachFAndGForwardAndInReverse) {
  // f and g are feed-forward blocks that zero padded positions: the paddings are the extra input.
  Params ff = TransformerFeedForwardLayer::Params();
  ff.Set("input_dim", kDim).Set("hidden_dim", 8).Set("relu_dropout_prob", 0.3);
  ff.Set("dropout_tpl", DeterministicDropoutLayer::Params());
  auto make = [&](bool custom) {
    ParamValue::List sub;
    for (int i = 0; i < 3; ++i) {
      sub.push_back(RevNetLayer::Params().Set("f_params", ff).Set("g_params", ff));
    }
    Params p = StackedRevNetLayer::Params();
    p.Set("name", "rev").Set("random_seed", 3).Set("dtype", DType::kFloat64);
    p.Set("sub_layer_params", sub).Set("custom_gradient", custom);
    return InstantiateLayer<StackedRevNetLayer>(p);
  };
  auto custom = make(true), plain = make(false);
  const at::Tensor x1 = at::randn({2, 5, kDim}, at::kDouble), x2 = at::randn({2, 5, kDim}, at::kDouble);
  const at::Tensor paddings = at::tensor({0, 0, 0, 1, 1, 0, 0, 0, 0, 1}, at::kDouble).view({2, 5});
  auto run = [&](const StackedRevNetLayer& stack, const at::Tensor& extra) {
    GlobalStepContext step(4);
    ResetStepSeed(0);
    at::Tensor a = x1.detach().requires_grad_(true), b = x2.detach().requires_grad_(true);
    NestedMap theta = stack.theta();
    auto [y1, y2] = stack.FProp(theta, a, b, extra);
    at::Tensor loss = (y1 * y1).sum() + (y2 * at::linspace(-1, 1, y2.numel(), at::kDouble)
                                                    .view(y2.sizes()))
                                            .sum();
    std::vector<at::Tensor> wrt = {a, b};
    for (const auto& t : theta.FlattenTensors()) wrt.push_back(t);
    std::vector<at::Tensor> out = {y1.detach(), y2.detach()};
    for (auto& g : torch::autograd::grad({loss}, wrt)) out.push_back(g);
    return out;
  };
  const auto c = run(*custom, paddings), p = run(*plain, paddings);
  ASSERT_EQ(c.size(), p.size());
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_TRUE(at::allclose(c[i], p[i], 1e-10, 1e-11)) << "tensor " << i;
  }
  // The paddings changed what f and g computed (at the padded positions only).
  const auto without = run(*custom, {});
  EXPECT_FALSE(at::allclose(c[0], without[0]));
  EXPECT_TRUE(at::allclose(c[0][0].narrow(0, 0, 3), without[0][0].narrow(0, 0, 3)));
}

TEST(StackedRevNetLayer, RejectsBadConfigs) {
  Params p = StackedRevNetLayer::Params();
  p.Set("name", "rev");
  EXPECT_ERROR_CONTAINS(InstantiateLayer<StackedRevNetLayer>(p), InvalidArgumentError,
                        "sub_layer_params must be a non-empty list");
  Params bad = RevNetLayer::Params().Set(
      "f_params", EmbeddingLayer::Params().Set("vocab_size", 4).Set("embedding_dim", 2));
  bad.Set("g_params", SeqBlock(1.0)).Set("name", "r");
  EXPECT_ERROR_CONTAINS(InstantiateLayer<RevNetLayer>(bad), InvalidArgumentError,
                        "cannot be a block of RevNet layer 'r': its class does not implement the "
                        "Block interface");
  Params moe = TransformerShardedMoeLayer::Params();
  moe.Set("input_dim", kDim).Set("hidden_dim", 8).Set("num_experts", 2);
  Params with_moe = RevNetLayer::Params().Set("f_params", SeqBlock(1.0)).Set("g_params", moe);
  with_moe.Set("name", "r");
  EXPECT_ERROR_CONTAINS(InstantiateLayer<RevNetLayer>(with_moe), InvalidArgumentError,
                        "cannot be inside RevNet layer 'r': its aux loss would be lost");
  Params no_g = RevNetLayer::Params().Set("f_params", SeqBlock(1.0)).Set("name", "r");
  EXPECT_ERROR_CONTAINS(InstantiateLayer<RevNetLayer>(no_g), InvalidArgumentError,
                        "g_params must be set");
}

TEST(SequentialLayer, AppliesSubLayersInOrder) {
  Params p = SeqBlock(1.0);
  p.Set("name", "seq").Set("random_seed", 2).Set("dtype", DType::kFloat64);
  auto seq = InstantiateLayer<SequentialLayer>(p);
  at::Tensor x = at::randn({3, kDim}, at::kDouble);
  NestedMap theta = seq->theta();
  const auto& sub = theta.at("sub").AsList();
  at::Tensor want = static_cast<LayerNorm*>(seq->GetChildren("sub")[0])->FProp(sub[0].AsMap(), x);
  want = at::tanh(at::matmul(want, sub[1].AsMap().GetTensor("w")) + sub[1].AsMap().GetTensor("b"));
  EXPECT_TRUE(at::allclose(seq->FProp(theta, x), want, 1e-12, 1e-12));
  const Block& block = AsBlock(*seq, "the test");
  EXPECT_TRUE(at::allclose(block.FPropBlock(theta, x, {}), want, 1e-12, 1e-12));
}

}  // namespace
}  // namespace glossa
