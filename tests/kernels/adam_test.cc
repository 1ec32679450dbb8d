// AdamUpdate: its native pass gives the reference's (the ATen ops') bits, in place, on any layout.
#include "glossa/kernels/adam.h"

#include <ATen/ATen.h>
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

}  // namespace
}  // namespace glossa
