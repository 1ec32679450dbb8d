// Float32 GEMMs of a few hundred rows and columns on the calling thread, for the native attention
// core's per-head products (q·kᵀ, p·v and their gradients: 64-query blocks by 64-wide heads).
// BLAS sgemm packs both operands on every call and runs its small-matrix kernels on these shapes;
// inside a training step they reached a third of a core's FMA rate (issue 48). This kernel reads A
// in place (either layout, so dSᵀ·q needs no transposed copy), reads B's rows in place (n
// contiguous floats each: the heads of the fused Q/K/V projection), and keeps a 6 × 64 tile of C in
// registers over the whole sum. Each C element is Σₚ a(i, p)·b(p, j) in order of p, one fused
// multiply-add at a time: a row's bits do not depend on how many rows the call has.
//
// Needs AVX-512F (CpuHasAvx512F(), and a build with GLOSSA_X86_SIMD); else it throws.
//
//   // C [m, n] = A [m, k] · B [k, n], all row-major:
//   SmallSgemm(m, n, k, a, /*a_row=*/k, /*a_col=*/1, b, /*ldb=*/n, /*accumulate=*/false, c, n);
//   // C = Aᵀ · B for A stored [k, m]:
//   SmallSgemm(m, n, k, a, /*a_row=*/1, /*a_col=*/m, b, n, false, c, n);
#pragma once

#include <cstdint>

namespace glossa {

// C [m, n] = A·B, or C += A·B with `accumulate`. A's element (i, p) is a[i·a_row + p·a_col]; B's
// row p is the n floats at b + p·ldb; C's row i the n floats at c + i·ldc.
void SmallSgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col,
                const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

// dst [cols, rows] (row stride ld) = the transpose of src's rows [rows, cols] (row stride
// src_row): dst[j·ld + i] = src[i·src_row + j]. To give SmallSgemm a Bᵀ (k's rows for q·kᵀ).
void TransposeRows(int64_t rows, int64_t cols, const float* src, int64_t src_row, float* dst,
                   int64_t ld);

// dst [rows, cols] (row stride ld) = src's rows (row stride src_row): a head's rows packed
// contiguously before SmallSgemm reads them as B, once per head instead of once per tile (rows a
// multiple of 1 KB apart, as the fused projection's heads are, share a few of L1's sets).
void PackRows(int64_t rows, int64_t cols, const float* src, int64_t src_row, float* dst,
              int64_t ld);

// dst [rows, cols] (row stride ld) = src's rows ∘ scale [cols]: a head's queries times the
// attention's query scale, packed (each product rounded once, as ATen's q * scale).
void PackScaledRows(int64_t rows, int64_t cols, const float* src, int64_t src_row,
                    const float* scale, float* dst, int64_t ld);

// out's rows (stride out_row) = x [rows, cols] (contiguous) ∘ scale, and, unless dot is null,
// dot[j] = Σᵢ x[i, j]·y[i, j] in order of i (y's rows: stride y_row): a product's gradient with
// respect to its two factors.
void ScaleRowsAndDot(int64_t rows, int64_t cols, const float* x, const float* scale,
                     const float* y, int64_t y_row, float* out, int64_t out_row, float* dot);

}  // namespace glossa
