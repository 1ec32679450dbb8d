#include "glossa/kernels/step_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

namespace glossa {
namespace {

// The native kernel against the ATen reference (gather, einsum, softmax, einsum) in double, for
// head sizes that fill AVX-512 registers and ones that leave a tail, with masked steps, rows that
// name other slots (a reordered beam), and caches with spare capacity.
TEST(StepAttention, MatchesTheReferenceThroughRowTables) {
  at::manual_seed(4);
  for (int64_t H : {32, 20, 64}) {
    for (int64_t L : {1, 7, 33}) {
      const int64_t n = 5, heads = 3, cap = 40;
      const at::Tensor q = at::randn({n, heads, H});
      const at::Tensor key = at::randn({n, cap, heads, H}), value = at::randn({n, cap, heads, H});
      const at::Tensor rows = at::randint(0, n, {n, cap}, at::kLong);
      at::Tensor bias = at::zeros({n, L});
      if (L > 2) bias.select(1, 1).fill_(std::numeric_limits<float>::lowest());
      for (bool with_bias : {false, true}) {
        const at::Tensor b = with_bias ? bias : at::Tensor();
        const at::Tensor got = StepAttention(q, key, value, rows, L, b);
        const at::Tensor want = StepAttentionReference(q.to(at::kDouble), key.to(at::kDouble),
                                                       value.to(at::kDouble), rows, L,
                                                       with_bias ? b.to(at::kDouble) : at::Tensor());
        ASSERT_EQ(got.sizes(), want.sizes());
        EXPECT_LE((got.to(at::kDouble) - want).abs().max().item<double>(), 2e-5)
            << "H " << H << " L " << L << " bias " << with_bias;
      }
    }
  }
}

TEST(StepAttention, RefusesShapesAndRowsItCannotRead) {
  const at::Tensor q = at::randn({2, 1, 4}), kv = at::randn({2, 8, 1, 4});
  EXPECT_THROW(StepAttention(q, kv, kv, at::zeros({2, 8}, at::kLong), 9, {}), std::exception);
  EXPECT_THROW(StepAttention(q, kv, kv, at::zeros({3, 8}, at::kLong), 2, {}), std::exception);
  EXPECT_THROW(StepAttention(q, kv, kv, at::full({2, 8}, 5, at::kLong), 2, {}), std::exception);
  EXPECT_THROW(StepAttention(q, kv, kv, at::zeros({2, 8}, at::kLong), 2, at::zeros({2, 3})),
               std::exception);
}

}  // namespace
}  // namespace glossa
