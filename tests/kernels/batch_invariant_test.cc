#include "glossa/kernels/batch_invariant.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "glossa/kernels/attention_core.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/kernels/parallel.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// Against ATen in double precision, and row by row: a row's bits alone are its bits among any
// number of other rows, at one or two threads; the SIMD path gives the portable path's bits.
TEST(InvariantAffine, MatchesAtenAndEachRowsBitsDoNotDependOnTheOthers) {
  at::manual_seed(1);
  const int threads = KernelThreads();
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{128, 512}, {37, 70}, {5, 3}, {64, 2000}}) {
    const at::Tensor x = at::randn({70, K}), w = at::randn({K, N}), b = at::randn({N});
    for (bool relu : {false, true}) {
      const at::Tensor y = InvariantAffine(x, w, b, relu);
      at::Tensor want = at::addmm(b.to(at::kDouble), x.to(at::kDouble), w.to(at::kDouble));
      if (relu) want = at::relu(want);
      EXPECT_LE((y.to(at::kDouble) - want).abs().max().item<double>(), 1e-4 * std::sqrt(K))
          << K << "x" << N;
      EXPECT_TRUE(SameBits(y, InvariantAffinePortable(x, w, b, relu))) << K << "x" << N;
      for (int64_t rows : {1, 2, 3, 5, 17, 64}) {
        SetKernelThreads(rows % 2 == 0 ? 2 : 1);
        const at::Tensor part = InvariantAffine(x.narrow(0, 70 - rows, rows), w, b, relu);
        EXPECT_TRUE(SameBits(part, y.narrow(0, 70 - rows, rows))) << rows << " rows";
      }
      SetKernelThreads(threads);
    }
    // No bias; a strided x (a transposed view) is read as its values.
    EXPECT_TRUE(SameBits(InvariantAffine(x.t().contiguous().t(), w, at::Tensor(), false),
                         InvariantAffine(x, w, at::Tensor(), false)));
  }
  EXPECT_THROW(InvariantAffine(at::randn({2, 3}), at::randn({4, 5}), at::Tensor(), false),
               std::exception);
}

// Attention against ATen's softmax(q·kᵀ + bias)·v in double, and the bits of a batch row's query
// alone against the same query in a longer, padded batch (its extra keys masked).
TEST(InvariantAttention, MatchesAtenAndAPaddedBatchGivesARowItsBits) {
  at::manual_seed(2);
  const float lowest = std::numeric_limits<float>::lowest();
  for (int64_t H : {32, 20}) {
    const int64_t T = 11, N = 3;
    const at::Tensor q = at::randn({1, T, N, H}), k = at::randn({1, T, N, H}), v = at::randn({1, T, N, H});
    const at::Tensor causal = at::zeros({1, 1, T, T}).masked_fill(at::ones({T, T}).triu(1) > 0, lowest);
    const auto [out, probs] = InvariantAttention(q, k, v, causal);
    const at::Tensor logits = at::einsum("btnh,bsnh->bnts", {q.to(at::kDouble), k.to(at::kDouble)}) +
                              causal.to(at::kDouble);
    const at::Tensor p = at::softmax(logits, -1);
    const at::Tensor want = at::einsum("bnts,bsnh->btnh", {p, v.to(at::kDouble)});
    EXPECT_LE((probs.to(at::kDouble) - p).abs().max().item<double>(), 1e-6);
    EXPECT_LE((out.to(at::kDouble) - want).abs().max().item<double>(), 1e-5);
    // The same sequence as row 1 of a batch of 3, padded to 29 positions.
    const int64_t L = 29;
    at::Tensor qb = at::randn({3, L, N, H}), kb = at::randn({3, L, N, H}), vb = at::randn({3, L, N, H});
    qb[1].narrow(0, 0, T).copy_(q[0]);
    kb[1].narrow(0, 0, T).copy_(k[0]);
    vb[1].narrow(0, 0, T).copy_(v[0]);
    at::Tensor pad = at::zeros({3, 1, 1, L});
    pad[1].narrow(-1, T, L - T).fill_(1);
    const at::Tensor mask = (pad > 0.5) | (at::ones({L, L}).triu(1) > 0).view({1, 1, L, L});
    const at::Tensor bias = at::zeros(mask.sizes()).masked_fill(mask, lowest);
    const auto [outb, probsb] = InvariantAttention(qb, kb, vb, bias);
    EXPECT_TRUE(SameBits(outb[1].narrow(0, 0, T), out[0])) << "H " << H;
    EXPECT_TRUE(SameBits(probsb[1].narrow(1, 0, T).narrow(2, 0, T), probs[0])) << "H " << H;
    // A [B, T, N, H] view of a fused projection (strided rows) reads the same values.
    const at::Tensor fused = at::stack({q, k, v}, 2);  // [1, T, 3, N, H]
    EXPECT_TRUE(SameBits(InvariantAttention(fused.select(2, 0), fused.select(2, 1),
                                            fused.select(2, 2), causal).first, out));
  }
}

// Short inputs without autograd take the row kernel where it measured faster than BLAS
// (RowKernelsFor; each way pinned here, then measured); longer ones, ATen's GEMM. (A
// batch-invariant plan takes it always: ComputePlan tests.)
TEST(RowKernels, TakenForShortInputsWhereTheyMeasuredFaster) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({9, 16}), w = at::randn({16, 8}), b = at::randn({8});
  at::NoGradGuard no_grad;
  const KernelMode saved = GetKernelMode(KernelChoice::kRowKernel);
  SetKernelMode(KernelChoice::kRowKernel, KernelMode::kNative);
  EXPECT_EQ(RowKernelsFor(kRowKernelMaxRows, 16, 8), !KernelsForcedToReference());
  EXPECT_FALSE(RowKernelsFor(kRowKernelMaxRows + 1, 16, 8));
  if (!KernelsForcedToReference()) {
    EXPECT_TRUE(SameBits(Affine(x, w, b), InvariantAffine(x, w, b, false)));
  }
  if (HasSgemm()) {
    SetKernelMode(KernelChoice::kRowKernel, KernelMode::kAten);
    EXPECT_FALSE(RowKernelsFor(9, 16, 8));
    EXPECT_TRUE(SameBits(Affine(x, w, b), at::addmm(b, x, w)));
    SetKernelMode(KernelChoice::kRowKernel, KernelMode::kMeasure);
    const bool row = RowKernelsFor(9, 16, 8, /*transposed=*/true);
    bool found = false;
    for (const KernelDecision& d : KernelDecisions()) {
      if (d.op != "fp32_row_affine" || d.shape != "16x16x8 wT") continue;
      found = true;
      EXPECT_TRUE(d.measured) << d.Describe();  // timed at 16 rows, the power of two over 9
      EXPECT_EQ(d.native, row && !KernelsForcedToReference()) << d.Describe();
    }
    EXPECT_EQ(found, !KernelsForcedToReference());
  }
  SetKernelMode(KernelChoice::kRowKernel, saved);
  const at::Tensor tall = at::randn({kRowKernelMaxRows + 1, 16});
  EXPECT_TRUE(at::allclose(Affine(tall, w, b), at::addmm(b, tall, w), 1e-5, 1e-5));
}

}  // namespace
}  // namespace glossa
