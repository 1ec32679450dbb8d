#include "glossa/kernels/fused_xent.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
#include "glossa/kernels/bf16_simd.h"
#include "glossa/kernels/simd_math.h"
#endif

namespace glossa {
namespace {

template <typename T>  // float, or uint16_t: bf16 logits, widened exactly as they are read
struct RowsForwardArgs {
  const T* x;
  const float* bias;  // [C], added to every row (zeros when the caller has none)
  const int64_t* labels;
  int64_t classes;
  float a, b;  // label and uniform weights
  float *xent, *label_lp, *max_lp, *lse;
  int64_t* argmax;  // null unless asked for
};

#if GLOSSA_X86_SIMD

using simd_math::Exp16;
using simd_math::TailMask;

#define GLOSSA_XENT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

// 16 logits from column c of a float32 or bf16 row; the first lanes of `tail` (0 elsewhere).
GLOSSA_XENT_TARGET inline __m512 Row16(const float* r, int64_t c) { return _mm512_loadu_ps(r + c); }
GLOSSA_XENT_TARGET inline __m512 Row16(const uint16_t* r, int64_t c) {
  return bf16_simd::Load(r + c, static_cast<__mmask16>(0xffff));
}
GLOSSA_XENT_TARGET inline __m512 RowTail(const float* r, __mmask16 tail) {
  return _mm512_maskz_loadu_ps(tail, r);
}
GLOSSA_XENT_TARGET inline __m512 RowTail(const uint16_t* r, __mmask16 tail) {
  return bf16_simd::Load(r, tail);
}
inline float RowAt(const float* r, int64_t i) { return r[i]; }
inline float RowAt(const uint16_t* r, int64_t i) {
  const uint32_t bits = static_cast<uint32_t>(r[i]) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// The gradient's 16 values to column c, as float32 or rounded to bf16.
GLOSSA_XENT_TARGET inline void Store16(float* out, int64_t c, __m512 d, __mmask16 m) {
  _mm512_mask_storeu_ps(out + c, m, d);
}
GLOSSA_XENT_TARGET inline void Store16(uint16_t* out, int64_t c, __m512 d, __mmask16 m) {
  bf16_simd::Store(out + c, d, m);
}

// 16 logits x + bias from column c; and the row's last C − full of them, `fill` elsewhere.
template <typename T>
GLOSSA_XENT_TARGET inline __m512 Z(const T* r, const float* bias, int64_t c) {
  return _mm512_add_ps(Row16(r, c), _mm512_loadu_ps(bias + c));
}
template <typename T>
GLOSSA_XENT_TARGET inline __m512 ZTail(const T* r, const float* bias, int64_t full,
                                       __mmask16 tail, __m512 fill) {
  return _mm512_mask_add_ps(fill, tail, RowTail(r + full, tail),
                            _mm512_maskz_loadu_ps(tail, bias + full));
}


// Per row (logits z = x + bias): pass 1 the max and Σz, pass 2 Σ e^(z − max); then the
// log-sum-exp and the outputs; the argmax (first maximal class) by a third scan that stops at the
// max. A row is at most a few KiB and stays in L1 between the passes.
template <typename T>
GLOSSA_XENT_TARGET void RowsForward(const RowsForwardArgs<T>& s, int64_t lo, int64_t hi) {
  const int64_t C = s.classes;
  const int64_t full = C / 16 * 16;
  const __mmask16 tail = TailMask(C - full);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const float* bias = s.bias;
  for (int64_t n = lo; n < hi; ++n) {
    const T* r = s.x + n * C;
    __m512 vmax = neg_inf, vsum = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 v = Z(r, bias, c);
      vmax = _mm512_max_ps(vmax, v);
      vsum = _mm512_add_ps(vsum, v);
    }
    if (tail) {
      vmax = _mm512_max_ps(vmax, ZTail(r, bias, full, tail, neg_inf));
      vsum = _mm512_add_ps(vsum, ZTail(r, bias, full, tail, _mm512_setzero_ps()));
    }
    const float m = _mm512_reduce_max_ps(vmax);
    const __m512 vm = _mm512_set1_ps(m);
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= full; c += 32) {
      s0 = _mm512_add_ps(s0, Exp16(_mm512_sub_ps(Z(r, bias, c), vm)));
      s1 = _mm512_add_ps(s1, Exp16(_mm512_sub_ps(Z(r, bias, c + 16), vm)));
    }
    for (; c < full; c += 16) s0 = _mm512_add_ps(s0, Exp16(_mm512_sub_ps(Z(r, bias, c), vm)));
    if (tail) {
      const __m512 e = Exp16(_mm512_sub_ps(ZTail(r, bias, full, tail, _mm512_setzero_ps()), vm));
      s1 = _mm512_add_ps(s1, _mm512_maskz_mov_ps(tail, e));
    }
    const float lse = m + std::log(_mm512_reduce_add_ps(_mm512_add_ps(s0, s1)));
    const int64_t y = s.labels[n];
    const float label_lp = (RowAt(r, y) + bias[y]) - lse;
    float xent = -s.a * label_lp;
    if (s.b != 0.0f) {
      // Σ_c log p_c = Σ_c z_c − C·lse.
      const double sum_lp = static_cast<double>(_mm512_reduce_add_ps(vsum)) -
                            static_cast<double>(C) * static_cast<double>(lse);
      xent -= static_cast<float>(s.b * sum_lp);
    }
    s.xent[n] = xent;
    s.label_lp[n] = label_lp;
    s.max_lp[n] = m - lse;
    s.lse[n] = lse;
    if (s.argmax) {
      int64_t at = 0;
      for (int64_t k = 0; k < C; k += 16) {
        const __m512 v = k < full ? Z(r, bias, k) : ZTail(r, bias, full, tail, neg_inf);
        const __mmask16 eq = _mm512_cmp_ps_mask(v, vm, _CMP_EQ_OQ);
        if (eq) {
          at = k + __builtin_ctz(eq);
          break;
        }
      }
      s.argmax[n] = at;
    }
  }
}

// grad[n, c] = g_n · ((a + b·C) · e^(z − lse) − b) − g_n · a · [c = label], z = x + bias, in
// x's dtype (bf16: rounded once, as a float32 gradient cast to bf16 is); with `colsum`,
// Σ_n grad[n, :] (float32) is added to it (the bias gradient) in the same pass.
template <typename T>
GLOSSA_XENT_TARGET void RowsBackward(const T* x, const float* bias, const int64_t* labels,
                                     const float* lse, const float* g, int64_t C, float a, float b,
                                     T* grad, float* colsum, int64_t lo, int64_t hi) {
  const int64_t full = C / 16 * 16;
  const __mmask16 tail = TailMask(C - full);
  for (int64_t n = lo; n < hi; ++n) {
    const T* r = x + n * C;
    T* out = grad + n * C;
    const float gn = g[n];
    const int64_t y = labels[n];
    const __m512 vl = _mm512_set1_ps(lse[n]);
    const __m512 scale = _mm512_set1_ps(gn * (a + b * static_cast<float>(C)));
    const __m512 off = _mm512_set1_ps(gn * b);
    const __m512 label_term = _mm512_set1_ps(gn * a);
    // The label's lane of the chunk from column c, if it is there.
    auto label_lane = [y](int64_t c) -> __mmask16 {
      return y >= c && y < c + 16 ? static_cast<__mmask16>(1u << (y - c)) : 0;
    };
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 zc = Z(r, bias, c);
      const __m512 d = _mm512_fmsub_ps(scale, Exp16(_mm512_sub_ps(zc, vl)), off);
      Store16(out, c, _mm512_mask_sub_ps(d, label_lane(c), d, label_term),
              static_cast<__mmask16>(0xffff));
      if (colsum) _mm512_storeu_ps(colsum + c, _mm512_add_ps(_mm512_loadu_ps(colsum + c), d));
    }
    if (tail) {
      const __m512 zc = ZTail(r, bias, full, tail, _mm512_setzero_ps());
      const __m512 d = _mm512_fmsub_ps(scale, Exp16(_mm512_sub_ps(zc, vl)), off);
      Store16(out, full, _mm512_mask_sub_ps(d, label_lane(full), d, label_term), tail);
      if (colsum) {
        _mm512_mask_storeu_ps(colsum + full, tail,
                              _mm512_add_ps(_mm512_maskz_loadu_ps(tail, colsum + full), d));
      }
    }
    if (colsum) colsum[y] -= gn * a;
  }
}
#else  // no x86 SIMD in this build: FusedSoftmaxXentSupported() is false, never called

template <typename T>
void RowsForward(const RowsForwardArgs<T>&, int64_t, int64_t) {
  NoSimdInThisBuild();
}
template <typename T>
void RowsBackward(const T*, const float*, const int64_t*, const float*, const float*, int64_t,
                  float, float, T*, float*, int64_t, int64_t) {
  NoSimdInThisBuild();
}

#endif  // GLOSSA_X86_SIMD

// Row ranges for the threads: each range's bias-gradient partial sums go to its own row of a
// [ranges, C] buffer, summed afterwards.
int64_t Ranges(int64_t rows) {
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
}

// Rows per parallel task: about 32k logits.
int64_t Grain(int64_t classes) { return ParallelGrain(8 * classes); }

class FusedXentFunction : public torch::autograd::Function<FusedXentFunction> {
 public:
  // x [N, C] float32 or bf16 contiguous (its gradient in its dtype), labels [N] int64 contiguous, bias [C] float32 contiguous or
  // empty (no bias: its gradient is undefined).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& labels,
                                                const at::Tensor& bias, double a, double b,
                                                bool want_argmax) {
    RECORD_USER_SCOPE("fwd:FusedXent");  // seen by --profile_ops
    const int64_t N = x.size(0), C = x.size(1);
    const auto f32 = x.options().dtype(at::kFloat);
    const bool has_bias = bias.numel() > 0;
    const at::Tensor bias_or_zeros = has_bias ? bias : at::zeros({C}, f32);
    at::Tensor xent = at::empty({N}, f32), label_lp = at::empty({N}, f32),
               max_lp = at::empty({N}, f32), lse = at::empty({N}, f32);
    at::Tensor argmax = at::empty({want_argmax ? N : 0}, labels.options());
    auto run = [&](auto* rows) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(rows)>>;
      RowsForwardArgs<T> s{rows,
                           bias_or_zeros.data_ptr<float>(),
                           labels.data_ptr<int64_t>(),
                           C,
                           static_cast<float>(a),
                           static_cast<float>(b),
                           xent.data_ptr<float>(),
                           label_lp.data_ptr<float>(),
                           max_lp.data_ptr<float>(),
                           lse.data_ptr<float>(),
                           want_argmax ? argmax.data_ptr<int64_t>() : nullptr};
      KernelParallelFor(0, N, Grain(C), [&](int64_t lo, int64_t hi) { RowsForward(s, lo, hi); });
    };
    if (x.scalar_type() == at::kBFloat16) {
      run(reinterpret_cast<const uint16_t*>(x.data_ptr()));
    } else {
      run(x.data_ptr<float>());
    }
    ctx->save_for_backward({x, labels, lse, bias_or_zeros});
    ctx->saved_data["a"] = a;
    ctx->saved_data["b"] = b;
    ctx->saved_data["has_bias"] = has_bias;
    ctx->mark_non_differentiable({label_lp, max_lp, argmax});
    return {xent, label_lp, max_lp, argmax};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &labels = saved[1], &lse = saved[2], &bias = saved[3];
    at::Tensor grad, grad_bias;
    if (grads[0].defined()) {
      const at::Tensor g = grads[0].to(at::kFloat).contiguous();
      const int64_t N = x.size(0), C = x.size(1);
      const float a = static_cast<float>(ctx->saved_data["a"].toDouble());
      const float b = static_cast<float>(ctx->saved_data["b"].toDouble());
      const bool has_bias = ctx->saved_data["has_bias"].toBool();
      grad = at::empty_like(x);
      const int64_t ranges = Ranges(N), per = (N + ranges - 1) / ranges;
      at::Tensor partial =
          has_bias ? at::zeros({ranges, C}, x.options().dtype(at::kFloat)) : at::Tensor();
      auto run = [&](auto* rows, auto* out) {
        KernelParallelFor(0, ranges, 1, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) {
            RowsBackward(rows, bias.data_ptr<float>(), labels.data_ptr<int64_t>(),
                         lse.data_ptr<float>(), g.data_ptr<float>(), C, a, b, out,
                         has_bias ? partial.data_ptr<float>() + i * C : nullptr,
                         std::min(N, i * per), std::min(N, (i + 1) * per));
          }
        });
      };
      if (x.scalar_type() == at::kBFloat16) {
        run(reinterpret_cast<const uint16_t*>(x.data_ptr()),
            reinterpret_cast<uint16_t*>(grad.data_ptr()));
      } else {
        run(x.data_ptr<float>(), grad.data_ptr<float>());
      }
      if (has_bias) grad_bias = ranges == 1 ? partial[0] : partial.sum(0);
    }
    return {grad, at::Tensor(), grad_bias, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool FusedSoftmaxXentSupported() { return CpuHasAvx512BwVl(); }

bool FusedSoftmaxXentApplies(const at::Tensor& logits) {
  return FusedSoftmaxXentSupported() && logits.device().is_cpu();
}

SoftmaxXent FusedSoftmaxXent(const at::Tensor& logits, const at::Tensor& labels,
                             double label_weight, double uniform_weight, bool want_argmax,
                             const at::Tensor& bias) {
  TORCH_CHECK(FusedSoftmaxXentApplies(logits), "FusedSoftmaxXent needs AVX-512F and CPU logits");
  TORCH_CHECK(logits.dim() >= 1 && logits.size(-1) > 0, "FusedSoftmaxXent: logits ",
              logits.sizes(), " need a nonempty class dimension");
  const auto batch_shape = logits.sizes().slice(0, logits.dim() - 1);
  TORCH_CHECK(labels.sizes() == batch_shape, "FusedSoftmaxXent: labels ", labels.sizes(),
              " must be shaped ", batch_shape);
  const int64_t C = logits.size(-1);
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == C), "FusedSoftmaxXent: bias ",
              bias.sizes(), " must be [", C, "]");
  // bf16 logits are read as they are (widened exactly in the kernel, their gradient rounded to
  // bf16 once, as a cast to float32 and back would); other dtypes are cast to float32.
  const at::Tensor x =
      (logits.scalar_type() == at::kBFloat16 ? logits : logits.to(at::kFloat))
          .contiguous()
          .view({-1, C});
  const at::Tensor y = labels.to(at::kLong).contiguous().view({-1});
  // The kernel indexes rows by label: an id out of range would read outside them.
  TORCH_CHECK(y.numel() == 0 || (y.min().item<int64_t>() >= 0 && y.max().item<int64_t>() < C),
              "FusedSoftmaxXent: labels must be in [0, ", C, ")");
  const at::Tensor b =
      bias.defined() ? bias.to(at::kFloat).contiguous()
                     : at::empty({0}, x.options().dtype(at::kFloat));
  auto out = FusedXentFunction::apply(x, y, b, label_weight, uniform_weight, want_argmax);
  SoftmaxXent r;
  r.xent = out[0].view(batch_shape);
  r.label_log_prob = out[1].view(batch_shape);
  r.max_log_prob = out[2].view(batch_shape);
  if (want_argmax) r.argmax = out[3].view(batch_shape);
  return r;
}

}  // namespace glossa
