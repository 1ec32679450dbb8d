#include "glossa/kernels/batch_invariant.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/kernels/kernel_probe.h"
#include "glossa/kernels/packed_affine.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
#include "glossa/kernels/simd_math.h"
#endif

namespace glossa {
namespace {

constexpr int64_t kRows = 8;    // rows of x per tile (16 of AVX-512's 32 registers accumulate)
constexpr int64_t kCols = 32;   // columns of w per tile

inline float Finish(float acc, const float* b, int64_t j, bool relu) {
  const float y = b != nullptr ? acc + b[j] : acc;
  return relu ? (y > 0.0f ? y : 0.0f) : y;
}

// One tile: rows [i0, i0 + rows) and columns [j0, j0 + cols) of y, portable.
void AffineTilePortable(const float* x, const float* w, const float* b, float* y, int64_t K,
                        int64_t N, int64_t i0, int64_t rows, int64_t j0, int64_t cols, bool relu) {
  float acc[kRows][kCols] = {};
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = w + k * N + j0;
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
template <int R>
__attribute__((target("avx512f"))) void AffineTile512(const float* x, const float* w,
                                                      const float* b, float* y, int64_t K,
                                                      int64_t N, int64_t i0, int64_t j0,
                                                      int64_t cols, bool relu) {
  const __mmask16 m0 = cols >= 16 ? 0xFFFF : simd_math::TailMask(cols);
  const __mmask16 m1 = cols >= 32 ? 0xFFFF : cols > 16 ? simd_math::TailMask(cols - 16) : 0;
  __m512 a0[R], a1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
  const float* xr0 = x + i0 * K;
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = w + k * N + j0;
    const __m512 w0 = _mm512_maskz_loadu_ps(m0, wk);
    const __m512 w1 = _mm512_maskz_loadu_ps(m1, wk + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(xr0[r * K + k]);
      a0[r] = _mm512_fmadd_ps(xv, w0, a0[r]);
      a1[r] = _mm512_fmadd_ps(xv, w1, a1[r]);
    }
  }
  const __m512 b0 = b != nullptr ? _mm512_maskz_loadu_ps(m0, b + j0) : _mm512_setzero_ps();
  const __m512 b1 = b != nullptr ? _mm512_maskz_loadu_ps(m1, b + j0 + 16) : _mm512_setzero_ps();
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    // acc + b, as Finish adds it (adding b = 0 when there is none is exact but for -0: keep it out).
    __m512 y0 = b != nullptr ? _mm512_add_ps(a0[r], b0) : a0[r];
    __m512 y1 = b != nullptr ? _mm512_add_ps(a1[r], b1) : a1[r];
    if (relu) {
      y0 = _mm512_max_ps(y0, zero);  // NaN and ±0 give the second operand, +0, as Finish does
      y1 = _mm512_max_ps(y1, zero);
    }
    float* yr = y + (i0 + r) * N + j0;
    _mm512_mask_storeu_ps(yr, m0, y0);
    _mm512_mask_storeu_ps(yr + 16, m1, y1);
  }
}

__attribute__((target("avx512f"))) void AffineTile512Rows(const float* x, const float* w,
                                                          const float* b, float* y, int64_t K,
                                                          int64_t N, int64_t i0, int64_t rows,
                                                          int64_t j0, int64_t cols, bool relu) {
  switch (rows) {
    case 8: AffineTile512<8>(x, w, b, y, K, N, i0, j0, cols, relu); break;
    case 7: AffineTile512<7>(x, w, b, y, K, N, i0, j0, cols, relu); break;
    case 6: AffineTile512<6>(x, w, b, y, K, N, i0, j0, cols, relu); break;
    case 5: AffineTile512<5>(x, w, b, y, K, N, i0, j0, cols, relu); break;
    case 4: AffineTile512<4>(x, w, b, y, K, N, i0, j0, cols, relu); break;
    case 3: AffineTile512<3>(x, w, b, y, K, N, i0, j0, cols, relu); break;
    case 2: AffineTile512<2>(x, w, b, y, K, N, i0, j0, cols, relu); break;
    default: AffineTile512<1>(x, w, b, y, K, N, i0, j0, cols, relu); break;
  }
}
#endif

void AffineRaw(const float* xp, const float* wp, const float* bp, float* yp, int64_t M,
               int64_t K, int64_t N, bool relu, bool simd) {
  (void)simd;  // (a build without GLOSSA_X86_SIMD has only the portable path)
  const int64_t row_blocks = (M + kRows - 1) / kRows, col_blocks = (N + kCols - 1) / kCols;
  // Column panel major: a panel of w (K × 32) stays in L1 across its row blocks. Each element's
  // arithmetic is the same whichever thread computes its tile.
  KernelParallelFor(0, row_blocks * col_blocks, ParallelGrain(K * kRows * kCols), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t cb = t / row_blocks, rb = t % row_blocks;
      const int64_t i0 = rb * kRows, j0 = cb * kCols;
      const int64_t rows = std::min(kRows, M - i0), cols = std::min(kCols, N - j0);
#if GLOSSA_X86_SIMD
      if (simd) {
        AffineTile512Rows(xp, wp, bp, yp, K, N, i0, rows, j0, cols, relu);
        continue;
      }
#endif
      AffineTilePortable(xp, wp, bp, yp, K, N, i0, rows, j0, cols, relu);
    }
  });
}

at::Tensor AffineImpl(const at::Tensor& x_in, const at::Tensor& w_in, const at::Tensor& b_in,
                      bool relu, bool simd) {
  if (x_in.dim() != 2 || w_in.dim() != 2 || x_in.size(1) != w_in.size(0) ||
      x_in.scalar_type() != at::kFloat || w_in.scalar_type() != at::kFloat ||
      (b_in.defined() && (b_in.numel() != w_in.size(1) || b_in.scalar_type() != at::kFloat))) {
    throw InvalidArgumentError(StrCat("InvariantAffine: x [M, K], w [K, N], b [N] float32, got ",
                                      x_in.sizes(), ", ", w_in.sizes(), ", ",
                                      b_in.defined() ? b_in.sizes() : at::IntArrayRef{}));
  }
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const at::Tensor b = b_in.defined() ? b_in.contiguous() : at::Tensor();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(1);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  AffineRaw(x.data_ptr<float>(), w.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr,
            y.data_ptr<float>(), M, K, N, relu, simd);
  return y;
}


// ---- The affine map with transposed weights: y[i][j] = Σ_k x[i][k] · w[j][k] (+ b[j]) ----
//
// Each output is a dot product of two contiguous rows: 16 partial sums (lane l takes k ≡ l mod 16,
// one fma chain each, in increasing k), then the lanes summed in the tree of _mm512_reduce_add_ps
// (Reduce16), so the AVX-512 and the portable paths give the same bits and no row depends on
// another.

inline float Reduce16(const float* l) {
  float t3[8], t6[4];
  for (int i = 0; i < 8; ++i) t3[i] = l[i + 8] + l[i];
  for (int i = 0; i < 4; ++i) t6[i] = t3[i + 4] + t3[i];
  return (t6[2] + t6[0]) + (t6[3] + t6[1]);
}

void DotTilePortable(const float* x, const float* w, const float* b, float* y, int64_t M,
                     int64_t K, int64_t N, int64_t j, bool relu) {
  const float* wj = w + j * K;
  for (int64_t i = 0; i < M; ++i) {
    const float* xi = x + i * K;
    float lanes[16] = {};
    for (int64_t k = 0; k < K; ++k) lanes[k % 16] = std::fma(xi[k], wj[k], lanes[k % 16]);
    y[i * N + j] = Finish(Reduce16(lanes), b, j, relu);
  }
}

#if GLOSSA_X86_SIMD
template <int R>
__attribute__((target("avx512f"))) void DotRows512(const float* x, const float* wj, int64_t K,
                                                  float* out) {
  __m512 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? 0xFFFF : simd_math::TailMask(K - k);
    const __m512 wv = _mm512_maskz_loadu_ps(m, wj + k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + r * K + k), wv, acc[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc[r]);
    out[r] = Reduce16(lanes);
  }
}

__attribute__((target("avx512f"))) void DotTile512(const float* x, const float* w, const float* b,
                                                   float* y, int64_t M, int64_t K, int64_t N,
                                                   int64_t j, bool relu) {
  const float* wj = w + j * K;
  float out[4];
  for (int64_t i = 0; i < M; i += 4) {
    const int64_t r = std::min<int64_t>(4, M - i);
    switch (r) {
      case 4: DotRows512<4>(x + i * K, wj, K, out); break;
      case 3: DotRows512<3>(x + i * K, wj, K, out); break;
      case 2: DotRows512<2>(x + i * K, wj, K, out); break;
      default: DotRows512<1>(x + i * K, wj, K, out); break;
    }
    for (int64_t t = 0; t < r; ++t) y[(i + t) * N + j] = Finish(out[t], b, j, relu);
  }
}
#endif

void AffineTransposedRaw(const float* x, const float* w, const float* b, float* y, int64_t M,
                         int64_t K, int64_t N, bool relu, bool simd) {
  (void)simd;
  KernelParallelFor(0, N, ParallelGrain(M * K), [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
#if GLOSSA_X86_SIMD
      if (simd) {
        DotTile512(x, w, b, y, M, K, N, j, relu);
        continue;
      }
#endif
      DotTilePortable(x, w, b, y, M, K, N, j, relu);
    }
  });
}

// ---- Attention ----

struct AttentionArgs {
  const float *q, *k, *v, *bias;
  int64_t B, T, S, N, H;
  int64_t qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2;  // strides of dims 0-2 (dim 3 is 1)
  int64_t bias_b, bias_t;  // bias rows: 0 when broadcast
  float *out, *probs;

  // Head n of batch row bi's keys transposed into kt [H, ld] (columns past S zero).
  void TransposeKeys(int64_t bi, int64_t n, int64_t ld, std::vector<float>& kt) const {
    kt.assign(static_cast<size_t>(H * ld), 0.0f);
    for (int64_t s = 0; s < S; ++s) {
      const float* kr = k + bi * ks0 + s * ks1 + n * ks2;
      for (int64_t h = 0; h < H; ++h) kt[h * ld + s] = kr[h];
    }
  }
  const float* Query(int64_t bi, int64_t t, int64_t n) const { return q + bi * qs0 + t * qs1 + n * qs2; }
  float* Probs(int64_t bi, int64_t n, int64_t t) const { return probs + ((bi * N + n) * T + t) * S; }
  // The bias row of (bi, t), or null.
  const float* BiasRow(int64_t bi, int64_t t) const {
    if (bias == nullptr) return nullptr;
    return bias + ((bias_b ? bi : 0) * (bias_t ? T : 1) + (bias_t ? t : 0)) * S;
  }
};

// One (batch row, head): every query's probabilities and output. `kt` is scratch [H, S16].
void AttendHeadPortable(const AttentionArgs& a, int64_t bi, int64_t n, std::vector<float>& kt) {
  const int64_t S = a.S, H = a.H;
  a.TransposeKeys(bi, n, S, kt);
  for (int64_t t = 0; t < a.T; ++t) {
    const float* qr = a.Query(bi, t, n);
    float* p = a.Probs(bi, n, t);
    const float* br = a.BiasRow(bi, t);
    for (int64_t s = 0; s < S; ++s) {
      float acc = 0.0f;
      for (int64_t h = 0; h < H; ++h) acc = std::fma(qr[h], kt[h * S + s], acc);
      p[s] = br != nullptr ? acc + br[s] : acc;
    }
    float m = p[0];
    for (int64_t s = 1; s < S; ++s) m = std::max(m, p[s]);
    float sum = 0.0f;
    for (int64_t s = 0; s < S; ++s) {
      p[s] = std::exp(p[s] - m);
      sum += p[s];
    }
    for (int64_t s = 0; s < S; ++s) p[s] = p[s] / sum;
    float* o = a.out + ((bi * a.T + t) * a.N + n) * H;
    for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
    for (int64_t s = 0; s < S; ++s) {
      const float* vr = a.v + bi * a.vs0 + s * a.vs1 + n * a.vs2;
      for (int64_t h = 0; h < H; ++h) o[h] = std::fma(p[s], vr[h], o[h]);
    }
  }
}

#if GLOSSA_X86_SIMD
__attribute__((target("avx512f"))) void AttendHead512(const AttentionArgs& a, int64_t bi,
                                                      int64_t n, std::vector<float>& kt) {
  const int64_t S = a.S, H = a.H, S16 = (S + 15) / 16 * 16;
  a.TransposeKeys(bi, n, S16, kt);
  for (int64_t t = 0; t < a.T; ++t) {
    const float* qr = a.Query(bi, t, n);
    float* p = a.Probs(bi, n, t);
    const float* br = a.BiasRow(bi, t);
    __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = S - c >= 16 ? 0xFFFF : simd_math::TailMask(S - c);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t h = 0; h < H; ++h) {
        acc = _mm512_fmadd_ps(_mm512_set1_ps(qr[h]), _mm512_loadu_ps(kt.data() + h * S16 + c), acc);
      }
      if (br != nullptr) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, br + c));
      _mm512_mask_storeu_ps(p + c, m, acc);
      vmax = _mm512_mask_max_ps(vmax, m, vmax, acc);
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = S - c >= 16 ? 0xFFFF : simd_math::TailMask(S - c);
      _mm512_mask_storeu_ps(p + c, m,
                            simd_math::Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p + c), mx)));
    }
    float sum = 0.0f;
    for (int64_t s = 0; s < S; ++s) sum += p[s];  // in order, one add at a time
    const __m512 vs = _mm512_set1_ps(sum);
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = S - c >= 16 ? 0xFFFF : simd_math::TailMask(S - c);
      _mm512_mask_storeu_ps(p + c, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, p + c), vs));
    }
    float* o = a.out + ((bi * a.T + t) * a.N + n) * H;
    for (int64_t c = 0; c < H; c += 16) {
      const __mmask16 m = H - c >= 16 ? 0xFFFF : simd_math::TailMask(H - c);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t s = 0; s < S; ++s) {
        const float* vr = a.v + bi * a.vs0 + s * a.vs1 + n * a.vs2;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(p[s]), _mm512_maskz_loadu_ps(m, vr + c), acc);
      }
      _mm512_mask_storeu_ps(o + c, m, acc);
    }
  }
}
#endif

}  // namespace


bool RowKernelsFor(int64_t rows, int64_t k, int64_t n, bool transposed) {
  if (rows > kRowKernelMaxRows || rows < 1 || k < 1 || n < 1 || at::GradMode::is_enabled() ||
      KernelsForcedToReference()) {
    return false;
  }
  if (!HasSgemm()) return true;
  int64_t bucket = 1;
  while (bucket < rows) bucket *= 2;
  // A copy of the decisions this thread has asked for (ChooseNative's, which are per process and
  // decided by the mode in the key), read without their lock and string key: a decoding step asks
  // for every projection.
  // per-thread cache: read without a lock.
  static thread_local std::map<std::tuple<int64_t, int64_t, int64_t, bool, KernelMode>, bool> seen;
  const auto key = std::make_tuple(bucket, k, n, transposed, GetKernelMode(KernelChoice::kRowKernel));
  if (const auto it = seen.find(key); it != seen.end()) return it->second;
  const std::string shape = StrCat(bucket, "x", k, "x", n, transposed ? " wT" : "");
  ProbeOperands ops;  // freed after the probe
  const bool row = ChooseNative(KernelChoice::kRowKernel, "fp32_row_affine", shape, [&](bool row_kernel) {
    ops.Make(bucket, k, n, /*pack=*/false);
    for (int64_t r = 0, reps = ops.Reps(); r < reps; ++r) {
      const float* w = ops.w.data() + ops.Next() * k * n;
      if (row_kernel) {
        (transposed ? AffineTransposedRaw : AffineRaw)(ops.x.data(), w, ops.b.data(),
                                                       ops.y.data(), bucket, k, n, false,
                                                       CpuHasAvx512F());
      } else {
        ops.Blas(w, transposed);
      }
    }
  });
  seen.emplace(key, row);
  return row;
}

at::Tensor InvariantAffine(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                           bool relu) {
  return AffineImpl(x, w, b, relu, CpuHasAvx512F());
}

void InvariantAffineRaw(const float* x, const float* w, const float* b, float* y, int64_t m,
                        int64_t k, int64_t n, bool relu) {
  if (m > 0 && n > 0) AffineRaw(x, w, b, y, m, k, n, relu, CpuHasAvx512F());
}

void InvariantAffineTransposedRaw(const float* x, const float* w, const float* b, float* y,
                                  int64_t m, int64_t k, int64_t n, bool relu) {
  if (m > 0 && n > 0) AffineTransposedRaw(x, w, b, y, m, k, n, relu, CpuHasAvx512F());
}

at::Tensor InvariantAffineTransposed(const at::Tensor& x_in, const at::Tensor& w_in,
                                     const at::Tensor& b_in, bool relu, bool portable) {
  if (x_in.dim() != 2 || w_in.dim() != 2 || x_in.size(1) != w_in.size(1) ||
      x_in.scalar_type() != at::kFloat || w_in.scalar_type() != at::kFloat ||
      (b_in.defined() && (b_in.numel() != w_in.size(0) || b_in.scalar_type() != at::kFloat))) {
    throw InvalidArgumentError(StrCat("InvariantAffineTransposed: x [M, K], w [N, K], b [N] "
                                      "float32, got ", x_in.sizes(), ", ", w_in.sizes()));
  }
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const at::Tensor b = b_in.defined() ? b_in.contiguous() : at::Tensor();
  at::Tensor y = at::empty({x.size(0), w.size(0)}, x.options());
  if (y.numel() == 0) return y;
  AffineTransposedRaw(x.data_ptr<float>(), w.data_ptr<float>(),
                      b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>(), x.size(0),
                      x.size(1), w.size(0), relu, !portable && CpuHasAvx512F());
  return y;
}

at::Tensor InvariantAffinePortable(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                   bool relu) {
  return AffineImpl(x, w, b, relu, false);
}

std::pair<at::Tensor, at::Tensor> InvariantAttention(const at::Tensor& q_in, const at::Tensor& k_in,
                                                     const at::Tensor& v_in,
                                                     const at::Tensor& bias_in) {
  auto rows = [](const at::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); };
  const at::Tensor q = rows(q_in), k = rows(k_in), v = rows(v_in);
  if (q.dim() != 4 || k.dim() != 4 || v.sizes() != k.sizes() || q.size(0) != k.size(0) ||
      q.size(2) != k.size(2) || q.size(3) != k.size(3) || q.scalar_type() != at::kFloat ||
      k.scalar_type() != at::kFloat || v.scalar_type() != at::kFloat) {
    throw InvalidArgumentError(StrCat("InvariantAttention: q [B, T, N, H], k and v [B, S, N, H] "
                                      "float32, got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes()));
  }
  AttentionArgs a{};
  a.B = q.size(0), a.T = q.size(1), a.N = q.size(2), a.H = q.size(3), a.S = k.size(1);
  at::Tensor bias;
  if (bias_in.defined() && bias_in.numel() > 0) {
    bias = bias_in.to(at::kFloat).contiguous();
    if (bias.dim() != 4 || bias.size(1) != 1 || bias.size(3) != a.S ||
        (bias.size(0) != 1 && bias.size(0) != a.B) || (bias.size(2) != 1 && bias.size(2) != a.T)) {
      throw InvalidArgumentError(StrCat("InvariantAttention: bias must be [B or 1, 1, T or 1, S], got ",
                                        bias.sizes()));
    }
    a.bias = bias.data_ptr<float>();
    a.bias_b = bias.size(0) != 1;
    a.bias_t = bias.size(2) != 1;
  }
  at::Tensor out = at::empty({a.B, a.T, a.N, a.H}, q.options());
  at::Tensor probs = at::empty({a.B, a.N, a.T, a.S}, q.options());
  if (out.numel() == 0 || a.S == 0) return {out.zero_(), probs};
  a.q = q.data_ptr<float>(), a.k = k.data_ptr<float>(), a.v = v.data_ptr<float>();
  a.qs0 = q.stride(0), a.qs1 = q.stride(1), a.qs2 = q.stride(2);
  a.ks0 = k.stride(0), a.ks1 = k.stride(1), a.ks2 = k.stride(2);
  a.vs0 = v.stride(0), a.vs1 = v.stride(1), a.vs2 = v.stride(2);
  a.out = out.data_ptr<float>(), a.probs = probs.data_ptr<float>();
  const bool simd = CpuHasAvx512F();
  KernelParallelFor(0, a.B * a.N, ParallelGrain(2 * a.T * a.S * a.H), [&](int64_t lo, int64_t hi) {
    std::vector<float> kt;
    for (int64_t i = lo; i < hi; ++i) {
#if GLOSSA_X86_SIMD
      if (simd) {
        AttendHead512(a, i / a.N, i % a.N, kt);
        continue;
      }
#endif
      AttendHeadPortable(a, i / a.N, i % a.N, kt);
    }
  });
  (void)simd;
  return {out, probs};
}

}  // namespace glossa
