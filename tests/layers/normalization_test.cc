// Layer norm in bfloat16 and batch norm's training and eval statistics.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "glossa/core/step_seed.h"
#include "glossa/base/strings.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/block.h"
#include "glossa/layers/conv.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/revnet.h"
#include "glossa/layers/rnn.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(LayerNormBf16, MatchesTheFloat32Composition) {
  for (int64_t d : {128, 37, 8}) {
    for (bool direct : {false, true}) {
      SCOPED_TRACE(StrCat("D ", d, " direct_scale ", direct));
      Params p = LayerNorm::Params();
      p.Set("name", "ln").Set("random_seed", 3).Set("input_dim", d).Set("direct_scale", direct);
      p.Set("fprop_dtype", DType::kBFloat16);
      auto ln = InstantiateLayer<LayerNorm>(p);
      at::manual_seed(d);
      const at::Tensor scale = at::randn({d}) * 0.3 + (direct ? 1.0 : 0.0), bias = at::randn({d});
      const at::Tensor x0 = (at::randn({5, 67, d}) * 3 + 1).to(at::kBFloat16);
      const at::Tensor c = at::randn({5, 67, d});
      auto run = [&](bool fused) {
        at::Tensor s = scale.clone().requires_grad_(true), b = bias.clone().requires_grad_(true);
        at::Tensor x = x0.clone().requires_grad_(true);
        at::Tensor y;
        if (fused) {
          NestedMap theta;
          theta.Put("scale", s);
          theta.Put("bias", b);
          y = ln->FProp(theta, x);
        } else {
          const at::Tensor g = direct ? s : s + 1;
          y = at::layer_norm(x.to(at::kFloat), {d}, g, b, 1e-6).to(at::kBFloat16);
        }
        (y.to(at::kFloat) * c).sum().backward();
        return std::vector<at::Tensor>{y.detach(), x.grad(), s.grad(), b.grad()};
      };
      const auto got = run(true), want = run(false);
      ASSERT_EQ(got[0].scalar_type(), at::kBFloat16);
      ASSERT_EQ(got[1].scalar_type(), at::kBFloat16);
      for (size_t i = 0; i < got.size(); ++i) {
        const at::Tensor w = want[i].to(at::kDouble), g = got[i].to(at::kDouble);
        // One bf16 rounding apart at most (2^-8 relative), against the row's scale.
        const double err = ((g - w).abs() / (w.abs() + 1e-2 * w.abs().max())).max().item<double>();
        EXPECT_LT(err, i < 2 ? 1.0 / 128 : 1e-4) << "result " << i;
      }
      // Most outputs are the same bf16 value.
      EXPECT_GT(got[0].eq(want[0]).to(at::kFloat).mean().item<double>(), 0.97);
    }
  }
}

TEST(BatchNormLayer, TrainingUpdatesMovingStatsAndEvalUsesThem) {
  auto bn = Make<BatchNormLayer>(BatchNormLayer::Params(), "dim : 3\ndecay : 0.5");
  at::Tensor x = at::randn({4, 6, 3}) * 2 + 5;
  at::Tensor y = bn->FProp(bn->theta(), x);
  // Training: batch statistics normalize (per channel mean 0, variance ~1).
  EXPECT_TRUE(at::allclose(y.mean(std::vector<int64_t>{0, 1}), at::zeros({3}), 1e-4, 1e-4));
  at::Tensor batch_mean = x.mean(std::vector<int64_t>{0, 1});
  EXPECT_TRUE(at::allclose(bn->GetVariable("moving_mean"), batch_mean * 0.5, 1e-5, 1e-5));
  EXPECT_FALSE(bn->GetVariable("moving_mean").requires_grad());
  at::Tensor moving_mean = bn->GetVariable("moving_mean").clone();
  EvalModeScope eval;
  at::Tensor y_eval = bn->FProp(bn->theta(), x);
  EXPECT_TRUE(at::equal(bn->GetVariable("moving_mean"), moving_mean));  // no update in eval
  at::Tensor expected = (x - moving_mean) / at::sqrt(bn->GetVariable("moving_variance") + 0.001);
  EXPECT_TRUE(at::allclose(y_eval, expected, 1e-5, 1e-5));
}

}  // namespace
}  // namespace glossa
