// AdamUpdate: its native pass gives the reference's (the ATen ops') bits, in place, on any layout;
// SumsOfSquares, the norms the learner takes before it.
#include "glossa/kernels/adam.h"
#include "glossa/kernels/parallel.h"
#include "glossa/kernels/squared_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

namespace glossa {
namespace {

TEST(AdamKernel, DispatchGivesTheReferenceBitsInPlace) {
  for (int64_t n : {1, 15, 16, 17, 1000, 70001}) {
    const at::Tensor var0 = at::randn({n}), m0 = at::randn({n}) * 0.1,
                     v0 = at::rand({n}) * 0.01, g = at::randn({n});
    at::Tensor var = var0.clone(), m = m0.clone(), v = v0.clone();
    at::Tensor rvar = var0.clone(), rm = m0.clone(), rv = v0.clone();
    AdamUpdate(var, m, v, g, 0.9, 0.997, 1e-9, 1e-3);
    AdamUpdateReference(rvar, rm, rv, g, 0.9, 0.997, 1e-9, 1e-3);
    EXPECT_TRUE(at::equal(var, rvar)) << n;
    EXPECT_TRUE(at::equal(m, rm)) << n;
    EXPECT_TRUE(at::equal(v, rv)) << n;
    EXPECT_FALSE(at::equal(var, var0)) << n;  // updated in place
  }
  // A strided variable (not the fused pass's layout) and float64 take the reference, in place.
  const at::Tensor base = at::randn({8, 6});
  at::Tensor var = base.clone().t(), m = at::zeros({6, 8}), v = at::zeros({6, 8});
  const at::Tensor g = at::randn({6, 8});
  at::Tensor rvar = var.contiguous(), rm = m.clone(), rv = v.clone();
  AdamUpdate(var, m, v, g, 0.9, 0.98, 1e-9, 0.5);
  AdamUpdateReference(rvar, rm, rv, g, 0.9, 0.98, 1e-9, 0.5);
  EXPECT_TRUE(at::equal(var, rvar));
  at::Tensor d = at::ones({4}, at::kDouble), dm = at::zeros({4}, at::kDouble),
             dv = at::zeros({4}, at::kDouble);
  AdamUpdate(d, dm, dv, at::ones({4}, at::kDouble), 0.9, 0.98, 1e-9, 0.1);
  // First step from zero slots: m = 0.1·g, v = 0.02·g², step = 0.1·0.1/(√0.02 + ε).
  EXPECT_NEAR(d[0].item<double>(), 1 - 0.1 * 0.1 / (std::sqrt(0.02) + 1e-9), 1e-12);
}

// SumsOfSquares (the learner's norms, glossa/kernels/squared_norm.h): each tensor's Σ x² in one
// pass over all, as float64 ATen gives it to rounding, with the same bits for 1 and 2 threads;
// empty, strided, bf16 and float64 tensors too.
TEST(SquaredNormKernel, SumsMatchFloat64AndDoNotDependOnTheThreadCount) {
  std::vector<at::Tensor> ts;
  for (int64_t n : {1, 31, 32, 33, 65536, 65537, 300001}) ts.push_back(at::randn({n}) * 3);
  ts.push_back(at::empty({0}));
  ts.push_back(at::randn({40, 30}).t());                     // strided
  ts.push_back(at::randn({77}).to(at::kBFloat16));          // bf16
  ts.push_back(at::randn({99}, at::kDouble));               // float64
  ts.push_back(at::full({70000}, 1e20f));                   // squares past float's range
  const int threads = at::get_num_threads(), kernel_threads = KernelThreads();
  std::vector<std::vector<double>> by_threads;
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    SetKernelThreads(t);
    by_threads.push_back(SumsOfSquares(ts));
  }
  at::set_num_threads(threads);
  SetKernelThreads(kernel_threads);
  ASSERT_EQ(by_threads[0].size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const double want = SumOfSquaresReference(ts[i]);
    EXPECT_NEAR(by_threads[0][i], want, 1e-11 * want) << i;  // double sums in another order
    EXPECT_EQ(by_threads[0][i], by_threads[1][i]) << i << ": bits differ with the thread count";
  }
  EXPECT_EQ(by_threads[0][7], 0.0);
  const double big = static_cast<double>(1e20f) * static_cast<double>(1e20f) * 70000;
  EXPECT_NEAR(by_threads[0][11], big, 1e-12 * big);  // no overflow, as float32 sums would
}

}  // namespace
}  // namespace glossa
