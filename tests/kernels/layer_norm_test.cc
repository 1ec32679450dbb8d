// LayerNormLastDim: the reference is ATen's layer_norm (bf16 normalized in float32); the native
// bf16 pass stays within one bf16 rounding of it, gradients included, and the native float32 pass
// within float32 rounding of the double-precision layer norm; a row's bits do not depend on the
// other rows.
#include "glossa/kernels/layer_norm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

namespace glossa {
namespace {

TEST(LayerNormKernel, ReferenceIsAtensLayerNorm) {
  const at::Tensor x = at::randn({3, 5, 12}), s = at::randn({12}), b = at::randn({12});
  EXPECT_TRUE(at::equal(LayerNormLastDimReference(x, s, b, 1e-6),
                        at::layer_norm(x, {12}, s, b, 1e-6)));
}

// Float32 (native where the CPU has AVX-512, else the reference) against ATen's layer norm in
// double precision, values and all three gradients, over row lengths that do and do not fill
// the 16-lane vectors and row counts over several 64-row gradient blocks.
TEST(LayerNormKernel, Float32IsTheDoublePrecisionLayerNormRounded) {
  for (int64_t d : {8, 37, 512}) {
    at::manual_seed(d);
    const at::Tensor x0 = at::randn({150, d}) * 3 + 1, s0 = at::randn({d}), b0 = at::randn({d});
    const at::Tensor cot = at::randn({150, d});
    auto run = [&](at::ScalarType dtype) {
      at::Tensor x = x0.to(dtype).requires_grad_(true), s = s0.to(dtype).requires_grad_(true),
                 b = b0.to(dtype).requires_grad_(true);
      at::Tensor y = dtype == at::kFloat ? LayerNormLastDim(x, s, b, 1e-6)
                                         : at::layer_norm(x, {d}, s, b, 1e-6);
      EXPECT_EQ(y.scalar_type(), dtype);
      const auto g = torch::autograd::grad({y}, {x, s, b}, {cot.to(dtype)});
      return std::vector<at::Tensor>{y.to(at::kDouble), g[0].to(at::kDouble),
                                     g[1].to(at::kDouble), g[2].to(at::kDouble)};
    };
    const auto got = run(at::kFloat), want = run(at::kDouble);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(at::allclose(got[i], want[i], 1e-5, 1e-4))
          << "d " << d << " output " << i << ": max error "
          << (got[i] - want[i]).abs().max().item<double>();
    }
  }
}

TEST(LayerNormKernel, ARowsBitsDoNotDependOnTheOtherRows) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = (at::randn({130, 96}) * 2).to(dtype), s = at::randn({96}),
                     b = at::randn({96});
    const at::Tensor all = LayerNormLastDim(x, s, b, 1e-6);
    for (int64_t r : {0, 63, 64, 129}) {
      EXPECT_TRUE(at::equal(all[r], LayerNormLastDim(x.slice(0, r, r + 1), s, b, 1e-6)[0]))
          << dtype << " row " << r;
    }
  }
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
