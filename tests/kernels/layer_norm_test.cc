// LayerNormLastDim: the reference is ATen's layer_norm (bf16 normalized in float32); the native
// bf16 pass stays within one bf16 rounding of it, gradients included.
#include "glossa/kernels/layer_norm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

namespace glossa {
namespace {

TEST(LayerNormKernel, Float32IsAtensLayerNorm) {
  const at::Tensor x = at::randn({3, 5, 12}), s = at::randn({12}), b = at::randn({12});
  EXPECT_TRUE(at::equal(LayerNormLastDim(x, s, b, 1e-6), at::layer_norm(x, {12}, s, b, 1e-6)));
  EXPECT_TRUE(at::equal(LayerNormLastDimReference(x, s, b, 1e-6),
                        at::layer_norm(x, {12}, s, b, 1e-6)));
}

TEST(LayerNormKernel, Bf16DispatchIsWithinOneRoundingOfTheReference) {
  for (int64_t d : {8, 37, 128}) {
    const at::Tensor x0 = (at::randn({70, d}) * 3 + 1).to(at::kBFloat16);
    const at::Tensor s0 = at::randn({d}), b0 = at::randn({d});
    auto run = [&](bool native) {
      at::Tensor x = x0.clone().requires_grad_(true), s = s0.clone().requires_grad_(true),
                 b = b0.clone().requires_grad_(true);
      at::Tensor y = native ? LayerNormLastDim(x, s, b, 1e-6)
                            : LayerNormLastDimReference(x, s, b, 1e-6);
      EXPECT_EQ(y.scalar_type(), at::kBFloat16);
      const at::Tensor cot = at::randn(y.sizes()).to(at::kBFloat16);
      const auto g = torch::autograd::grad({y}, {x, s, b}, {cot});
      return std::vector<at::Tensor>{y.to(at::kFloat), g[0].to(at::kFloat), g[1], g[2]};
    };
    at::manual_seed(d);
    const auto got = run(true);
    at::manual_seed(d);
    const auto want = run(false);
    // One bf16 rounding (2^-8 relative) of the values; the float32 sums of the scale and bias
    // gradients in another order.
    EXPECT_TRUE(at::allclose(got[0], want[0], 1.0 / 128, 1.0 / 64)) << d;
    EXPECT_TRUE(at::allclose(got[1], want[1], 1.0 / 64, 1.0 / 32)) << d;
    EXPECT_TRUE(at::allclose(got[2], want[2], 1e-3, 1e-2)) << d;
    EXPECT_TRUE(at::allclose(got[3], want[3], 1e-3, 1e-2)) << d;
  }
}

}  // namespace
}  // namespace glossa
