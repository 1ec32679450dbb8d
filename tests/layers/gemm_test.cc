// Affine (glossa/layers/gemm.h): bf16 products through float32 GEMMs against float64 products of
// the same bf16 values, and against ATen's bf16 addmm; forward and gradients, with and without a
// bias, for tall and wide outputs (split by rows or by columns) and a transposed weight.
#include "glossa/layers/gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "glossa/runtime/cpu_runtime.h"

namespace glossa {
namespace {

struct Result {
  at::Tensor y, dx, dw, db;
};

Result RunAffine(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0, const at::Tensor& g,
           bool affine, bool transposed_w) {
  at::Tensor x = x0.detach().clone().requires_grad_(true);
  at::Tensor w = (transposed_w ? w0.t().contiguous() : w0).detach().clone().requires_grad_(true);
  at::Tensor b = b0.defined() ? b0.detach().clone().requires_grad_(true) : at::Tensor();
  const at::Tensor wv = transposed_w ? w.t() : w;
  at::Tensor y = affine ? Affine(x, wv, b) : (b.defined() ? at::addmm(b, x, wv) : at::mm(x, wv));
  (y.to(at::kDouble) * g).sum().backward();
  at::Tensor dw = transposed_w ? w.grad().t() : w.grad();
  return {y.detach(), x.grad(), dw, b.defined() ? b.grad() : at::Tensor()};
}

// max |got − want| / (max |want| + tiny), as a fraction of bf16's precision.
double RelError(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kDouble);
  return (got.to(at::kDouble) - w).abs().max().item<double>() /
         (w.abs().max().item<double>() + 1e-30);
}

TEST(Affine, Bf16ThroughFloat32GemmsMatchesFloat64AndAtenAddmm) {
  if (!Bf16GemmViaFloat32()) GTEST_SKIP() << "this CPU keeps oneDNN's bf16 GEMMs (AMX)";
  for (int threads : {1, 2}) {
    const int saved = at::get_num_threads();
    at::set_num_threads(threads);
    for (auto [m, k, n] : {std::make_tuple(64, 24, 40), std::make_tuple(5, 16, 300),
                           std::make_tuple(1, 3, 1)}) {
      for (bool bias : {true, false}) {
        for (bool transposed : {false, true}) {
          SCOPED_TRACE(testing::Message() << "threads " << threads << " m,k,n " << m << "," << k
                                          << "," << n << " bias " << bias << " wᵀ " << transposed);
          at::manual_seed(m * 7 + n);
          const at::Tensor x = at::randn({m, k}).to(at::kBFloat16);
          const at::Tensor w = at::randn({k, n}).to(at::kBFloat16);
          const at::Tensor b = bias ? at::randn({n}).to(at::kBFloat16) : at::Tensor();
          const at::Tensor g = at::randn({m, n}, at::kDouble);
          const Result got = RunAffine(x, w, b, g, true, transposed);
          EXPECT_EQ(got.y.scalar_type(), at::kBFloat16);
          EXPECT_EQ(got.dx.scalar_type(), at::kBFloat16);
          EXPECT_EQ(got.dw.scalar_type(), at::kBFloat16);
          // float64 products of the same bf16 values.
          const at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble);
          at::Tensor yd = at::mm(xd, wd);
          if (bias) yd = yd + b.to(at::kDouble);
          const at::Tensor gb = g.to(at::kBFloat16).to(at::kDouble);  // the upstream as bf16
          // One bf16 rounding of the float32 sums: 2^-8 relative, with room for the sums.
          EXPECT_LT(RelError(got.y, yd), 1.0 / 128);
          EXPECT_LT(RelError(got.dx, at::mm(gb, wd.t())), 1.0 / 128);
          EXPECT_LT(RelError(got.dw, at::mm(xd.t(), gb)), 1.0 / 128);
          if (bias) {
            EXPECT_LT(RelError(got.db, gb.sum(0)), 1.0 / 128);
          }
          // ATen's bf16 kernels round the same way, up to the order of the sums.
          const Result aten = RunAffine(x, w, b, g, false, transposed);
          EXPECT_LT(RelError(got.y, aten.y), 1.0 / 64);
          EXPECT_LT(RelError(got.dx, aten.dx), 1.0 / 64);
          EXPECT_LT(RelError(got.dw, aten.dw), 1.0 / 64);
        }
      }
    }
    at::set_num_threads(saved);
  }
}

TEST(Affine, OtherDtypesAreAtensOwn) {
  at::manual_seed(3);
  for (auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor x = at::randn({4, 3}, dtype), w = at::randn({3, 5}, dtype),
                     b = at::randn({5}, dtype);
    EXPECT_TRUE(at::equal(Affine(x, w, b), at::addmm(b, x, w)));
    EXPECT_TRUE(at::equal(Affine(x, w, at::Tensor()), at::mm(x, w)));
  }
  EXPECT_THROW(Affine(at::randn({4, 3}), at::randn({4, 5}), at::Tensor()), c10::Error);
}

}  // namespace
}  // namespace glossa
