#include "glossa/kernels/int8_gemm.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"

#if GLOSSA_X86_SIMD
#include <immintrin.h>
// GCC 12 reports the _mm512_undefined_*() inside the AVX-512 intrinsics as (maybe-)uninitialized;
// a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace glossa {
namespace {

struct Rows {
  int64_t m = 0, k4 = 0;
  std::vector<int8_t> q;    // [m][k4], zero padded
  std::vector<float> scale; // [m]
};

// Row m: s = max|x| / 127, q = round-to-nearest-even(x · (127 / max|x|)), clamped to ±127.
// One implementation for both paths, so their products start from the same integers.
Rows QuantizeRows(const at::Tensor& x, int64_t k4) {
  const at::Tensor xc = x.to(at::kFloat).contiguous();
  Rows r;
  r.m = xc.size(0);
  r.k4 = k4;
  const int64_t k = xc.size(1);
  r.q.assign(r.m * k4, 0);
  r.scale.assign(r.m, 0.0f);
  const float* px = xc.data_ptr<float>();
  for (int64_t i = 0; i < r.m; ++i) {
    const float* row = px + i * k;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t j = 0; j < k; ++j) {
      amax = std::max(amax, std::fabs(row[j]));
      finite = finite && std::isfinite(row[j]);
    }
    if (!finite) {
      throw InvalidArgumentError(
          StrCat("Int8Affine: row ", i, " of the input holds a non-finite value"));
    }
    if (amax == 0.0f) continue;  // a row of zeros: q = 0, s = 0
    r.scale[i] = amax / 127.0f;
    const float inv = 127.0f / amax;
    int8_t* q = r.q.data() + i * k4;
    for (int64_t j = 0; j < k; ++j) {
      const float v = std::nearbyint(row[j] * inv);
      q[j] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, v)));
    }
  }
  return r;
}

void CheckOperands(const at::Tensor& x, const Int8Weight& w, const at::Tensor& b) {
  if (x.dim() != 2 || x.size(1) != w.k) {
    throw InvalidArgumentError(StrCat("Int8Affine: x must be [M, ", w.k, "], got ", x.sizes()));
  }
  if (b.defined() && (b.dim() != 1 || b.size(0) != w.n)) {
    throw InvalidArgumentError(StrCat("Int8Affine: b must be [", w.n, "], got ", b.sizes()));
  }
  if (!x.device().is_cpu() || x.scalar_type() != at::kFloat) {
    throw InvalidArgumentError("Int8Affine: x must be a float32 CPU tensor");
  }
}

// y = relu?(fma(float(acc), s_x · s_w, b)) (or float(acc) · (s_x · s_w) without a bias).
inline float Epilogue(int32_t acc, float sx, float sw, const float* b, int64_t n, bool relu) {
  const float scale = sx * sw;
  float y = b != nullptr ? std::fma(static_cast<float>(acc), scale, b[n])
                         : static_cast<float>(acc) * scale;
  return relu ? std::max(0.0f, y) : y;
}

#if GLOSSA_X86_SIMD
bool ProbeVnni() {
  if (!CpuHasAvx512BwVl()) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
}

struct VnniArgs {
  const uint8_t* xu;  // [m][k4], q_x + 128
  const float* sx;
  const Int8Weight* w;
  const float* b;
  bool relu;
  int64_t m;
  float* y;  // [m][n]
};

// QuantizeRows' integers, as u8 (q + 128), with AVX-512: the same products (x · inv), the same
// rounding (cvtps2dq rounds to nearest even, as nearbyint does) and the same clamp.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void QuantizeRowsU8(const float* x, int64_t m,
                                                                int64_t k, int64_t k4, uint8_t* xu,
                                                                float* scale) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * k;
    uint8_t* out = xu + i * k4;
    __m512 amax = zero, nan_probe = zero;
    int64_t j = 0;
    for (; j < k; j += 16) {
      const __mmask16 mk = j + 16 <= k ? __mmask16(0xFFFF) : __mmask16((1u << (k - j)) - 1u);
      const __m512 v = _mm512_maskz_loadu_ps(mk, row + j);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
      nan_probe = _mm512_add_ps(nan_probe, _mm512_mul_ps(v, zero));  // NaN for an Inf or a NaN
    }
    if (std::isnan(_mm512_reduce_add_ps(nan_probe))) {
      throw InvalidArgumentError(
          StrCat("Int8Affine: row ", i, " of the input holds a non-finite value"));
    }
    const float a = _mm512_reduce_max_ps(amax);
    std::memset(out, 128, k4);
    if (a == 0.0f) {
      scale[i] = 0.0f;
      continue;
    }
    scale[i] = a / 127.0f;
    const __m512 inv = _mm512_set1_ps(127.0f / a);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    const __m512i bias = _mm512_set1_epi32(128);
    for (j = 0; j < k; j += 16) {
      const __mmask16 mk = j + 16 <= k ? __mmask16(0xFFFF) : __mmask16((1u << (k - j)) - 1u);
      const __m512 v = _mm512_maskz_loadu_ps(mk, row + j);
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
      q = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi), bias);
      _mm_mask_storeu_epi8(out + j, mk, _mm512_cvtepi32_epi8(q));
    }
  }
}

// Rows [r0, r0 + MR) × blocks [j0, j0 + NB) of 16 channels.
template <int MR, int NB>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void VnniTile(
    const VnniArgs& a, int64_t r0, int64_t j0) {
  const Int8Weight& w = *a.w;
  const int64_t groups = w.k4 / 4;
  __m512i acc[MR][NB];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_si512();
  const int8_t* wp[NB];
  for (int j = 0; j < NB; ++j) wp[j] = w.packed.data() + (j0 + j) * groups * 64;
  const uint8_t* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.xu + (r0 + r) * w.k4;
  for (int64_t g = 0; g < groups; ++g) {
    __m512i wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(wp[j] + g * 64);
    for (int r = 0; r < MR; ++r) {
      int32_t four;
      std::memcpy(&four, xr[r] + g * 4, 4);
      const __m512i xv = _mm512_set1_epi32(four);
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], xv, wv[j]);
    }
  }
  for (int j = 0; j < NB; ++j) {
    const int64_t n0 = (j0 + j) * 16;
    const int64_t valid = std::min<int64_t>(16, w.n - n0);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
    const __m512i sum128 =
        _mm512_slli_epi32(_mm512_maskz_loadu_epi32(mask, w.sum.data() + n0), 7);
    const __m512 sw = _mm512_maskz_loadu_ps(mask, w.scale.data() + n0);
    const __m512 bias = a.b != nullptr ? _mm512_maskz_loadu_ps(mask, a.b + n0) : _mm512_setzero_ps();
    for (int r = 0; r < MR; ++r) {
      const __m512 accf = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][j], sum128));
      const __m512 scale = _mm512_mul_ps(sw, _mm512_set1_ps(a.sx[r0 + r]));
      __m512 y = a.b != nullptr ? _mm512_fmadd_ps(accf, scale, bias) : _mm512_mul_ps(accf, scale);
      if (a.relu) y = _mm512_max_ps(y, _mm512_setzero_ps());
      _mm512_mask_storeu_ps(a.y + (r0 + r) * w.n + n0, mask, y);
    }
  }
}

template <int NB>
void VnniPanel(const VnniArgs& a, int64_t j0) {
  int64_t r = 0;
  for (; r + 4 <= a.m; r += 4) VnniTile<4, NB>(a, r, j0);
  for (; r < a.m; ++r) VnniTile<1, NB>(a, r, j0);
}

void VnniGemm(const VnniArgs& a) {
  const int64_t blocks = a.w->n16 / 16;
  const int64_t panels = (blocks + 3) / 4;
  // A panel: m × 64 columns × k4 int8 multiply-adds, a half unit each (vpdpbusd does four a lane).
  KernelParallelFor(0, panels, ParallelGrain(a.m * a.w->k4 * 32),
                    [&](int64_t lo, int64_t hi) {
                      for (int64_t p = lo; p < hi; ++p) {
                        const int64_t j0 = p * 4, nb = std::min<int64_t>(4, blocks - j0);
                        if (nb == 4) VnniPanel<4>(a, j0);
                        else if (nb == 3) VnniPanel<3>(a, j0);
                        else if (nb == 2) VnniPanel<2>(a, j0);
                        else VnniPanel<1>(a, j0);
                      }
                    });
}
#endif

}  // namespace

bool Int8HasVnni() {
#if GLOSSA_X86_SIMD
  static const bool has = ProbeVnni();
  return has;
#else
  return false;
#endif
}

std::shared_ptr<const Int8Weight> QuantizeInt8(const at::Tensor& w) {
  if (w.dim() != 2 || !w.is_floating_point() || !w.device().is_cpu()) {
    throw InvalidArgumentError(
        StrCat("QuantizeInt8: the weight must be a floating-point CPU [K, N], got ", w.sizes()));
  }
  // [N, K]: channel-major.
  const at::Tensor wt = w.detach().to(at::kFloat).t().contiguous();
  auto out = std::make_shared<Int8Weight>();
  Int8Weight& q = *out;
  q.n = wt.size(0);
  q.k = wt.size(1);
  q.k4 = (q.k + 3) / 4 * 4;
  q.n16 = (q.n + 15) / 16 * 16;
  q.q.assign(q.n * q.k, 0);
  q.scale.assign(q.n, 0.0f);
  q.sum.assign(q.n, 0);
  const float* pw = wt.data_ptr<float>();
  for (int64_t n = 0; n < q.n; ++n) {
    const float* row = pw + n * q.k;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t k = 0; k < q.k; ++k) {
      amax = std::max(amax, std::fabs(row[k]));
      finite = finite && std::isfinite(row[k]);
    }
    if (!finite) {
      throw InvalidArgumentError(
          StrCat("QuantizeInt8: output channel ", n, " of the weight holds a non-finite value"));
    }
    if (amax == 0.0f) continue;
    const float s = amax / 127.0f;
    q.scale[n] = s;
    int32_t sum = 0;
    for (int64_t k = 0; k < q.k; ++k) {
      const float v = std::min(127.0f, std::max(-127.0f, std::nearbyint(row[k] / s)));
      q.q[n * q.k + k] = static_cast<int8_t>(v);
      sum += static_cast<int32_t>(v);
    }
    q.sum[n] = sum;
  }
  const int64_t groups = q.k4 / 4;
  q.packed.assign(q.n16 * q.k4, 0);
  for (int64_t n = 0; n < q.n; ++n) {
    for (int64_t k = 0; k < q.k; ++k) {
      q.packed[((n / 16) * groups + k / 4) * 64 + (n % 16) * 4 + k % 4] = q.q[n * q.k + k];
    }
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> QuantizeRowsInt8(const at::Tensor& x) {
  const Rows r = QuantizeRows(x, x.size(1));
  at::Tensor q = at::empty({r.m, r.k4}, at::kInt);
  for (int64_t i = 0; i < r.m * r.k4; ++i) q.data_ptr<int32_t>()[i] = r.q[i];
  at::Tensor s = at::empty({r.m}, at::kFloat);
  std::copy(r.scale.begin(), r.scale.end(), s.data_ptr<float>());
  return {q, s};
}

at::Tensor Int8AffinePortable(const at::Tensor& x, const Int8Weight& w, const at::Tensor& b,
                              bool relu) {
  CheckOperands(x, w, b);
  const Rows r = QuantizeRows(x, w.k4);
  const at::Tensor bc = b.defined() ? b.to(at::kFloat).contiguous() : at::Tensor();
  const float* pb = bc.defined() ? bc.data_ptr<float>() : nullptr;
  at::Tensor y = at::empty({r.m, w.n}, x.options().dtype(at::kFloat));
  float* py = y.data_ptr<float>();
  KernelParallelFor(0, r.m, ParallelGrain(r.k4 * w.n), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int8_t* xq = r.q.data() + i * r.k4;
      for (int64_t n = 0; n < w.n; ++n) {
        const int8_t* wq = w.q.data() + n * w.k;
        int32_t acc = 0;
        for (int64_t k = 0; k < w.k; ++k) acc += int32_t{xq[k]} * int32_t{wq[k]};
        py[i * w.n + n] = Epilogue(acc, r.scale[i], w.scale[n], pb, n, relu);
      }
    }
  });
  return y;
}

at::Tensor Int8Affine(const at::Tensor& x, const Int8Weight& w, const at::Tensor& b, bool relu) {
#if GLOSSA_X86_SIMD
  if (Int8HasVnni()) {
    CheckOperands(x, w, b);
    const at::Tensor xc = x.contiguous();
    const int64_t m = xc.size(0);
    std::vector<uint8_t> xu(m * w.k4);
    std::vector<float> sx(m);
    QuantizeRowsU8(xc.data_ptr<float>(), m, w.k, w.k4, xu.data(), sx.data());
    const at::Tensor bc = b.defined() ? b.to(at::kFloat).contiguous() : at::Tensor();
    at::Tensor y = at::empty({m, w.n}, x.options().dtype(at::kFloat));
    if (m == 0 || w.n == 0) return y;
    VnniGemm({xu.data(), sx.data(), &w, bc.defined() ? bc.data_ptr<float>() : nullptr, relu, m,
              y.data_ptr<float>()});
    return y;
  }
#endif
  return Int8AffinePortable(x, w, b, relu);
}

void Int8AffineRaw(const float* x, int64_t m, const Int8Weight& w, const float* b, bool relu,
                   float* y) {
  if (m == 0 || w.n == 0) return;
#if GLOSSA_X86_SIMD
  if (Int8HasVnni()) {
    // per-thread cache: the quantized rows' buffers, reused across calls.
    thread_local std::vector<uint8_t> xu;
    thread_local std::vector<float> sx;  // per-thread cache
    xu.resize(static_cast<size_t>(m * w.k4));
    sx.resize(static_cast<size_t>(m));
    QuantizeRowsU8(x, m, w.k, w.k4, xu.data(), sx.data());
    VnniGemm({xu.data(), sx.data(), &w, b, relu, m, y});
    return;
  }
#endif
  const at::Tensor xt = at::from_blob(const_cast<float*>(x), {m, w.k}, at::kFloat);
  const at::Tensor bt =
      b != nullptr ? at::from_blob(const_cast<float*>(b), {w.n}, at::kFloat) : at::Tensor();
  const at::Tensor out = Int8AffinePortable(xt, w, bt, relu);
  std::memcpy(y, out.data_ptr<float>(), static_cast<size_t>(m * w.n) * sizeof(float));
}

at::Tensor Int8AffineAten(const at::Tensor& x, const Int8Weight& w, const at::Tensor& b,
                          bool relu) {
  auto [qx, sx] = QuantizeRowsInt8(x);
  at::Tensor qw = at::empty({w.n, w.k}, at::kInt);
  for (int64_t i = 0; i < w.n * w.k; ++i) qw.data_ptr<int32_t>()[i] = w.q[i];
  at::Tensor sw = at::empty({w.n}, at::kFloat);
  std::copy(w.scale.begin(), w.scale.end(), sw.data_ptr<float>());
  at::Tensor xd = qx.to(at::kDouble) * sx.to(at::kDouble).unsqueeze(1);
  at::Tensor wd = qw.to(at::kDouble) * sw.to(at::kDouble).unsqueeze(1);
  at::Tensor y = at::matmul(xd, wd.t());
  if (b.defined()) y = y + b.to(at::kDouble);
  return relu ? at::relu(y) : y;
}

}  // namespace glossa
