// x·w (+ b) for the layers' projections: at::addmm / at::mm, except for bfloat16 operands where
// this machine runs them faster as float32 GEMMs of the (exactly widened) bf16 values, split over
// ATen's threads and rounded to bf16 once (the "native" path). Which is faster is measured, per
// shape, the first time a process meets it (glossa/kernels/kernel_choice.h; --bf16_kernels pins
// it): oneDNN's bf16 GEMMs reached 0.7× OpenBLAS's fp32 on a Xeon without AMX and 1.9× on a
// Zen 4 (bench/README.md). The arithmetic is the same: bf16 × bf16 products are exact in float32
// and both accumulate in float32; only the order of the sums differs. The backward pass
// (dx = g·wᵀ, dw = xᵀ·g, db = Σ g) runs on the same path as the forward.
//
// Float32 is ATen's addmm, with ATen's calls. In training with several kernel threads (the fp32
// layout) its GEMMs may run single-threaded on them, as row parts, and on two threads the
// backward's dx and dw side by side (gemm.cc: Fp32AffineFunction), with the bits ATen gives with
// one OpenBLAS thread, where that measured faster than OpenBLAS's own threads (SplitGemmsFor;
// --gemm_split pins it). `relu` applies max(0, ·) to the result in place, on the kernel threads,
// and its backward masks the gradient in one pass (ATen's relu and threshold_backward).
//
// Without autograd, short float32 inputs (a decoding step, a short sentence) where the row kernel
// measured faster than BLAS take InvariantAffine instead (glossa/kernels/batch_invariant.h:
// RowKernelsFor): it reads the weights in place, where BLAS packs the whole weight matrix on every
// call. A loaded model's inference plan (compute_plan.h) runs its prepared weights through
// ComputePlan::Affine instead: int8, or batch-invariant, as the plan says.
//
//   at::Tensor y = Affine(x2d, w, b);  // x [M, K], w [K, N], b [N] or undefined
//   at::Tensor h = Affine(x2d, w, b, /*relu=*/true);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace glossa {

// With `float_out`, the result in float32: for bf16 operands the bf16-rounded values (what
// .to(kFloat) of the bf16 result gives, and its gradient rounded to bf16 as that cast's backward
// rounds it), one pass fewer each way where the caller wants float32 anyway (the logits).
at::Tensor Affine(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                  bool relu = false, bool float_out = false);

// Row-major C [m, n] = op(A) [m, k] · op(B) [k, n] (+ C when beta is 1) through BLAS sgemm,
// with row strides lda, ldb, ldc (operands may be strided views). Needs HasSgemm().
void RowMajorSgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Whether a BLAS sgemm is linked (OpenBLAS).
bool HasSgemm();

// Conversions Affine and the attention core use: `t` as contiguous float32 (bf16 widened
// exactly), and float32 `t` in `dtype` (bf16 rounded to nearest even as ATen's .to() rounds, NaN to
// a quiet NaN); one AVX-512 pass where the CPU has it, ATen's .to() otherwise. No autograd.
at::Tensor Widen(const at::Tensor& t);
at::Tensor Narrow(const at::Tensor& t, at::ScalarType dtype);

// Whether Affine runs bf16 operands x [m, k] · w [k, n] on the native path (float32 sgemms of the
// widened values) on this machine: measured once per shape class (kernel_choice.h), `training`
// when the backward runs too. False without a BLAS sgemm.
bool Bf16AffineRunsNative(int64_t m, int64_t k, int64_t n, bool training);
// Whether a training float32 projection with weight [k, n] runs its GEMMs as row parts on the
// kernel threads rather than on OpenBLAS's threads: measured once per weight shape at 1,024 rows
// (KernelChoice::kGemmSplit). False with one kernel thread, without a BLAS sgemm, or where 1,024
// rows make a GEMM too small to split.
bool SplitGemmsFor(int64_t k, int64_t n);
// The native bf16 path itself, whatever the choice (tests hold it against ATen's and float64).
at::Tensor Bf16AffineNative(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            bool relu = false, bool float_out = false);

}  // namespace glossa
