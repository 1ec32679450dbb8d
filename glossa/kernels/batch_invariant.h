// Batch-invariant inference kernels: the same request gives the same bits whether it runs alone or
// inside any batch, at any thread count (glossa serve's default; docs/inference.md).
//
// BLAS libraries pick their kernels, blockings and thread splits from the whole matrix's shape, so
// a row's result can change with the rows beside it (OpenBLAS's Haswell sgemm computes the rows of
// a partial tile with other instructions) and with the padded length (the q·kᵀ of a longer batch
// goes through another code path). These kernels fix each output element's arithmetic instead:
//
//  - InvariantAffine: y[i][j] = relu?(fma(x[i][K-1], w[K-1][j], ... fma(x[i][0], w[0][j], 0)) +
//    b[j]): one fused multiply-add chain over k in increasing order, whatever M, the tile, the
//    thread or the SIMD width (vector lanes hold different j, never parts of one sum);
//  - InvariantAttention, per batch row, head and query: logits[s] = fma chain over h of q·k, plus
//    bias; softmax with the maximum (exact in any order), e^x per element, the sum of the row in
//    increasing s one add at a time, and the output as an fma chain over s. Keys past a row's own
//    length are masked (bias = the lowest float), so they add exact zeros: the padded length does
//    not change a row's bits either.
//
// They run where a model's inference plan is batch-invariant (glossa/kernels/compute_plan.h:
// glossa serve's default): its projections and attention core take them, explicitly. The AVX-512
// paths and the portable ones give the same bits for the affine map; for attention, e^x is Exp16
// (simd_math.h) on AVX-512 and std::exp elsewhere. GLOSSA_KERNELS=reference turns them off (ATen's
// kernels are not batch-invariant).
//
//   at::Tensor y = InvariantAffine(x, w, b, /*relu=*/true);
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace glossa {

// Whether Affine (and the fused decoder step's projections) take the row kernel for x [rows, k]
// times a weight [k, n] (`transposed`: stored [n, k]) when the plan does not ask for them: without
// autograd, for at most kRowKernelMaxRows rows, where it measured faster than BLAS sgemm on this
// machine (KernelChoice::kRowKernel in glossa/kernels/kernel_choice.h, once per weight shape and
// power-of-two row count, timed at that count; --row_kernels pins it). Reading the weights in
// place beats BLAS on short inputs, which packs the whole weight matrix on every call (a decoding
// step's logits GEMM at beam 4 spent 22% of its time packing the 256 × 8,000 softmax weight;
// bench/README.md); how short is this machine's to say. (Attention takes InvariantAttention only
// when the plan is batch-invariant: on longer batches ATen's BLAS calls per head were faster.)
constexpr int64_t kRowKernelMaxRows = 256;
bool RowKernelsFor(int64_t rows, int64_t k, int64_t n, bool transposed = false);

// x [M, K], w [K, N] float32 CPU (any strides; copied to contiguous), b [N] or undefined.
at::Tensor InvariantAffine(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                           bool relu);
// The raw form for fused kernels: x [m, k], w [k, n], b [n] or null, y [m, n], all contiguous.
void InvariantAffineRaw(const float* x, const float* w, const float* b, float* y, int64_t m,
                        int64_t k, int64_t n, bool relu);
// With the weights transposed, w [n, k]: y = x·wᵀ (+ b), each output a dot product of two
// contiguous rows (16 lanes of fma chains over k, then a fixed tree); the AVX-512 and portable
// paths (`portable`) give the same bits. What a decoding step's output projections use: their
// weights [D, heads·dim] are the transpose of what InvariantAffine reads.
void InvariantAffineTransposedRaw(const float* x, const float* w, const float* b, float* y,
                                  int64_t m, int64_t k, int64_t n, bool relu);
at::Tensor InvariantAffineTransposed(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                     bool relu, bool portable = false);
// The portable path of InvariantAffine (no SIMD): the same bits.
at::Tensor InvariantAffinePortable(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                   bool relu);

// q [B, T, N, H], k and v [B, S, N, H] float32 CPU, bias float32 [B or 1, 1, T or 1, S] or empty
// (numel 0) -> (out [B, T, N, H], probs [B, N, T, S]).
std::pair<at::Tensor, at::Tensor> InvariantAttention(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const at::Tensor& bias);

}  // namespace glossa
