#include "glossa/kernels/int8_gemm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "glossa/base/errors.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/parallel.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// The weight quantization in double: s = max|w[:, n]| / 127, q = round(w / s), and
// dequantized it is within s / 2 of w.
TEST(Int8Gemm, QuantizesEachOutputChannelOnItsOwnScale) {
  at::manual_seed(3);
  at::Tensor w = at::randn({37, 21});
  w.select(1, 4).mul_(100.0);   // a channel 100 times larger must not coarsen the others
  w.select(1, 7).zero_();       // a channel of zeros
  const auto q = QuantizeInt8(w);
  ASSERT_EQ(q->k, 37);
  ASSERT_EQ(q->n, 21);
  const at::Tensor amax = w.abs().amax(0).to(at::kDouble);
  for (int64_t n = 0; n < 21; ++n) {
    EXPECT_NEAR(q->scale[n], amax[n].item<double>() / 127, 1e-6 * amax[n].item<double>()) << n;
    int32_t sum = 0;
    for (int64_t k = 0; k < 37; ++k) {
      const int v = q->q[n * 37 + k];
      sum += v;
      EXPECT_LE(std::abs(v), 127);
      EXPECT_LE(std::abs(v * double(q->scale[n]) - w[k][n].item<double>()),
                q->scale[n] * 0.5 * (1 + 1e-5))
          << n << "," << k;
    }
    EXPECT_EQ(sum, q->sum[n]);
  }
  EXPECT_EQ(q->scale[7], 0.0f);
  // The largest value of every nonzero channel is ±127.
  EXPECT_EQ(std::abs(q->q[4 * 37 + w.select(1, 4).abs().argmax().item<int64_t>()]), 127);
  EXPECT_THROW(QuantizeInt8(at::randn({3})), InvalidArgumentError);
  at::Tensor bad = at::randn({4, 3});
  bad[2][1] = std::nan("");
  EXPECT_THROW(QuantizeInt8(bad), InvalidArgumentError);
}

// Against ATen in double on the same integers; the VNNI path gives the portable path's bits;
// a row's bits do not depend on the other rows or on the thread count.
TEST(Int8Gemm, MatchesAtenOnTheQuantizedValuesAndEachRowStandsAlone) {
  at::manual_seed(1);
  const int threads = KernelThreads();
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{128, 512}, {37, 70}, {5, 3},
                             {128, 2000}, {512, 128}, {6, 17}}) {
    const at::Tensor x = at::randn({70, K}), w = at::randn({K, N}) * 0.1, b = at::randn({N});
    const auto q = QuantizeInt8(w);
    for (bool relu : {false, true}) {
      for (bool bias : {false, true}) {
        const at::Tensor bb = bias ? b : at::Tensor();
        const at::Tensor y = Int8Affine(x, *q, bb, relu);
        const at::Tensor want = Int8AffineAten(x, *q, bb, relu);
        EXPECT_LE((y.to(at::kDouble) - want).abs().max().item<double>(),
                  1e-6 * (1 + want.abs().max().item<double>()))
            << K << "x" << N;
        EXPECT_TRUE(SameBits(y, Int8AffinePortable(x, *q, bb, relu))) << K << "x" << N;
        for (int64_t rows : {1, 3, 4, 5, 17}) {
          SetKernelThreads(rows % 2 == 0 ? 2 : 1);
          const at::Tensor part = Int8Affine(x.narrow(0, 70 - rows, rows), *q, bb, relu);
          EXPECT_TRUE(SameBits(part, y.narrow(0, 70 - rows, rows))) << rows << " rows";
        }
        SetKernelThreads(threads);
      }
    }
    // And close to the float product: the error of 8-bit weights and activations.
    const at::Tensor exact = at::addmm(b.to(at::kDouble), x.to(at::kDouble), w.to(at::kDouble));
    const double rel = ((Int8Affine(x, *q, b).to(at::kDouble) - exact).norm() / exact.norm())
                           .item<double>();
    EXPECT_LT(rel, 0.02) << K << "x" << N;
  }
}

TEST(Int8Gemm, RowsOfZerosGiveTheBiasAndBadShapesAreRefused) {
  const auto q = QuantizeInt8(at::randn({8, 5}));
  const at::Tensor b = at::randn({5});
  const at::Tensor y = Int8Affine(at::zeros({3, 8}), *q, b);
  EXPECT_TRUE(at::equal(y, b.expand({3, 5})));
  EXPECT_EQ(Int8Affine(at::zeros({0, 8}), *q, b).sizes(), (std::vector<int64_t>{0, 5}));
  EXPECT_THROW(Int8Affine(at::randn({3, 7}), *q, b), InvalidArgumentError);
  EXPECT_THROW(Int8Affine(at::randn({3, 8}), *q, at::randn({4})), InvalidArgumentError);
  EXPECT_THROW(Int8Affine(at::randn({3, 8}).to(at::kDouble), *q, b), InvalidArgumentError);
  at::Tensor inf = at::randn({2, 8});
  inf[1][3] = INFINITY;
  EXPECT_THROW(Int8Affine(inf, *q, b), InvalidArgumentError);
}

}  // namespace
}  // namespace glossa
