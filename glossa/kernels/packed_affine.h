// Projections on weights packed once, at load, into panels: what a float32 inference plan
// (glossa/kernels/compute_plan.h) prepares and its projections read.
//
//   const at::Tensor panels = PackPanels(w);              // w [K, N] float32, once
//   at::Tensor y = PackedAffine(x, panels, N, b, relu);    // = InvariantAffine(x, w, b, relu)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace glossa {

// Weights packed into panels for the affine map (what an inference plan prepares at load,
// glossa/kernels/compute_plan.h): w [K, N] float32 -> [ceil(N / 48), K, 48], panel p holding
// columns [48p, 48p + 48) row after row, zero past N. PackedAffine reads them sequentially (a
// tile of 8 rows × 48 columns per panel) and computes each output as InvariantAffine does, the
// same fma chain over increasing k, so its bits equal InvariantAffine's on the unpacked matrix at
// any M, thread count, and on both paths (`portable`: no SIMD). On a 2-core Xeon with AMX the
// packed tile ran at 165-195 GFLOP/s a core where the row kernel reading w in place ran at 75
// (w's rows, a multiple of 512 bytes apart, fall into few L1 sets) and OpenBLAS's sgemm at
// 110-165 (bench/README.md).
constexpr int64_t kPanelCols = 48;
at::Tensor PackPanels(const at::Tensor& w);
// y [m, n] = x [m, k] · w (+ b), relu optional, from w's panels.
at::Tensor PackedAffine(const at::Tensor& x, const at::Tensor& panels, int64_t n,
                        const at::Tensor& b, bool relu, bool portable = false);
void PackedAffineRaw(const float* x, const float* panels, const float* b, float* y, int64_t m,
                     int64_t k, int64_t n, bool relu, bool portable = false);
// bf16 weights (a "bf16" inference plan, glossa/kernels/compute_plan.h): decoding reads every
// weight once a step for a few rows, so its projections are bound by the weights' bytes, and
// bf16 halves them. w [K, N] float32 is rounded to bf16 (as .to(kBFloat16): to nearest, ties to
// even) into panels [ceil(N / 32), K, 32] of 32 columns, each row of a panel interleaved
// (element 2i: column i, 2i + 1: column 16 + i) so that one 64-byte load widens into two vectors
// of 16 columns with a shift and a mask. PackedAffineBf16 computes each output as InvariantAffine
// does on the bf16-rounded matrix (the same fma chain over increasing k in float32, x float32),
// so its bits equal PackedAffine's on PackPanels(w.to(bf16).to(float32)) at any M and thread
// count, and on both paths (`portable`: no SIMD). Needs AVX-512F, not AVX-512 BF16: x stays
// float32. Over more than 8 rows each panel is widened once per chunk into float32 scratch (the
// same bits) rather than in every tile.
constexpr int64_t kBf16PanelCols = 32;
at::Tensor PackPanelsBf16(const at::Tensor& w);
at::Tensor PackedAffineBf16(const at::Tensor& x, const at::Tensor& panels, int64_t n,
                            const at::Tensor& b, bool relu, bool portable = false);
void PackedAffineBf16Raw(const float* x, const uint16_t* panels, const float* b, float* y,
                         int64_t m, int64_t k, int64_t n, bool relu, bool portable = false);
// Whether a plan's float32 projection of x [rows, k] by a packed [k, n] weight takes PackedAffine
// rather than BLAS sgemm when the plan is not batch-invariant (a batch-invariant one always
// does): without autograd, measured per weight shape and power-of-two row count up to
// kPackedMeasuredRows (KernelChoice::kRowKernel, "fp32_packed_affine"; --row_kernels pins it).
constexpr int64_t kPackedMeasuredRows = 512;
bool PackedKernelsFor(int64_t rows, int64_t k, int64_t n);

}  // namespace glossa
