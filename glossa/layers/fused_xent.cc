#include "glossa/layers/fused_xent.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

// GCC 12 reports _mm512_undefined_ps() inside its own AVX-512 intrinsics (reductions, masked
// loads) as maybe-uninitialized; a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <torch/csrc/autograd/custom_function.h>

#include "glossa/runtime/cpu_runtime.h"
#include "glossa/kernels/cpu_features.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace glossa {
namespace {

// e^x for 16 floats: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in two for an exact n·ln2), e^r
// by Cephes' degree-6 expf polynomial, 2^n by scalef. x is clamped below at −104, where e^x
// rounds to 0 in float32 (so −∞ gives 0, not NaN); NaN passes through (max/min return their
// second operand when either is NaN).
__attribute__((target("avx512f"))) inline __m512 Exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

__attribute__((target("avx512f"))) inline __mmask16 TailMask(int64_t left) {
  return static_cast<__mmask16>((1u << left) - 1u);
}

// 16 logits x + bias from column c; and the row's last C − full of them, `fill` elsewhere.
__attribute__((target("avx512f"))) inline __m512 Z(const float* r, const float* bias, int64_t c) {
  return _mm512_add_ps(_mm512_loadu_ps(r + c), _mm512_loadu_ps(bias + c));
}
__attribute__((target("avx512f"))) inline __m512 ZTail(const float* r, const float* bias,
                                                       int64_t full, __mmask16 tail,
                                                       __m512 fill) {
  return _mm512_mask_add_ps(fill, tail, _mm512_maskz_loadu_ps(tail, r + full),
                            _mm512_maskz_loadu_ps(tail, bias + full));
}

struct RowsForwardArgs {
  const float* x;
  const float* bias;  // [C], added to every row (zeros when the caller has none)
  const int64_t* labels;
  int64_t classes;
  float a, b;  // label and uniform weights
  float *xent, *label_lp, *max_lp, *lse;
  int64_t* argmax;  // null unless asked for
};

// Per row (logits z = x + bias): pass 1 the max and Σz, pass 2 Σ e^(z − max); then the
// log-sum-exp and the outputs; the argmax (first maximal class) by a third scan that stops at the
// max. A row is at most a few KiB and stays in L1 between the passes.
__attribute__((target("avx512f"))) void RowsForward(const RowsForwardArgs& s, int64_t lo,
                                                    int64_t hi) {
  const int64_t C = s.classes;
  const int64_t full = C / 16 * 16;
  const __mmask16 tail = TailMask(C - full);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const float* bias = s.bias;
  for (int64_t n = lo; n < hi; ++n) {
    const float* r = s.x + n * C;
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
    const float label_lp = (r[y] + bias[y]) - lse;
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

// grad[n, c] = g_n · ((a + b·C) · e^(z − lse) − b) − g_n · a · [c = label], z = x + bias; with
// `colsum`, Σ_n grad[n, :] is added to it (the bias gradient) in the same pass.
__attribute__((target("avx512f"))) void RowsBackward(const float* x, const float* bias,
                                                     const int64_t* labels, const float* lse,
                                                     const float* g, int64_t C, float a, float b,
                                                     float* grad, float* colsum, int64_t lo,
                                                     int64_t hi) {
  const int64_t full = C / 16 * 16;
  const __mmask16 tail = TailMask(C - full);
  for (int64_t n = lo; n < hi; ++n) {
    const float* r = x + n * C;
    float* out = grad + n * C;
    const float gn = g[n];
    const __m512 vl = _mm512_set1_ps(lse[n]);
    const __m512 scale = _mm512_set1_ps(gn * (a + b * static_cast<float>(C)));
    const __m512 off = _mm512_set1_ps(gn * b);
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 zc = _mm512_add_ps(_mm512_loadu_ps(r + c), _mm512_loadu_ps(bias + c));
      const __m512 d = _mm512_fmsub_ps(scale, Exp16(_mm512_sub_ps(zc, vl)), off);
      _mm512_storeu_ps(out + c, d);
      if (colsum) _mm512_storeu_ps(colsum + c, _mm512_add_ps(_mm512_loadu_ps(colsum + c), d));
    }
    if (tail) {
      const __m512 zc = _mm512_add_ps(_mm512_maskz_loadu_ps(tail, r + full),
                                      _mm512_maskz_loadu_ps(tail, bias + full));
      const __m512 d = _mm512_fmsub_ps(scale, Exp16(_mm512_sub_ps(zc, vl)), off);
      _mm512_mask_storeu_ps(out + full, tail, d);
      if (colsum) {
        _mm512_mask_storeu_ps(colsum + full, tail,
                              _mm512_add_ps(_mm512_maskz_loadu_ps(tail, colsum + full), d));
      }
    }
    out[labels[n]] -= gn * a;
    if (colsum) colsum[labels[n]] -= gn * a;
  }
}

// Row ranges for the threads: each range's bias-gradient partial sums go to its own row of a
// [ranges, C] buffer, summed afterwards.
int64_t Ranges(int64_t rows) {
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
}

// Rows per parallel task: about 32k logits.
int64_t Grain(int64_t classes) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(classes, 1)); }

class FusedXentFunction : public torch::autograd::Function<FusedXentFunction> {
 public:
  // x [N, C] float32 contiguous, labels [N] int64 contiguous, bias [C] float32 contiguous or
  // empty (no bias: its gradient is undefined).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& labels,
                                                const at::Tensor& bias, double a, double b,
                                                bool want_argmax) {
    const int64_t N = x.size(0), C = x.size(1);
    const auto f32 = x.options();
    const bool has_bias = bias.numel() > 0;
    const at::Tensor bias_or_zeros = has_bias ? bias : at::zeros({C}, f32);
    at::Tensor xent = at::empty({N}, f32), label_lp = at::empty({N}, f32),
               max_lp = at::empty({N}, f32), lse = at::empty({N}, f32);
    at::Tensor argmax = at::empty({want_argmax ? N : 0}, labels.options());
    RowsForwardArgs s{x.data_ptr<float>(),
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
      at::Tensor partial = has_bias ? at::zeros({ranges, C}, x.options()) : at::Tensor();
      KernelParallelFor(0, ranges, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          RowsBackward(x.data_ptr<float>(), bias.data_ptr<float>(), labels.data_ptr<int64_t>(),
                       lse.data_ptr<float>(), g.data_ptr<float>(), C, a, b,
                       grad.data_ptr<float>(),
                       has_bias ? partial.data_ptr<float>() + i * C : nullptr,
                       std::min(N, i * per), std::min(N, (i + 1) * per));
        }
      });
      if (has_bias) grad_bias = ranges == 1 ? partial[0] : partial.sum(0);
    }
    return {grad, at::Tensor(), grad_bias, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Row r of x [rows, S] in place: softmax(x_r + bias_r) over its first len(r) entries (the rest
// is masked: it becomes 0 and is not read).
__attribute__((target("avx512f"))) void SoftmaxRows(float* x, int64_t S, int64_t lo, int64_t hi,
                                                    const std::function<const float*(int64_t)>& bias_row,
                                                    const std::function<int64_t(int64_t)>& len_of) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = lo; r < hi; ++r) {
    float* row = x + r * S;
    const int64_t L = len_of(r);
    if (L < S) std::fill(row + L, row + S, 0.0f);
    const int64_t full = L / 16 * 16;
    const __mmask16 tail = TailMask(L - full);
    const float* b = bias_row(r);
    __m512 vmax = neg_inf;
    for (int64_t c = 0; c < full; c += 16) {
      __m512 z = _mm512_loadu_ps(row + c);
      if (b) z = _mm512_add_ps(z, _mm512_loadu_ps(b + c));
      _mm512_storeu_ps(row + c, z);
      vmax = _mm512_max_ps(vmax, z);
    }
    if (tail) {
      __m512 z = _mm512_mask_loadu_ps(neg_inf, tail, row + full);
      if (b) z = _mm512_mask_add_ps(neg_inf, tail, z, _mm512_maskz_loadu_ps(tail, b + full));
      _mm512_mask_storeu_ps(row + full, tail, z);
      vmax = _mm512_max_ps(vmax, z);
    }
    const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(row + c), vm));
      _mm512_storeu_ps(row + c, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (tail) {
      const __m512 e = _mm512_maskz_mov_ps(
          tail, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + full), vm)));
      _mm512_mask_storeu_ps(row + full, tail, e);
      sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t c = 0; c < full; c += 16) {
      _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_loadu_ps(row + c), inv));
    }
    if (tail) {
      _mm512_mask_storeu_ps(row + full, tail,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, row + full), inv));
    }
  }
}

// Row r in place over its first len(r) entries (the rest of dy is not read or written):
// dy_r = y_r ∘ (dy_r − Σ dy_r∘y_r).
__attribute__((target("avx512f"))) void SoftmaxBackwardRows(float* dy, const float* y, int64_t S,
                                                            int64_t lo, int64_t hi,
                                                            const std::function<int64_t(int64_t)>& len_of) {
  for (int64_t r = lo; r < hi; ++r) {
    float* d = dy + r * S;
    const float* p = y + r * S;
    const int64_t L = len_of(r);
    const int64_t full = L / 16 * 16;
    const __mmask16 tail = TailMask(L - full);
    __m512 dot = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) {
      dot = _mm512_fmadd_ps(_mm512_loadu_ps(d + c), _mm512_loadu_ps(p + c), dot);
    }
    if (tail) {
      dot = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, d + full),
                            _mm512_maskz_loadu_ps(tail, p + full), dot);
    }
    const __m512 vd = _mm512_set1_ps(_mm512_reduce_add_ps(dot));
    for (int64_t c = 0; c < full; c += 16) {
      _mm512_storeu_ps(d + c, _mm512_mul_ps(_mm512_loadu_ps(p + c),
                                            _mm512_sub_ps(_mm512_loadu_ps(d + c), vd)));
    }
    if (tail) {
      _mm512_mask_storeu_ps(d + full, tail,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, p + full),
                                          _mm512_sub_ps(_mm512_maskz_loadu_ps(tail, d + full), vd)));
    }
  }
}

}  // namespace

namespace {

// Row r's length in x [B, N, T, S]: S, or with a causal block the end of r's block of queries.
std::function<int64_t(int64_t)> RowLengths(int64_t T, int64_t S, int64_t causal_block) {
  if (causal_block <= 0) return [S](int64_t) { return S; };
  return [=](int64_t r) { return std::min(S, (r % T / causal_block + 1) * causal_block); };
}

}  // namespace

void SoftmaxWithBiasInPlace(at::Tensor& x, const at::Tensor& bias, int64_t causal_block) {
  TORCH_CHECK(FusedSoftmaxXentSupported() && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.dim() == 4,
              "SoftmaxWithBiasInPlace: float32 contiguous [B, N, T, S] on an AVX-512 CPU");
  const int64_t B = x.size(0), N = x.size(1), T = x.size(2), S = x.size(3);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  if (has_bias) {
    TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.dim() == 4 &&
                    (bias.size(0) == B || bias.size(0) == 1) && bias.size(1) == 1 &&
                    (bias.size(2) == T || bias.size(2) == 1) && bias.size(3) == S,
                "SoftmaxWithBiasInPlace: bias ", bias.sizes(), " does not broadcast to ", x.sizes());
  }
  const float* bp = has_bias ? bias.data_ptr<float>() : nullptr;
  const int64_t bb = has_bias && bias.size(0) > 1 ? bias.size(2) * S : 0;
  const int64_t bt = has_bias && bias.size(2) > 1 ? S : 0;
  const std::function<const float*(int64_t)> bias_row = [&](int64_t r) -> const float* {
    if (!bp) return nullptr;
    const int64_t b = r / (N * T), t = r % T;
    return bp + b * bb + t * bt;
  };
  float* xp = x.data_ptr<float>();
  const auto len_of = RowLengths(T, S, causal_block);
  KernelParallelFor(0, B * N * T, 64, [&](int64_t lo, int64_t hi) {
    SoftmaxRows(xp, S, lo, hi, bias_row, len_of);
  });
}

void SoftmaxBackwardInPlace(at::Tensor& dy, const at::Tensor& y, int64_t causal_block) {
  TORCH_CHECK(FusedSoftmaxXentSupported() && dy.scalar_type() == at::kFloat &&
                  y.scalar_type() == at::kFloat && dy.is_contiguous() && y.is_contiguous() &&
                  dy.sizes() == y.sizes() && dy.dim() >= 1,
              "SoftmaxBackwardInPlace: float32 contiguous tensors of one shape on an AVX-512 CPU");
  const int64_t S = dy.size(-1), rows = S > 0 ? dy.numel() / S : 0;
  float* d = dy.data_ptr<float>();
  const float* p = y.data_ptr<float>();
  TORCH_CHECK(causal_block <= 0 || dy.dim() == 4, "SoftmaxBackwardInPlace: a causal block needs [B, N, T, S]");
  const auto len_of = RowLengths(causal_block > 0 ? dy.size(2) : 1, S, causal_block);
  KernelParallelFor(0, rows, 64,
                    [&](int64_t lo, int64_t hi) { SoftmaxBackwardRows(d, p, S, lo, hi, len_of); });
}

bool FusedSoftmaxXentSupported() { return CpuHasAvx512F(); }

SoftmaxXent FusedSoftmaxXent(const at::Tensor& logits, const at::Tensor& labels,
                             double label_weight, double uniform_weight, bool want_argmax,
                             const at::Tensor& bias) {
  TORCH_CHECK(FusedSoftmaxXentSupported(), "FusedSoftmaxXent needs AVX-512F");
  TORCH_CHECK(logits.dim() >= 1 && logits.size(-1) > 0, "FusedSoftmaxXent: logits ",
              logits.sizes(), " need a nonempty class dimension");
  const auto batch_shape = logits.sizes().slice(0, logits.dim() - 1);
  TORCH_CHECK(labels.sizes() == batch_shape, "FusedSoftmaxXent: labels ", labels.sizes(),
              " must be shaped ", batch_shape);
  const int64_t C = logits.size(-1);
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == C), "FusedSoftmaxXent: bias ",
              bias.sizes(), " must be [", C, "]");
  const at::Tensor x = logits.to(at::kFloat).contiguous().view({-1, C});
  const at::Tensor y = labels.to(at::kLong).contiguous().view({-1});
  // The kernel indexes rows by label: an id out of range would read outside them.
  TORCH_CHECK(y.numel() == 0 || (y.min().item<int64_t>() >= 0 && y.max().item<int64_t>() < C),
              "FusedSoftmaxXent: labels must be in [0, ", C, ")");
  const at::Tensor b =
      bias.defined() ? bias.to(at::kFloat).contiguous() : at::empty({0}, x.options());
  auto out = FusedXentFunction::apply(x, y, b, label_weight, uniform_weight, want_argmax);
  SoftmaxXent r;
  r.xent = out[0].view(batch_shape);
  r.label_log_prob = out[1].view(batch_shape);
  r.max_log_prob = out[2].view(batch_shape);
  if (want_argmax) r.argmax = out[3].view(batch_shape);
  return r;
}

}  // namespace glossa
