// ResidualAdd: the same bits as ATen's x + y on the kernel threads' path and on ATen's, and the
// output's gradient passed to both inputs.
#include "glossa/kernels/residual_add.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "glossa/kernels/parallel.h"

namespace glossa {
namespace {

TEST(ResidualAdd, IsAtensSumWithItsGradientOnEveryPath) {
  const int saved = KernelThreads();
  for (int threads : {1, 2, 3}) {
    SetKernelThreads(threads);
    // Above the threshold (the kernel threads, in several chunks), at it, below it, a bf16 pair,
    // and a non-contiguous x (ATen's add).
    for (int64_t n : {int64_t{1} << 20, kResidualAddMinNumel, int64_t{1000}}) {
      for (bool strided : {false, true}) {
        at::Tensor x0 = at::randn({n / 64, 64}), y0 = at::randn({n / 64, 64});
        if (strided) x0 = at::randn({64, n / 64}).t();
        const at::Tensor x = x0.clone().requires_grad_(true), y = y0.clone().requires_grad_(true);
        const at::Tensor out = ResidualAdd(x, y);
        EXPECT_TRUE(at::equal(out, x0 + y0)) << n << " threads " << threads;
        const at::Tensor cot = at::randn(out.sizes());
        const auto g = torch::autograd::grad({out}, {x, y}, {cot});
        EXPECT_TRUE(at::equal(g[0], cot));
        EXPECT_TRUE(at::equal(g[1], cot));
      }
    }
  }
  SetKernelThreads(saved);
  const at::Tensor a = at::randn({300, 300}).to(at::kBFloat16), b = at::randn({300, 300}).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(ResidualAdd(a, b), a + b));
}

}  // namespace
}  // namespace glossa
