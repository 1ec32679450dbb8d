#include "glossa/kernels/packed_affine.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <tuple>
#include <type_traits>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/kernels/kernel_probe.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
#include "glossa/kernels/simd_math.h"
#endif

namespace glossa {
namespace {

constexpr int64_t kRows = 8;  // rows of x per tile (24 of AVX-512's 32 registers accumulate)

// acc + b, then relu: InvariantAffine's epilogue (glossa/kernels/batch_invariant.cc).
inline float Finish(float acc, const float* b, int64_t j, bool relu) {
  const float y = b != nullptr ? acc + b[j] : acc;
  return relu ? (y > 0.0f ? y : 0.0f) : y;
}

// ---- The affine map on packed panels: InvariantAffine's arithmetic on weights laid out for it ----
//
// panels [P, K, kPanelCols]: panel p holds columns [p·48, p·48 + 48) of w, row k after row k − 1,
// zero past N. A tile of 8 rows × 48 columns keeps 24 accumulators and reads its panel
// sequentially. Each output is the same fma chain over increasing k from 0, then + b and relu, as
// AffineRaw computes it, so the bits equal InvariantAffine's at any M, tile or thread.

void PackedTilePortable(const float* x, const float* panel, const float* b, float* y, int64_t K,
                        int64_t N, int64_t i0, int64_t rows, int64_t j0, int64_t cols, bool relu) {
  constexpr int64_t P = kPanelCols;
  float acc[kRows][P] = {};
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = panel + k * P;
    for (int64_t r = 0; r < rows; ++r) {
      const float xr = x[(i0 + r) * K + k];
      for (int64_t c = 0; c < cols; ++c) acc[r][c] = std::fma(xr, wk[c], acc[r][c]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[(i0 + r) * N + j0 + c] = Finish(acc[r][c], b, j0 + c, relu);
  }
}

#if GLOSSA_X86_SIMD
// A tile's end, shared by the float32 and bf16 panels: the R × 16V sums acc[v][r] (+ b, relu, as
// Finish) stored into y's columns [j0, j0 + cols).
template <int R, int V>
__attribute__((target("avx512f"))) inline void StoreTile(__m512 (&acc)[V][R], const float* b,
                                                         float* y, int64_t N, int64_t i0,
                                                         int64_t j0, int64_t cols, bool relu) {
  __mmask16 m[V];
  __m512 bv[V];
  for (int v = 0; v < V; ++v) {
    const int64_t left = cols - 16 * v;
    m[v] = left >= 16 ? __mmask16(0xFFFF) : left > 0 ? simd_math::TailMask(left) : __mmask16(0);
    bv[v] = b != nullptr ? _mm512_maskz_loadu_ps(m[v], b + j0 + 16 * v) : _mm512_setzero_ps();
  }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* yr = y + (i0 + r) * N + j0;
    for (int v = 0; v < V; ++v) {
      __m512 yv = acc[v][r];
      if (b != nullptr) yv = _mm512_add_ps(yv, bv[v]);  // as Finish: no + 0 without b
      if (relu) yv = _mm512_max_ps(yv, zero);
      _mm512_mask_storeu_ps(yr + 16 * v, m[v], yv);
    }
  }
}

// tile(std::integral_constant<int, R>{}) for R = rows, 1 to kRows: the tiles' row count as a
// template argument, so that their accumulators stay in registers.
template <typename Tile>
void ForRows(int64_t rows, const Tile& tile) {
  static_assert(kRows == 8, "one case per row count");
  switch (rows) {
    case 8: tile(std::integral_constant<int, 8>{}); break;
    case 7: tile(std::integral_constant<int, 7>{}); break;
    case 6: tile(std::integral_constant<int, 6>{}); break;
    case 5: tile(std::integral_constant<int, 5>{}); break;
    case 4: tile(std::integral_constant<int, 4>{}); break;
    case 3: tile(std::integral_constant<int, 3>{}); break;
    case 2: tile(std::integral_constant<int, 2>{}); break;
    default: tile(std::integral_constant<int, 1>{}); break;
  }
}

// A tile of R rows by a float32 panel of 16V columns (V = 3: PackPanels' 48; V = 2: a bf16 panel
// widened once for many row blocks).
template <int R, int V>
__attribute__((target("avx512f"))) void PackedTile512(const float* x, const float* panel,
                                                      const float* b, float* y, int64_t K,
                                                      int64_t N, int64_t i0, int64_t j0,
                                                      int64_t cols, bool relu) {
  __m512 acc[V][R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) acc[v][r] = _mm512_setzero_ps();
  }
  const float* xr0 = x + i0 * K;
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = panel + k * 16 * V;
    __m512 w[V];
    for (int v = 0; v < V; ++v) w[v] = _mm512_loadu_ps(wk + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(xr0[r * K + k]);
      for (int v = 0; v < V; ++v) acc[v][r] = _mm512_fmadd_ps(xv, w[v], acc[v][r]);
    }
  }
  StoreTile<R, V>(acc, b, y, N, i0, j0, cols, relu);
}
#endif

// A chunk's own scratch: a bf16 panel widened to float32, and which panel it holds.
struct TileScratch {
  std::vector<float> panel;
  int64_t index = -1;
};

// tile(i0, rows, j0, cols, p, scratch) for every tile of 8 rows of y [M, N] by panel p's
// `panel_cols` columns, on the kernel threads, panel major: a panel (K × panel_cols) stays in
// cache across its row blocks. `scratch` is the chunk's, kept across its tiles.
template <typename Tile>
void ForEachTile(int64_t M, int64_t K, int64_t N, int64_t panel_cols, const Tile& tile) {
  const int64_t row_blocks = (M + kRows - 1) / kRows, col_blocks = (N + panel_cols - 1) / panel_cols;
  KernelParallelFor(0, row_blocks * col_blocks, ParallelGrain(K * kRows * panel_cols),
                    [&](int64_t lo, int64_t hi) {
    TileScratch scratch;
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t cb = t / row_blocks, rb = t % row_blocks;
      const int64_t i0 = rb * kRows, j0 = cb * panel_cols;
      tile(i0, std::min(kRows, M - i0), j0, std::min(panel_cols, N - j0), cb, scratch);
    }
  });
}

void PackedAffineRawImpl(const float* xp, const float* panels, const float* bp, float* yp,
                         int64_t M, int64_t K, int64_t N, bool relu, bool simd) {
  (void)simd;
  static_assert(kPanelCols == 48, "three vectors of 16 columns");
  ForEachTile(M, K, N, kPanelCols, [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                                       int64_t p, TileScratch&) {
    const float* panel = panels + p * K * kPanelCols;
#if GLOSSA_X86_SIMD
    if (simd) {
      ForRows(rows, [&](auto r) {
        PackedTile512<decltype(r)::value, 3>(xp, panel, bp, yp, K, N, i0, j0, cols, relu);
      });
      return;
    }
#endif
    PackedTilePortable(xp, panel, bp, yp, K, N, i0, rows, j0, cols, relu);
  });
}

// ---- The same on bf16 panels: [P, K, 32], each row interleaved (2i: column i, 2i + 1: 16 + i) ----

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

void PackedBf16TilePortable(const float* x, const uint16_t* panel, const float* b, float* y,
                            int64_t K, int64_t N, int64_t i0, int64_t rows, int64_t j0,
                            int64_t cols, bool relu) {
  constexpr int64_t P = kBf16PanelCols;
  float acc[kRows][P] = {};
  for (int64_t k = 0; k < K; ++k) {
    const uint16_t* wk = panel + k * P;
    for (int64_t r = 0; r < rows; ++r) {
      const float xr = x[(i0 + r) * K + k];
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t at = c < 16 ? 2 * c : 2 * (c - 16) + 1;  // the interleaved position
        acc[r][c] = std::fma(xr, Bf16ToFloat(wk[at]), acc[r][c]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[(i0 + r) * N + j0 + c] = Finish(acc[r][c], b, j0 + c, relu);
  }
}

#if GLOSSA_X86_SIMD
template <int R>
__attribute__((target("avx512f"))) void PackedBf16Tile512(const float* x, const uint16_t* panel,
                                                          const float* b, float* y, int64_t K,
                                                          int64_t N, int64_t i0, int64_t j0,
                                                          int64_t cols, bool relu) {
  static_assert(kBf16PanelCols == 32, "two vectors of 16 columns");
  __m512 acc[2][R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
  const float* xr0 = x + i0 * K;
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t k = 0; k < K; ++k) {
    // 32 bf16: the low halves of the 32-bit lanes are columns 0-15, the high halves 16-31.
    const __m512i wk = _mm512_loadu_si512(panel + k * kBf16PanelCols);
    const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(wk, 16));
    const __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(wk, high));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(xr0[r * K + k]);
      acc[0][r] = _mm512_fmadd_ps(xv, w0, acc[0][r]);
      acc[1][r] = _mm512_fmadd_ps(xv, w1, acc[1][r]);
    }
  }
  StoreTile<R, 2>(acc, b, y, N, i0, j0, cols, relu);
}

// A bf16 panel [K, 32] (interleaved) widened exactly into float32 [K, 32] in column order.
__attribute__((target("avx512f"))) void WidenPanel(const uint16_t* panel, int64_t K, float* out) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t k = 0; k < K; ++k) {
    const __m512i wk = _mm512_loadu_si512(panel + k * kBf16PanelCols);
    _mm512_storeu_ps(out + k * kBf16PanelCols, _mm512_castsi512_ps(_mm512_slli_epi32(wk, 16)));
    _mm512_storeu_ps(out + k * kBf16PanelCols + 16, _mm512_castsi512_ps(_mm512_and_si512(wk, high)));
  }
}
#endif

void PackedAffineBf16RawImpl(const float* xp, const uint16_t* panels, const float* bp, float* yp,
                             int64_t M, int64_t K, int64_t N, bool relu, bool simd) {
  (void)simd;
  // Over one block of rows (decoding) each tile widens the weights it reads; over several, a
  // chunk widens each panel once into its scratch and runs the float32 tile on it (the same
  // bits: widening is exact and the sums are the same chains).
  const bool widen_once = M > kRows;
  ForEachTile(M, K, N, kBf16PanelCols, [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                                           int64_t p, TileScratch& scratch) {
    const uint16_t* panel = panels + p * K * kBf16PanelCols;
#if GLOSSA_X86_SIMD
    if (simd && widen_once) {
      if (scratch.index != p) {
        scratch.panel.resize(static_cast<size_t>(K * kBf16PanelCols));
        WidenPanel(panel, K, scratch.panel.data());
        scratch.index = p;
      }
      ForRows(rows, [&](auto r) {
        PackedTile512<decltype(r)::value, 2>(xp, scratch.panel.data(), bp, yp, K, N, i0, j0, cols,
                                             relu);
      });
      return;
    }
    if (simd) {
      ForRows(rows, [&](auto r) {
        PackedBf16Tile512<decltype(r)::value>(xp, panel, bp, yp, K, N, i0, j0, cols, relu);
      });
      return;
    }
#endif
    (void)scratch, (void)widen_once;  // the portable tile reads the bf16 panel itself
    PackedBf16TilePortable(xp, panel, bp, yp, K, N, i0, rows, j0, cols, relu);
  });
}

}  // namespace

at::Tensor PackPanels(const at::Tensor& w_in) {
  if (w_in.dim() != 2 || w_in.scalar_type() != at::kFloat || !w_in.device().is_cpu()) {
    throw InvalidArgumentError(StrCat("PackPanels: w must be a float32 CPU matrix [K, N], got ",
                                      w_in.sizes(), " ", w_in.scalar_type()));
  }
  const int64_t K = w_in.size(0), N = w_in.size(1), P = (N + kPanelCols - 1) / kPanelCols;
  at::Tensor padded = at::zeros({K, P * kPanelCols}, w_in.options());
  padded.narrow(1, 0, N).copy_(w_in);
  // [K, P, 48] -> [P, K, 48]
  return padded.view({K, P, kPanelCols}).permute({1, 0, 2}).contiguous();
}

namespace {

void CheckPanels(const char* what, int64_t m, int64_t k, int64_t n, const at::Tensor& panels) {
  if (panels.dim() != 3 || panels.scalar_type() != at::kFloat || !panels.is_contiguous() ||
      panels.size(1) != k || panels.size(2) != kPanelCols ||
      panels.size(0) != (n + kPanelCols - 1) / kPanelCols || m < 0) {
    throw InvalidArgumentError(StrCat(what, ": panels must be PackPanels of a [", k, ", ", n,
                                      "] float32 matrix, got ", panels.sizes()));
  }
}

}  // namespace

void PackedAffineRaw(const float* x, const float* panels, const float* b, float* y, int64_t m,
                     int64_t k, int64_t n, bool relu, bool portable) {
  if (m > 0 && n > 0) PackedAffineRawImpl(x, panels, b, y, m, k, n, relu, !portable && CpuHasAvx512F());
}

at::Tensor PackedAffine(const at::Tensor& x_in, const at::Tensor& panels, int64_t n,
                        const at::Tensor& b_in, bool relu, bool portable) {
  if (x_in.dim() != 2 || x_in.scalar_type() != at::kFloat ||
      (b_in.defined() && (b_in.numel() != n || b_in.scalar_type() != at::kFloat))) {
    throw InvalidArgumentError(StrCat("PackedAffine: x [M, K] float32 and b [", n,
                                      "] float32, got ", x_in.sizes(), ", ",
                                      b_in.defined() ? b_in.sizes() : at::IntArrayRef{}));
  }
  CheckPanels("PackedAffine", x_in.size(0), x_in.size(1), n, panels);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor b = b_in.defined() ? b_in.contiguous() : at::Tensor();
  at::Tensor y = at::empty({x.size(0), n}, x.options());
  PackedAffineRaw(x.data_ptr<float>(), panels.data_ptr<float>(),
                  b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>(), x.size(0),
                  x.size(1), n, relu, portable);
  return y;
}

at::Tensor PackPanelsBf16(const at::Tensor& w_in) {
  if (w_in.dim() != 2 || w_in.scalar_type() != at::kFloat || !w_in.device().is_cpu()) {
    throw InvalidArgumentError(StrCat("PackPanelsBf16: w must be a float32 CPU matrix [K, N], "
                                      "got ", w_in.sizes(), " ", w_in.scalar_type()));
  }
  const int64_t K = w_in.size(0), N = w_in.size(1),
                P = (N + kBf16PanelCols - 1) / kBf16PanelCols;
  at::Tensor padded = at::zeros({K, P * kBf16PanelCols}, w_in.options().dtype(at::kBFloat16));
  padded.narrow(1, 0, N).copy_(w_in);  // rounded as .to(kBFloat16)
  // [K, P, 2, 16] -> [P, K, 16, 2]: element 2i of a panel row is column i, 2i + 1 column 16 + i.
  return padded.view({K, P, 2, 16}).permute({1, 0, 3, 2}).contiguous().view({P, K, kBf16PanelCols});
}

void PackedAffineBf16Raw(const float* x, const uint16_t* panels, const float* b, float* y,
                         int64_t m, int64_t k, int64_t n, bool relu, bool portable) {
  if (m > 0 && n > 0) {
    PackedAffineBf16RawImpl(x, panels, b, y, m, k, n, relu, !portable && CpuHasAvx512F());
  }
}

at::Tensor PackedAffineBf16(const at::Tensor& x_in, const at::Tensor& panels, int64_t n,
                            const at::Tensor& b_in, bool relu, bool portable) {
  if (x_in.dim() != 2 || x_in.scalar_type() != at::kFloat ||
      (b_in.defined() && (b_in.numel() != n || b_in.scalar_type() != at::kFloat))) {
    throw InvalidArgumentError(StrCat("PackedAffineBf16: x [M, K] float32 and b [", n,
                                      "] float32, got ", x_in.sizes(), ", ",
                                      b_in.defined() ? b_in.sizes() : at::IntArrayRef{}));
  }
  const int64_t k = x_in.size(1);
  if (panels.dim() != 3 || panels.scalar_type() != at::kBFloat16 || !panels.is_contiguous() ||
      panels.size(1) != k || panels.size(2) != kBf16PanelCols ||
      panels.size(0) != (n + kBf16PanelCols - 1) / kBf16PanelCols) {
    throw InvalidArgumentError(StrCat("PackedAffineBf16: panels must be PackPanelsBf16 of a [", k,
                                      ", ", n, "] float32 matrix, got ", panels.sizes(), " ",
                                      panels.scalar_type()));
  }
  const at::Tensor x = x_in.contiguous();
  const at::Tensor b = b_in.defined() ? b_in.contiguous() : at::Tensor();
  at::Tensor y = at::empty({x.size(0), n}, x.options());
  PackedAffineBf16Raw(x.data_ptr<float>(), reinterpret_cast<const uint16_t*>(panels.data_ptr()),
                      b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>(), x.size(0),
                      k, n, relu, portable);
  return y;
}

bool PackedKernelsFor(int64_t rows, int64_t k, int64_t n) {
  if (rows < 1 || k < 1 || n < 1 || at::GradMode::is_enabled() || KernelsForcedToReference()) {
    return false;
  }
  if (!HasSgemm()) return true;
  // One decision per weight shape and power-of-two row count (up to kPackedMeasuredRows; longer
  // inputs take the decision measured there), as RowKernelsFor's.
  int64_t bucket = 1;
  while (bucket < rows && bucket < kPackedMeasuredRows) bucket *= 2;
  // per-thread cache: read without a lock (ChooseNative's decisions, per process, are the truth).
  static thread_local std::map<std::tuple<int64_t, int64_t, int64_t, KernelMode>, bool> seen;
  const auto key = std::make_tuple(bucket, k, n, GetKernelMode(KernelChoice::kRowKernel));
  if (const auto it = seen.find(key); it != seen.end()) return it->second;
  const std::string shape = StrCat(bucket, "x", k, "x", n);
  ProbeOperands ops;  // freed after the probe
  const bool packed = ChooseNative(KernelChoice::kRowKernel, "fp32_packed_affine", shape, [&](bool native) {
    ops.Make(bucket, k, n, /*pack=*/true);
    const int64_t panel_size = (n + kPanelCols - 1) / kPanelCols * k * kPanelCols;
    for (int64_t r = 0, reps = ops.Reps(); r < reps; ++r) {
      const int64_t c = ops.Next();
      if (native) {
        PackedAffineRawImpl(ops.x.data(), ops.panels.data() + c * panel_size, ops.b.data(),
                            ops.y.data(), bucket, k, n, false, CpuHasAvx512F());
      } else {
        ops.Blas(ops.w.data() + c * k * n, false);
      }
    }
  });
  seen.emplace(key, packed);
  return packed;
}

}  // namespace glossa
