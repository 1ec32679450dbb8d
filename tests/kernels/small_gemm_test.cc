// SmallSgemm: every element is the chain of fused multiply-adds in order of p that a scalar loop
// of std::fmaf gives (bit for bit, whatever the tile, the k panel or the number of rows), and
// within float32's rounding bound of the product in double; TransposeRows and PackRows against
// plain loops.
#include "glossa/kernels/small_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/kernels/cpu_features.h"

namespace glossa {
namespace {

std::vector<float> Random(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Case {
  int64_t m, n, k;
  bool transposed_a, accumulate;
};

TEST(SmallSgemm, IsTheOrderedFmaChainAndWithinRoundingOfDouble) {
  if (!CpuHasAvx512F()) {  // GLOSSA_KERNELS=reference, or a CPU without AVX-512: refused
    std::vector<float> a(4, 1.0f), b(4, 1.0f), c(4);
    EXPECT_THROW(SmallSgemm(2, 2, 2, a.data(), 2, 1, b.data(), 2, false, c.data(), 2), InternalError);
    return;
  }
  std::mt19937 rng(7);
  std::vector<Case> cases;
  for (int64_t m : {1, 5, 6, 7, 13, 64}) {
    for (int64_t n : {1, 15, 16, 17, 64, 65, 200}) {
      for (int64_t k : {0, 1, 7, 64, 128, 129, 300}) {
        cases.push_back({m, n, k, (m + n + k) % 2 == 0, (m * n + k) % 3 == 0});
      }
    }
  }
  for (const Case& cs : cases) {
    const int64_t m = cs.m, n = cs.n, k = cs.k;
    // Strides beyond the minimum (views of wider tensors): A [m, k] or stored [k, m].
    const int64_t a_ld = (cs.transposed_a ? m : k) + 3, ldb = n + 5, ldc = n + 2;
    const int64_t a_row = cs.transposed_a ? 1 : a_ld, a_col = cs.transposed_a ? a_ld : 1;
    const std::vector<float> a = Random((cs.transposed_a ? k : m) * a_ld + 1, rng);
    const std::vector<float> b = Random(k * ldb + 1, rng);
    std::vector<float> c = Random(m * ldc, rng);
    const std::vector<float> c0 = c;
    SmallSgemm(m, n, k, a.data(), a_row, a_col, b.data(), ldb, cs.accumulate, c.data(), ldc);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const std::string at = "m=" + std::to_string(m) + " n=" + std::to_string(n) +
                               " k=" + std::to_string(k) + " (" + std::to_string(i) + ", " +
                               std::to_string(j) + ")";
        if (j >= n) {  // the padding of C's rows is not written
          ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]) << at;
          continue;
        }
        float chain = cs.accumulate ? c0[i * ldc + j] : 0.0f;
        double exact = chain, magnitude = std::fabs(chain);
        for (int64_t p = 0; p < k; ++p) {
          const float x = a[i * a_row + p * a_col], y = b[p * ldb + j];
          chain = std::fmaf(x, y, chain);
          exact += static_cast<double>(x) * y;
          magnitude += std::fabs(static_cast<double>(x) * y);
        }
        ASSERT_EQ(c[i * ldc + j], chain) << at;
        ASSERT_LE(std::fabs(c[i * ldc + j] - exact),
                  (k + 1) * std::numeric_limits<float>::epsilon() * magnitude + 1e-30)
            << at;
      }
    }
  }
}

TEST(SmallSgemm, ARowsBitsDoNotDependOnTheOtherRows) {
  if (!CpuHasAvx512F()) return;  // refused there (the test above)
  std::mt19937 rng(11);
  const int64_t m = 23, n = 70, k = 150;
  const std::vector<float> a = Random(m * k, rng), b = Random(k * n, rng);
  std::vector<float> all(m * n), one(n);
  SmallSgemm(m, n, k, a.data(), k, 1, b.data(), n, false, all.data(), n);
  for (int64_t i = 0; i < m; ++i) {
    SmallSgemm(1, n, k, a.data() + i * k, k, 1, b.data(), n, false, one.data(), n);
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(all[i * n + j], one[j]) << i << ", " << j;
  }
}

TEST(SmallSgemm, RefusesNegativeSizes) {
  float x = 0;
  EXPECT_THROW(SmallSgemm(-1, 1, 1, &x, 1, 1, &x, 1, false, &x, 1), InvalidArgumentError);
  EXPECT_THROW(SmallSgemm(1, 1, -2, &x, 1, 1, &x, 1, false, &x, 1), InvalidArgumentError);
}

TEST(TransposeRows, IsThePlainTransposeOnEveryEdge) {
  std::mt19937 rng(3);
  for (int64_t rows : {1, 15, 16, 17, 33, 64, 256}) {
    for (int64_t cols : {1, 15, 16, 17, 64}) {
      const int64_t src_row = cols + 7, ld = rows + 16;
      const std::vector<float> src = Random(rows * src_row, rng);
      std::vector<float> dst(cols * ld, -1.0f);
      TransposeRows(rows, cols, src.data(), src_row, dst.data(), ld);
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t i = 0; i < ld; ++i) {
          const float want = i < rows ? src[i * src_row + j] : -1.0f;  // padding untouched
          ASSERT_EQ(dst[j * ld + i], want) << rows << "x" << cols << " at " << j << ", " << i;
        }
      }
    }
  }
}

TEST(PackRows, CopiesTheRowsAndNothingElse) {
  std::mt19937 rng(5);
  const int64_t rows = 9, cols = 20, src_row = 37, ld = 24;
  const std::vector<float> src = Random(rows * src_row, rng);
  std::vector<float> dst(rows * ld, -1.0f);
  PackRows(rows, cols, src.data(), src_row, dst.data(), ld);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < ld; ++j) {
      ASSERT_EQ(dst[i * ld + j], j < cols ? src[i * src_row + j] : -1.0f) << i << ", " << j;
    }
  }
}

}  // namespace
}  // namespace glossa
