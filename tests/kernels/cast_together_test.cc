// CastTogether: each output has .to()'s bits, and each gradient comes back in its input's dtype
// with ToCopyBackward's bits; without gradients the casts are plain.
#include "glossa/kernels/cast_together.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

namespace glossa {
namespace {

TEST(CastTogether, EachOutputIsToAndEachGradientIsToCopyBackward) {
  // Sizes that do and do not fill a 16-lane vector, one above the conversion's chunk, NaN and
  // infinities, and a non-contiguous input.
  std::vector<at::Tensor> xs = {at::randn({3, 5}) * 100, at::randn({37}), at::randn({300, 300}),
                                at::randn({4, 6}).t()};
  xs[1][0] = std::numeric_limits<float>::quiet_NaN();
  xs[1][1] = std::numeric_limits<float>::infinity();
  xs[1][2] = 3.0f + 1.0f / 512;  // a tie: rounds to even
  for (auto& x : xs) x.requires_grad_(true);
  const std::vector<at::Tensor> got = CastTogether(xs, at::kBFloat16);
  ASSERT_EQ(got.size(), xs.size());
  // One autograd node for all of them.
  for (const auto& y : got) EXPECT_EQ(y.grad_fn(), got[0].grad_fn());
  std::vector<at::Tensor> cots;
  for (size_t i = 0; i < xs.size(); ++i) {
    const at::Tensor want = xs[i].detach().to(at::kBFloat16);
    EXPECT_EQ(got[i].scalar_type(), at::kBFloat16);
    EXPECT_EQ(got[i].sizes(), xs[i].sizes());
    EXPECT_TRUE(at::equal(got[i].isnan(), want.isnan())) << i;
    EXPECT_TRUE(at::equal(got[i].nan_to_num(0), want.nan_to_num(0))) << i;
    cots.push_back(at::randn(xs[i].sizes()).to(at::kBFloat16));
  }
  // The gradient of one output left out is zero for its input (not computed).
  const auto g = torch::autograd::grad({got[0], got[2], got[3]}, xs, {cots[0], cots[2], cots[3]},
                                       /*retain_graph=*/true, false, /*allow_unused=*/true);
  for (size_t i : {0, 2, 3}) {
    EXPECT_EQ(g[i].scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(g[i], cots[i].to(at::kFloat))) << i;
  }
  EXPECT_TRUE(!g[1].defined() || at::equal(g[1], at::zeros_like(xs[1]))) << g[1];
}

TEST(CastTogether, WithoutGradientsTheCastsArePlain) {
  const std::vector<at::Tensor> xs = {at::randn({40}), at::randn({2, 2}, at::kDouble)};
  const auto got = CastTogether(xs, at::kBFloat16);
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_FALSE(got[i].requires_grad());
    EXPECT_TRUE(at::equal(got[i], xs[i].to(at::kBFloat16))) << i;
  }
  at::Tensor w = at::randn({8}).requires_grad_(true);
  {
    at::NoGradGuard no_grad;
    EXPECT_FALSE(CastTogether({w}, at::kBFloat16)[0].requires_grad());
  }
  EXPECT_TRUE(CastTogether({}, at::kBFloat16).empty());
}

}  // namespace
}  // namespace glossa
