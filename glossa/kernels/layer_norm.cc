#include "glossa/kernels/layer_norm.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
// GCC 12 flags the AVX-512 intrinsics' masked loads as maybe-uninitialized; a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "glossa/kernels/bf16_simd.h"
#endif

namespace glossa {
namespace {

// ---- Layer norm of bf16 or float32 rows in one pass each way ----
//
// For bf16 inputs the layer used to widen x to float32 (a pass and a copy), run ATen's float32
// layer norm, and round its output to bf16 (another pass); and the backward the same in reverse.
// For float32 inputs ATen's layer norm ran on ATen's threads: one thread in the float32 training
// layout (glossa/runtime/cpu_runtime.h), where BLAS has the cores. These kernels read the rows
// (T = uint16_t for bf16, float), normalize in float32 (the same arithmetic: mean, biased
// variance, rsqrt(var + eps), · scale + bias) and write T, on Glossa's kernel threads; the
// backward writes the input gradient in T and the float32 scale and bias gradients, summed over
// fixed blocks of rows in order, so the same on any number of threads. A row's arithmetic does
// not depend on the other rows (batch-invariant).

#if GLOSSA_X86_SIMD

using bf16_simd::FirstLanes;
using bf16_simd::Load;
using bf16_simd::Store;

// The float32 counterparts of bf16_simd's Load and Store.
__attribute__((target("avx512f"))) inline __m512 Load(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
__attribute__((target("avx512f"))) inline void Store(float* p, __m512 x, __mmask16 m) {
  _mm512_mask_storeu_ps(p, m, x);
}

template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void LnForwardRows(
    const T* x, const float* gamma, const float* beta, int64_t D, float eps, T* y,
    float* mean_out, float* rstd_out, int64_t lo, int64_t hi) {
  for (int64_t r = lo; r < hi; ++r) {
    const T* xr = x + r * D;
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < D; c += 16) sum = _mm512_add_ps(sum, Load(xr + c, FirstLanes(D - c)));
    const float mean = _mm512_reduce_add_ps(sum) / static_cast<float>(D);
    const __m512 vm = _mm512_set1_ps(mean);
    __m512 sq = _mm512_setzero_ps();
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 m = FirstLanes(D - c);
      const __m512 d = _mm512_maskz_sub_ps(m, Load(xr + c, m), vm);
      sq = _mm512_fmadd_ps(d, d, sq);
    }
    const float rstd = 1.0f / std::sqrt(_mm512_reduce_add_ps(sq) / static_cast<float>(D) + eps);
    const __m512 vr = _mm512_set1_ps(rstd);
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 m = FirstLanes(D - c);
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(Load(xr + c, m), vm), vr);
      Store(y + r * D + c,
              _mm512_fmadd_ps(xhat, _mm512_maskz_loadu_ps(m, gamma + c),
                              _mm512_maskz_loadu_ps(m, beta + c)),
              m);
    }
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·γ; dγ += dy·x̂ and dβ += dy into this block's
// row of the partial sums.
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void LnBackwardRows(
    const T* x, const T* dy, const float* gamma, const float* mean,
    const float* rstd, int64_t D, T* dx, float* dgamma, float* dbeta, int64_t lo,
    int64_t hi) {
  for (int64_t r = lo; r < hi; ++r) {
    const T *xr = x + r * D, *dyr = dy + r * D;
    const __m512 vm = _mm512_set1_ps(mean[r]), vr = _mm512_set1_ps(rstd[r]);
    __m512 sg = _mm512_setzero_ps(), sgx = _mm512_setzero_ps();
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 m = FirstLanes(D - c);
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(Load(xr + c, m), vm), vr);
      const __m512 d = Load(dyr + c, m);
      const __m512 g = _mm512_mul_ps(d, _mm512_maskz_loadu_ps(m, gamma + c));
      sg = _mm512_add_ps(sg, g);
      sgx = _mm512_fmadd_ps(g, xhat, sgx);
      _mm512_mask_storeu_ps(dgamma + c, m,
                            _mm512_fmadd_ps(d, xhat, _mm512_maskz_loadu_ps(m, dgamma + c)));
      _mm512_mask_storeu_ps(dbeta + c, m, _mm512_add_ps(d, _mm512_maskz_loadu_ps(m, dbeta + c)));
    }
    const __m512 a = _mm512_set1_ps(_mm512_reduce_add_ps(sg) / static_cast<float>(D));
    const __m512 b = _mm512_set1_ps(_mm512_reduce_add_ps(sgx) / static_cast<float>(D));
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 m = FirstLanes(D - c);
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(Load(xr + c, m), vm), vr);
      const __m512 g = _mm512_mul_ps(Load(dyr + c, m), _mm512_maskz_loadu_ps(m, gamma + c));
      Store(dx + r * D + c, _mm512_mul_ps(vr, _mm512_sub_ps(_mm512_sub_ps(g, a),
                                                              _mm512_mul_ps(xhat, b))),
              m);
    }
  }
}

#else  // no x86 SIMD in this build: HasAvx512Bw() is false and these are never called

template <typename T>
void LnForwardRows(const T*, const float*, const float*, int64_t, float, T*, float*, float*,
                   int64_t, int64_t) {
  NoSimdInThisBuild();
}
template <typename T>
void LnBackwardRows(const T*, const T*, const float*, const float*, const float*, int64_t, T*,
                    float*, float*, int64_t, int64_t) {
  NoSimdInThisBuild();
}

#endif  // GLOSSA_X86_SIMD

constexpr int64_t kLnBlock = 64;  // rows per partial sum of dγ, dβ

bool HasAvx512Bw() {
  static const bool has = CpuHasAvx512BwVl();
  return has;
}

// The rows of x as T: bf16's bits, or float32.
template <typename T>
const T* Rows(const at::Tensor& x) {
  return reinterpret_cast<const T*>(x.data_ptr());
}
template <typename T>
T* Rows(at::Tensor& x) {
  return reinterpret_cast<T*>(x.data_ptr());
}

template <typename T>
class NativeLayerNormFunction : public torch::autograd::Function<NativeLayerNormFunction<T>> {
 public:
  // x [M, D] bf16 (T = uint16_t) or float32 (T = float) contiguous; gamma, beta [D] float32
  // contiguous.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& gamma,
                                                const at::Tensor& beta, double eps) {
    RECORD_USER_SCOPE("fwd:NativeLayerNorm");  // seen by --profile_ops
    const int64_t M = x.size(0), D = x.size(1);
    at::Tensor y = at::empty({M, D}, x.options());
    at::Tensor mean = at::empty({M}, gamma.options()), rstd = at::empty({M}, gamma.options());
    const T* xp = Rows<T>(x);
    T* yp = Rows<T>(y);
    const float *gp = gamma.data_ptr<float>(), *bp = beta.data_ptr<float>();
    float *mp = mean.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    KernelParallelFor(0, M, ParallelGrain(4 * D), [&](int64_t lo, int64_t hi) {
      LnForwardRows(xp, gp, bp, D, static_cast<float>(eps), yp, mp, rp, lo, hi);
    });
    ctx->save_for_backward({x, gamma, mean, rstd});
    ctx->set_materialize_grads(false);
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return torch::autograd::variable_list(4);  // one per input
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &gamma = saved[1], &mean = saved[2], &rstd = saved[3];
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    const int64_t M = x.size(0), D = x.size(1), blocks = (M + kLnBlock - 1) / kLnBlock;
    at::Tensor dx = at::empty({M, D}, x.options());
    at::Tensor partial = at::zeros({2, blocks, D}, gamma.options());
    const T* xp = Rows<T>(x);
    const T* dyp = Rows<T>(dy);
    T* dxp = Rows<T>(dx);
    float* pp = partial.data_ptr<float>();
    KernelParallelFor(0, blocks, ParallelGrain(8 * kLnBlock * D), [&](int64_t lo, int64_t hi) {
      for (int64_t blk = lo; blk < hi; ++blk) {
        LnBackwardRows(xp, dyp, gamma.data_ptr<float>(), mean.data_ptr<float>(),
                       rstd.data_ptr<float>(), D, dxp, pp + blk * D, pp + (blocks + blk) * D,
                       blk * kLnBlock, std::min(M, (blk + 1) * kLnBlock));
      }
    });
    // The blocks' partial sums in block order (at::sum's order over dim 1 is fixed, too).
    const at::Tensor sums = partial.sum(1);
    return {dx, sums[0], sums[1], at::Tensor()};
  }
};

}  // namespace

at::Tensor LayerNormLastDim(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& bias,
                            double epsilon) {
  const int64_t d = x.size(-1);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  if ((bf16 || x.scalar_type() == at::kFloat) && x.device().is_cpu() && HasAvx512Bw() &&
      x.numel() > 0) {
    // One pass each way over the rows (NativeLayerNormFunction above).
    const at::Tensor x2 = x.contiguous().view({-1, d});
    const at::Tensor s = scale.to(at::kFloat).contiguous(), b = bias.to(at::kFloat).contiguous();
    return (bf16 ? NativeLayerNormFunction<uint16_t>::apply(x2, s, b, epsilon)
                 : NativeLayerNormFunction<float>::apply(x2, s, b, epsilon))[0]
        .view(x.sizes());
  }
  return LayerNormLastDimReference(x, scale, bias, epsilon);
}

at::Tensor LayerNormLastDimReference(const at::Tensor& x, const at::Tensor& scale,
                                     const at::Tensor& bias, double epsilon) {
  const int64_t d = x.size(-1);
  // bf16/fp16 inputs are normalized in float32 (as autocast does; ATen's reduced-precision
  // kernel is also several times slower on CPU) and cast back.
  if (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) {
    return at::layer_norm(x.to(at::kFloat), {d}, scale.to(at::kFloat), bias.to(at::kFloat),
                          epsilon)
        .to(x.scalar_type());
  }
  return at::layer_norm(x, {d}, scale, bias, epsilon);
}

}  // namespace glossa
