// Projections on packed panels (glossa/kernels/packed_affine.h): the panel layout, the bits of
// InvariantAffine at any row and thread count, and the measured choice against BLAS.
#include "glossa/kernels/packed_affine.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/batch_invariant.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/kernels/parallel.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// Packed panels: the layout PackPanels writes, and PackedAffine's bits equal InvariantAffine's on
// the unpacked matrix (so a plan's packed projections change no bit of a batch-invariant answer)
// at any row count and thread count, on both paths; against ATen in double.
TEST(PackedAffine, GivesInvariantAffinesBitsFromPanels) {
  at::manual_seed(4);
  const int threads = KernelThreads();
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{128, 512}, {37, 70}, {5, 3}, {1, 48},
                             {64, 49}, {16, 2000}}) {
    const at::Tensor w = at::randn({K, N}), b = at::randn({N});
    const at::Tensor panels = PackPanels(w);
    const int64_t P = (N + kPanelCols - 1) / kPanelCols;
    ASSERT_EQ(panels.sizes(), (at::IntArrayRef{P, K, kPanelCols}));
    for (int64_t p = 0; p < P; ++p) {
      const int64_t cols = std::min(kPanelCols, N - p * kPanelCols);
      EXPECT_TRUE(at::equal(panels[p].narrow(1, 0, cols), w.narrow(1, p * kPanelCols, cols)));
      if (cols < kPanelCols) {
        EXPECT_EQ(panels[p].narrow(1, cols, kPanelCols - cols).abs().sum().item<float>(), 0.0f);
      }
    }
    for (int64_t M : {1, 7, 8, 9, 33}) {
      const at::Tensor x = at::randn({M, K});
      for (bool relu : {false, true}) {
        for (bool bias : {false, true}) {
          const at::Tensor bb = bias ? b : at::Tensor();
          const at::Tensor y = PackedAffine(x, panels, N, bb, relu);
          EXPECT_TRUE(SameBits(y, InvariantAffine(x, w, bb, relu))) << M << "x" << K << "x" << N;
          EXPECT_TRUE(SameBits(y, PackedAffine(x, panels, N, bb, relu, /*portable=*/true)));
          at::Tensor want = x.to(at::kDouble).mm(w.to(at::kDouble));
          if (bias) want = want + b.to(at::kDouble);
          if (relu) want = at::relu(want);
          EXPECT_LE((y.to(at::kDouble) - want).abs().max().item<double>(), 1e-4 * std::sqrt(K));
          SetKernelThreads(M % 2 == 0 ? 1 : 2);
          const at::Tensor last = PackedAffine(x.narrow(0, M - 1, 1), panels, N, bb, relu);
          EXPECT_TRUE(SameBits(last, y.narrow(0, M - 1, 1))) << M << " rows";
          SetKernelThreads(threads);
        }
      }
    }
  }
  EXPECT_EQ(PackedAffine(at::randn({0, 5}), PackPanels(at::randn({5, 3})), 3, at::Tensor(), false)
                .sizes(),
            (at::IntArrayRef{0, 3}));
  // Panels of another shape, or the wrong n, are refused rather than read past.
  EXPECT_THROW(PackedAffine(at::randn({2, 4}), PackPanels(at::randn({5, 3})), 3, at::Tensor(),
                            false),
               InvalidArgumentError);
  EXPECT_THROW(PackedAffine(at::randn({2, 5}), PackPanels(at::randn({5, 3})), 49, at::Tensor(),
                            false),
               InvalidArgumentError);
  EXPECT_THROW(PackPanels(at::randn({2, 3, 4})), InvalidArgumentError);
}

// bf16 panels: the interleaved layout PackPanelsBf16 writes (each weight rounded as .to(bf16)),
// and PackedAffineBf16's bits equal PackedAffine's on the bf16-rounded matrix at any row and
// thread count, on both paths; against ATen in double on that matrix.
TEST(PackedAffineBf16, IsPackedAffineOnTheBf16RoundedMatrix) {
  at::manual_seed(5);
  const int threads = KernelThreads();
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{128, 512}, {37, 70}, {5, 3}, {1, 32},
                             {64, 49}, {16, 2000}, {3, 17}}) {
    at::Tensor w = at::randn({K, N});
    // Ties: 1 + 2^-8 is halfway between two bf16 values and rounds to even (1), 1 + 3·2^-8 up.
    w[0][0] = 1.0f + std::ldexp(1.0f, -8);
    if (N > 1) w[0][1] = 1.0f + 3 * std::ldexp(1.0f, -8);
    const at::Tensor rounded = w.to(at::kBFloat16).to(at::kFloat), b = at::randn({N});
    const at::Tensor panels = PackPanelsBf16(w);
    const int64_t P = (N + kBf16PanelCols - 1) / kBf16PanelCols;
    ASSERT_EQ(panels.sizes(), (at::IntArrayRef{P, K, kBf16PanelCols}));
    ASSERT_EQ(panels.scalar_type(), at::kBFloat16);
    // Column j of panel p: element 2j (j < 16) or 2(j - 16) + 1 of each row; zero past N.
    const at::Tensor unpacked = panels.view({P, K, 16, 2}).permute({1, 0, 3, 2}).reshape({K, -1});
    EXPECT_TRUE(at::equal(unpacked.narrow(1, 0, N).to(at::kFloat), rounded));
    EXPECT_EQ(unpacked.narrow(1, N, P * kBf16PanelCols - N).to(at::kFloat).abs().sum()
                  .item<float>(), 0.0f);
    EXPECT_EQ(rounded[0][0].item<float>(), 1.0f);
    if (N > 1) {
      EXPECT_EQ(rounded[0][1].item<float>(), 1.0f + std::ldexp(1.0f, -6));
    }
    const at::Tensor fp32_panels = PackPanels(rounded);
    for (int64_t M : {1, 4, 8, 9, 33}) {
      const at::Tensor x = at::randn({M, K});
      for (bool relu : {false, true}) {
        for (bool bias : {false, true}) {
          const at::Tensor bb = bias ? b : at::Tensor();
          const at::Tensor y = PackedAffineBf16(x, panels, N, bb, relu);
          EXPECT_TRUE(SameBits(y, PackedAffine(x, fp32_panels, N, bb, relu)))
              << M << "x" << K << "x" << N;
          EXPECT_TRUE(SameBits(y, PackedAffineBf16(x, panels, N, bb, relu, /*portable=*/true)));
          at::Tensor want = x.to(at::kDouble).mm(rounded.to(at::kDouble));
          if (bias) want = want + b.to(at::kDouble);
          if (relu) want = at::relu(want);
          EXPECT_LE((y.to(at::kDouble) - want).abs().max().item<double>(), 1e-4 * std::sqrt(K));
          SetKernelThreads(M % 2 == 0 ? 1 : 3);
          const at::Tensor last = PackedAffineBf16(x.narrow(0, M - 1, 1), panels, N, bb, relu);
          EXPECT_TRUE(SameBits(last, y.narrow(0, M - 1, 1))) << M << " rows";
          EXPECT_TRUE(SameBits(PackedAffineBf16(x, panels, N, bb, relu), y)) << M << " rows";
          SetKernelThreads(threads);
        }
      }
    }
  }
  EXPECT_EQ(PackedAffineBf16(at::randn({0, 5}), PackPanelsBf16(at::randn({5, 3})), 3,
                             at::Tensor(), false)
                .sizes(),
            (at::IntArrayRef{0, 3}));
  // Panels of another shape or dtype, or the wrong n, are refused rather than read past.
  EXPECT_ERROR_CONTAINS(PackedAffineBf16(at::randn({2, 4}), PackPanelsBf16(at::randn({5, 3})), 3,
                                         at::Tensor(), false),
                        InvalidArgumentError, "panels must be PackPanelsBf16 of a [4, 3]");
  EXPECT_THROW(PackedAffineBf16(at::randn({2, 5}), PackPanelsBf16(at::randn({5, 3})), 33,
                                at::Tensor(), false),
               InvalidArgumentError);
  EXPECT_THROW(PackedAffineBf16(at::randn({2, 5}), PackPanels(at::randn({5, 3})), 3, at::Tensor(),
                                false),
               InvalidArgumentError);
  EXPECT_THROW(PackPanelsBf16(at::randn({2, 3}).to(at::kDouble)), InvalidArgumentError);
}

// Whether a plan's projection takes the panels outside batch invariance: pinned by --row_kernels,
// measured otherwise (and never with autograd on, nor under GLOSSA_KERNELS=reference).
TEST(PackedAffine, TakenWhereMeasuredFasterThanBlas) {
  at::NoGradGuard no_grad;
  const KernelMode saved = GetKernelMode(KernelChoice::kRowKernel);
  SetKernelMode(KernelChoice::kRowKernel, KernelMode::kNative);
  EXPECT_EQ(PackedKernelsFor(300, 16, 8), !KernelsForcedToReference());
  if (HasSgemm()) {
    SetKernelMode(KernelChoice::kRowKernel, KernelMode::kAten);
    EXPECT_FALSE(PackedKernelsFor(9, 16, 8));
    SetKernelMode(KernelChoice::kRowKernel, KernelMode::kMeasure);
    const bool packed = PackedKernelsFor(1000, 16, 24);
    bool found = false;
    for (const KernelDecision& d : KernelDecisions()) {
      if (d.op != "fp32_packed_affine" || d.shape != StrCat(kPackedMeasuredRows, "x16x24")) continue;
      found = true;
      EXPECT_TRUE(d.measured) << d.Describe();  // longer inputs take the largest bucket's
      EXPECT_EQ(d.native, packed) << d.Describe();
    }
    EXPECT_EQ(found, !KernelsForcedToReference());
  }
  SetKernelMode(KernelChoice::kRowKernel, saved);
  {
    at::AutoGradMode grad(true);
    EXPECT_FALSE(PackedKernelsFor(9, 16, 8));
  }
}

}  // namespace
}  // namespace glossa
