#include "glossa/kernels/small_gemm.h"

#include <algorithm>
#include <cstdint>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/cpu_features.h"

#if GLOSSA_X86_SIMD
// GCC 12's AVX-512 unpack intrinsics pass _mm512_undefined_ps() as their unused merge source.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace glossa {
namespace {

#if GLOSSA_X86_SIMD
// C's MR × (16·NV) tile (its last vector's columns: `last`) from A's MR rows and B's columns,
// summed over all k in registers: per p, NV loads of B's row, MR broadcasts of A, MR·NV FMAs.
template <int MR, int NV>
__attribute__((target("avx512f"))) void Tile(int64_t k, const float* a, int64_t a_row,
                                             int64_t a_col, const float* b, int64_t ldb,
                                             __mmask16 last, bool accumulate, float* c,
                                             int64_t ldc) {
  __m512 s[MR][NV];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      s[r][v] = accumulate ? _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xffff, c + r * ldc + 16 * v)
                           : _mm512_setzero_ps();
    }
  }
  for (int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, bp + 16 * v) : _mm512_loadu_ps(bp + 16 * v);
    }
    const float* ap = a + p * a_col;
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(ap[r * a_row]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) s[r][v] = _mm512_fmadd_ps(x, bv[v], s[r][v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v, v == NV - 1 ? last : 0xffff, s[r][v]);
    }
  }
}

using TileFn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, __mmask16,
                        bool, float*, int64_t);

template <int MR>
constexpr TileFn kRow[4] = {Tile<MR, 1>, Tile<MR, 2>, Tile<MR, 3>, Tile<MR, 4>};
constexpr const TileFn* kTiles[6] = {kRow<1>, kRow<2>, kRow<3>, kRow<4>, kRow<5>, kRow<6>};

// B's panel: 128 rows × 64 floats, 32 KB, in L1 (48 KB on the Xeons and Zen 4/5 we see).
constexpr int64_t kTileRows = 6, kTileCols = 64, kKBlock = 128;

void SmallSgemmAvx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row,
                      int64_t a_col, const float* b, int64_t ldb, bool accumulate, float* c,
                      int64_t ldc) {
  // A panel of B (kKBlock × 64) at a time, reused by every row tile while it is in L1. A later
  // panel of the sum adds to C's stored tile: the same fused multiply-adds in the same order of p,
  // so the same bits as one pass over all of k.
  for (int64_t j0 = 0; j0 < n; j0 += kTileCols) {
    const int64_t cols = std::min(kTileCols, n - j0), nv = (cols + 15) / 16;
    const int64_t left = cols - 16 * (nv - 1);
    const __mmask16 last =
        left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
    for (int64_t p0 = 0; p0 < k || p0 == 0; p0 += kKBlock) {
      const int64_t kk = std::min(kKBlock, k - p0);
      for (int64_t i0 = 0, rows = 0; i0 < m; i0 += rows) {
        // 6 rows a tile; the last 7 to 9 as two tiles of 3 to 5 (32 rows: 6,6,6,6,4,4, not
        // ...,6,2, whose tile loads B's row for two FMAs per vector).
        const int64_t left = m - i0;
        rows = left <= kTileRows ? left : left < 10 ? (left + 1) / 2 : kTileRows;
        kTiles[rows - 1][nv - 1](kk, a + i0 * a_row + p0 * a_col, a_row, a_col,
                                 b + p0 * ldb + j0, ldb, last, accumulate || p0 > 0,
                                 c + i0 * ldc + j0, ldc);
      }
    }
  }
}

// dst's 16 rows (stride ld) = the transpose of src's 16 × 16 block (row stride src_row): 16
// loads, 64 in-register shuffles, 16 stores.
__attribute__((target("avx512f"))) void Transpose16x16(const float* src, int64_t src_row,
                                                       float* dst, int64_t ld) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * src_row);
  // Pairs of rows interleaved, then pairs of pairs: each 128-bit lane holds a 4 × 4 block.
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  // The 4 × 4 blocks moved to their places: 128-bit lanes across groups of four rows.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ld, r[i]);
}
#endif  // GLOSSA_X86_SIMD

}  // namespace

void SmallSgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col,
                const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  if (m < 0 || n < 0 || k < 0) {
    throw InvalidArgumentError(StrCat("SmallSgemm: negative size m=", m, " n=", n, " k=", k));
  }
  if (!CpuHasAvx512F()) {
    throw InternalError("SmallSgemm needs AVX-512F (callers check CpuHasAvx512F())");
  }
#if GLOSSA_X86_SIMD
  if (m == 0 || n == 0) return;
  SmallSgemmAvx512(m, n, k, a, a_row, a_col, b, ldb, accumulate, c, ldc);
#else
  (void)a, (void)a_row, (void)a_col, (void)b, (void)ldb, (void)accumulate, (void)c, (void)ldc;
  NoSimdInThisBuild();
#endif
}

void TransposeRows(int64_t rows, int64_t cols, const float* src, int64_t src_row, float* dst,
                   int64_t ld) {
  int64_t i0 = 0;
#if GLOSSA_X86_SIMD
  if (CpuHasAvx512F()) {
    for (; i0 + 16 <= rows; i0 += 16) {
      int64_t j0 = 0;
      for (; j0 + 16 <= cols; j0 += 16) {
        Transpose16x16(src + i0 * src_row + j0, src_row, dst + j0 * ld + i0, ld);
      }
      for (int64_t j = j0; j < cols; ++j) {
        for (int64_t i = i0; i < i0 + 16; ++i) dst[j * ld + i] = src[i * src_row + j];
      }
    }
  }
#endif
  // The rest (or all, without AVX-512): 16 source rows at a time, in cache while their columns
  // are read.
  for (; i0 < rows; i0 += 16) {
    const int64_t i1 = std::min(rows, i0 + 16);
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t i = i0; i < i1; ++i) dst[j * ld + i] = src[i * src_row + j];
    }
  }
}

void PackRows(int64_t rows, int64_t cols, const float* src, int64_t src_row, float* dst,
              int64_t ld) {
  for (int64_t i = 0; i < rows; ++i) std::copy(src + i * src_row, src + i * src_row + cols, dst + i * ld);
}

void PackScaledRows(int64_t rows, int64_t cols, const float* src, int64_t src_row,
                    const float* scale, float* dst, int64_t ld) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) dst[i * ld + j] = src[i * src_row + j] * scale[j];
  }
}

void ScaleRowsAndDot(int64_t rows, int64_t cols, const float* x, const float* scale,
                     const float* y, int64_t y_row, float* out, int64_t out_row, float* dot) {
  if (dot != nullptr) std::fill(dot, dot + cols, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * cols;
    for (int64_t j = 0; j < cols; ++j) out[i * out_row + j] = xi[j] * scale[j];
    if (dot == nullptr) continue;
    const float* yi = y + i * y_row;
    for (int64_t j = 0; j < cols; ++j) dot[j] += xi[j] * yi[j];
  }
}

}  // namespace glossa
