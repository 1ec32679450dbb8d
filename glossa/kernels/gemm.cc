#include "glossa/kernels/gemm.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "glossa/base/strings.h"
#include "glossa/kernels/batch_invariant.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
// GCC 12 flags the AVX-512 intrinsics' masked loads as maybe-uninitialized; a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "glossa/kernels/bf16_simd.h"
#endif

namespace glossa {
namespace {

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc) __attribute__((weak));

}  // namespace

void RowMajorSgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // Column-major Cᵀ = op(B)ᵀ · op(A)ᵀ.
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int LDA = static_cast<int>(ldb), LDB = static_cast<int>(lda), LDC = static_cast<int>(ldc);
  const float one = 1.0f;
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  sgemm_(&ta, &tb, &M, &N, &K, &one, b, &LDA, a, &LDB, &beta, c, &LDC);
}

bool HasSgemm() { return sgemm_ != nullptr; }

namespace {

// C [m, n] = op(A)·op(B) (+ C when accumulate) for float32 contiguous operands, split over ATen's
// threads (KernelParallelFor) along C's rows (tall outputs) or columns (wide ones); each part is
// one single-threaded sgemm (the bf16 layout gives OpenBLAS one thread; glossa/runtime/cpu_runtime.h).
void ParallelSgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   const at::Tensor& a, const at::Tensor& b, bool accumulate, at::Tensor& c) {
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* cp = c.data_ptr<float>();
  const int64_t lda = a.size(1), ldb = b.size(1);
  const float beta = accumulate ? 1.0f : 0.0f;
  if (m >= n) {
    KernelParallelFor(0, m, ParallelGrain(n * k), [&](int64_t lo, int64_t hi) {
          const float* a_rows = trans_a ? ap + lo : ap + lo * lda;  // rows of op(A)
      RowMajorSgemm(trans_a, trans_b, hi - lo, n, k, a_rows, lda, bp, ldb, beta, cp + lo * n, n);
    });
  } else {
    KernelParallelFor(0, n, ParallelGrain(m * k), [&](int64_t lo, int64_t hi) {
      const float* b_cols = trans_b ? bp + lo * ldb : bp + lo;  // columns of op(B)
      RowMajorSgemm(trans_a, trans_b, m, hi - lo, k, ap, lda, b_cols, ldb, beta, cp + lo, n);
    });
  }
}

// bf16 ↔ float32 in one AVX-512 pass over contiguous tensors, split over the kernel threads:
// ATen's conversions (TensorIterator copies) were 17 ms of a 100 ms tiny-LM bf16 step. Widening is
// exact (the bf16 bits become the high half); rounding is c10::BFloat16's round-to-nearest-even,
// NaN to the quiet NaN 0x7FC0: ATen's .to(kBFloat16) bits, except NaN payloads (ATen's vector
// loop gives 0xFFFF, its scalar tail 0x7FC0).
#if GLOSSA_X86_SIMD
__attribute__((target("avx512f"))) void WidenRange(const uint16_t* src, float* dst, int64_t lo,
                                                   int64_t hi) {
  int64_t i = lo;
  for (; i + 16 <= hi; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  for (; i < hi; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

__attribute__((target("avx512f"))) void RoundRange(const float* src, uint16_t* dst, int64_t lo,
                                                   int64_t hi) {
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 m = bf16_simd::FirstLanes(hi - i);
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, m,
                                      bf16_simd::RoundToBits(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

// dst ← src rounded to bf16 precision, kept as float32: the bits RoundRange gives, widened back
// (what .to(kBFloat16).to(kFloat) gives, NaN as the quiet NaN 0x7FC00000).
__attribute__((target("avx512f"))) void RoundKeepRange(const float* src, float* dst, int64_t lo,
                                                       int64_t hi) {
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 m = bf16_simd::FirstLanes(hi - i);
    const __m512i r = bf16_simd::RoundToBits(_mm512_maskz_loadu_ps(m, src + i));
    _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(r, 16)));
  }
}

#else  // no x86 SIMD in this build: HasAvx512() is false and these are never called
void WidenRange(const uint16_t*, float*, int64_t, int64_t) { NoSimdInThisBuild(); }
void RoundRange(const float*, uint16_t*, int64_t, int64_t) { NoSimdInThisBuild(); }
void RoundKeepRange(const float*, float*, int64_t, int64_t) { NoSimdInThisBuild(); }
#endif  // GLOSSA_X86_SIMD

bool HasAvx512() {
  static const bool has = CpuHasAvx512F();
  return has;
}

constexpr int64_t kConvertGrain = 1 << 16;

}  // namespace

// float32, contiguous.
at::Tensor Widen(const at::Tensor& t) {
  if (t.scalar_type() != at::kBFloat16 || !HasAvx512() || !t.device().is_cpu()) {
    return t.to(at::kFloat).contiguous();
  }
  if (!t.is_contiguous() && t.dim() >= 2 && t.dim() <= 4 && t.stride(-1) == 1 && t.numel() > 0) {
    // Rows of the last dimension read in place through the strides (the attention heads, views
    // of the fused Q/K/V projection), without a contiguous bf16 copy first.
    const int64_t d = t.dim(), cols = t.size(-1), rows = t.numel() / cols;
    int64_t size[3] = {1, 1, 1}, stride[3] = {0, 0, 0};
    for (int64_t i = 0; i < d - 1; ++i) {
      size[3 - (d - 1) + i] = t.size(i);
      stride[3 - (d - 1) + i] = t.stride(i);
    }
    at::Tensor out = at::empty(t.sizes(), t.options().dtype(at::kFloat));
    const uint16_t* src = reinterpret_cast<const uint16_t*>(t.data_ptr());
    float* dst = out.data_ptr<float>();
    KernelParallelFor(0, rows, std::max<int64_t>(1, kConvertGrain / cols),
                      [&](int64_t lo, int64_t hi) {
                        for (int64_t r = lo; r < hi; ++r) {
                          const int64_t i2 = r % size[2], i1 = r / size[2] % size[1],
                                        i0 = r / (size[2] * size[1]);
                          const uint16_t* row =
                              src + i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
                          WidenRange(row, dst + r * cols, 0, cols);
                        }
                      });
    return out;
  }
  const at::Tensor c = t.contiguous();
  at::Tensor out = at::empty(c.sizes(), c.options().dtype(at::kFloat));
  const uint16_t* src = reinterpret_cast<const uint16_t*>(c.data_ptr());
  float* dst = out.data_ptr<float>();
  KernelParallelFor(0, c.numel(), kConvertGrain,
                    [&](int64_t lo, int64_t hi) { WidenRange(src, dst, lo, hi); });
  return out;
}

// `t` (float32, contiguous) in `dtype`.
at::Tensor Narrow(const at::Tensor& t, at::ScalarType dtype) {
  if (dtype != at::kBFloat16 || !HasAvx512() || !t.is_contiguous() || !t.device().is_cpu()) {
    return t.to(dtype);
  }
  at::Tensor out = at::empty(t.sizes(), t.options().dtype(at::kBFloat16));
  const float* src = t.data_ptr<float>();
  uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
  KernelParallelFor(0, t.numel(), kConvertGrain,
                    [&](int64_t lo, int64_t hi) { RoundRange(src, dst, lo, hi); });
  return out;
}

namespace {

// float32 `t` rounded to bf16 precision, as float32 (into `out`, which may be `t`).
void RoundToBf16Into(const at::Tensor& t, at::Tensor& out) {
  if (!HasAvx512()) {
    out.copy_(t.to(at::kBFloat16));
    return;
  }
  const float* src = t.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  KernelParallelFor(0, t.numel(), kConvertGrain,
                    [&](int64_t lo, int64_t hi) { RoundKeepRange(src, dst, lo, hi); });
}

// max(0, y) in place, and the ReLU's backward g ∘ [y > 0] (ATen's relu and threshold_backward:
// NaN stays NaN forward and passes no gradient), over contiguous float32, split over the kernel
// threads.
#if GLOSSA_X86_SIMD
__attribute__((target("avx512f"))) void ReluRange(float* y, int64_t lo, int64_t hi) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 m = bf16_simd::FirstLanes(hi - i);
    // max(0, y) returns y when y is NaN.
    _mm512_mask_storeu_ps(y + i, m, _mm512_max_ps(zero, _mm512_maskz_loadu_ps(m, y + i)));
  }
}

__attribute__((target("avx512f"))) void ReluGradRange(const float* g, const float* y, float* out,
                                                       int64_t lo, int64_t hi) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 m = bf16_simd::FirstLanes(hi - i);
    const __mmask16 pos = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, y + i), zero,
                                                  _CMP_GT_OQ);
    _mm512_mask_storeu_ps(out + i, m, _mm512_maskz_loadu_ps(pos, g + i));
  }
}

// bf16 values (as their bits) [lo, hi) of x into y: max(0, x), NaN kept (as ATen's relu).
__attribute__((target("avx512f,avx512bw"))) void Bf16ReluRange(const uint16_t* x, uint16_t* y,
                                                              int64_t lo, int64_t hi) {
  const __m512i zero = _mm512_setzero_si512(), abs = _mm512_set1_epi16(0x7fff),
                inf = _mm512_set1_epi16(0x7f80);
  for (int64_t i = lo; i < hi; i += 32) {
    const __mmask32 m = hi - i >= 32 ? 0xFFFFFFFFu : (1u << (hi - i)) - 1;
    const __m512i v = _mm512_maskz_loadu_epi16(m, x + i);
    const __mmask32 negative = _mm512_cmplt_epi16_mask(v, zero) &
                               ~_mm512_cmpgt_epu16_mask(_mm512_and_si512(v, abs), inf);
    _mm512_mask_storeu_epi16(y + i, m, _mm512_maskz_mov_epi16(~negative, v));
  }
}

#else  // no x86 SIMD in this build: HasAvx512() is false and these are never called
void Bf16ReluRange(const uint16_t*, uint16_t*, int64_t, int64_t) { NoSimdInThisBuild(); }
void ReluRange(float*, int64_t, int64_t) { NoSimdInThisBuild(); }
void ReluGradRange(const float*, const float*, float*, int64_t, int64_t) { NoSimdInThisBuild(); }
#endif  // GLOSSA_X86_SIMD

constexpr int64_t kElementwiseGrain = 1 << 15;

// y (float32, contiguous) ← max(0, y).
void ReluInPlace(at::Tensor& y) {
  if (!HasAvx512() || !y.device().is_cpu()) {
    y.relu_();
    return;
  }
  float* p = y.data_ptr<float>();
  KernelParallelFor(0, y.numel(), kElementwiseGrain,
                    [&](int64_t lo, int64_t hi) { ReluRange(p, lo, hi); });
}

// relu of a bf16 tensor in one vectorized pass (ATen 1.13's bf16 relu took 5.5 ms for the 512
// LM's [2048, 2048] hidden layer in a profile on a Zen 4); the backward is ATen's.
class Bf16ReluFunction : public torch::autograd::Function<Bf16ReluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_in) {
    RECORD_USER_SCOPE("fwd:Bf16Relu");  // seen by --profile_ops
    const at::Tensor x = x_in.contiguous();
    at::Tensor y = at::empty_like(x);
    const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
    auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
    KernelParallelFor(0, x.numel(), kElementwiseGrain,
                      [&](int64_t lo, int64_t hi) { Bf16ReluRange(xp, yp, lo, hi); });
    ctx->save_for_backward({y});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {at::threshold_backward(grads[0], ctx->get_saved_variables()[0], 0)};
  }
};

at::Tensor Bf16Relu(const at::Tensor& x) {
  static const bool bw = CpuHasAvx512BwVl();
  if (!bw || x.scalar_type() != at::kBFloat16 || !x.device().is_cpu() || KernelsForcedToReference()) {
    return at::relu(x);
  }
  return Bf16ReluFunction::apply(x);
}

// g ∘ [y > 0] for float32 y (contiguous) and g of its shape.
at::Tensor ReluGrad(const at::Tensor& g_in, const at::Tensor& y) {
  if (!HasAvx512() || !y.device().is_cpu()) return at::threshold_backward(g_in, y, 0);
  const at::Tensor g = g_in.contiguous();
  at::Tensor out = at::empty(y.sizes(), y.options());
  const float *gp = g.data_ptr<float>(), *yp = y.data_ptr<float>();
  float* op = out.data_ptr<float>();
  KernelParallelFor(0, y.numel(), kElementwiseGrain,
                    [&](int64_t lo, int64_t hi) { ReluGradRange(gp, yp, op, lo, hi); });
  return out;
}

// Float32 x·w + b (optionally through a ReLU), as ATen's addmm (and relu) with the same ATen
// calls. With `split` (KernelChoice::kGemmSplit, measured per weight shape: SplitGemmsFor) the
// large GEMMs run single-threaded on the kernel threads: the forward as row parts, one per
// thread, and on two threads the backward's two GEMMs, dx = g·wᵀ and dw = xᵀ·g (with the bias's
// column sums), side by side (on more, each as row parts). On a 2-core Zen 4 and a 2-core Xeon
// that was 5-15% faster on the tiny LM's shapes than one GEMM at a time on both cores, whose
// OpenBLAS threads synchronize twice per GEMM; elsewhere the measurement decides. The bits are
// those of ATen with one OpenBLAS thread (a 1-core machine's): OpenBLAS splits a GEMM's output
// among its threads, not its sums, except that its threaded driver halves a long inner
// dimension's remainder differently, so where that dimension is over its block size (the tiny
// LM's logits: 2,000) the last bits differ from ATen on two OpenBLAS threads. The ReLU runs in
// place on the kernel threads, and its backward masks the gradient in one pass. Without `split`
// the GEMMs run one at a time on OpenBLAS's threads, as ATen's do.
// GEMMs of at least this many multiply-adds are split. Smaller ones gain nothing, and OpenBLAS's
// small-matrix kernels (under 100³) sum a part's rows in another order than the whole's;
// OpenBLAS itself runs those under 2^18 on one thread.
constexpr double kSplitMacs = 4194304.0;

// a·b (+ bias), ATen's mm or addmm; with `split` and a large product, as row parts, one
// single-threaded GEMM per kernel thread.
at::Tensor Mm(const at::Tensor& a, const at::Tensor& b, bool split, const at::Tensor& bias = {}) {
  const int64_t M = a.size(0), parts = std::min<int64_t>(KernelThreads(), M);
  if (!split || parts < 2 || at::GradMode::is_enabled() ||
      static_cast<double>(M) * a.size(1) * b.size(1) < kSplitMacs) {
    return bias.defined() ? at::addmm(bias, a, b) : at::mm(a, b);
  }
  at::Tensor out = at::empty({M, b.size(1)}, a.options());
  KernelParallelFor(0, parts, 1, [&](int64_t lo, int64_t hi) {
    at::NoGradGuard no_grad;  // as on the calling thread (grad mode is per thread)
    for (int64_t i = lo; i < hi; ++i) {
      at::Tensor rows = out.slice(0, M * i / parts, M * (i + 1) / parts);
      const at::Tensor ai = a.slice(0, M * i / parts, M * (i + 1) / parts);
      if (bias.defined()) {
        at::addmm_out(rows, bias, ai, b);
      } else {
        at::mm_out(rows, ai, b);
      }
    }
  });
  return out;
}

class Fp32AffineFunction : public torch::autograd::Function<Fp32AffineFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& w,
                                                const at::Tensor& b, bool relu, bool split) {
    RECORD_USER_SCOPE("fwd:Fp32Affine");  // seen by --profile_ops
    const bool has_bias = b.numel() > 0;
    at::Tensor out = Mm(x, w, split, has_bias ? b : at::Tensor());
    if (relu) ReluInPlace(out);
    ctx->save_for_backward({x, w, relu ? out : at::Tensor()});
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["split"] = split;
    ctx->set_materialize_grads(false);
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return torch::autograd::variable_list(5);  // one per input
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &y = saved[2];
    const at::Tensor g = y.defined() ? ReluGrad(grads[0], y) : grads[0];
    at::Tensor dx, dw, db;
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1),
               want_b = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2);
    // As AddmmBackward0: a column-major operand gets its gradient column-major. `mm`: at::mm, or
    // Mm for a GEMM that has the kernel threads to itself.
    auto grad_x = [&](auto mm) {
      return x.stride(0) == 1 && x.stride(1) == x.size(0) ? mm(w, g.t()).t() : mm(g, w.t());
    };
    auto grad_w = [&](auto mm) {
      return w.stride(0) == 1 && w.stride(1) == w.size(0) ? mm(g.t(), x).t() : mm(x.t(), g);
    };
    auto aten_mm = [](const at::Tensor& a, const at::Tensor& b) { return at::mm(a, b); };
    const bool split = ctx->saved_data["split"].toBool();
    auto split_mm = [&](const at::Tensor& a, const at::Tensor& b) { return Mm(a, b, split); };
    if (split && KernelThreads() == 2 && want_x && want_w) {
      // Side by side, each single-threaded.
      KernelParallelFor(0, 2, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          if (i == 0) {
            dx = grad_x(aten_mm);
            if (want_b) db = g.sum(0);
          } else {
            dw = grad_w(aten_mm);
          }
        }
      });
    } else {
      if (want_x) dx = grad_x(split_mm);
      if (want_w) dw = grad_w(split_mm);
      if (want_b) db = g.sum(0);
    }
    return {dx, dw, db, at::Tensor(), at::Tensor()};
  }
};

class AffineFunction : public torch::autograd::Function<AffineFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& w,
                                                const at::Tensor& b, bool relu,
                                                bool float_out) {
    const int64_t M = x.size(0), K = x.size(1), N = w.size(1);
    const at::Tensor xf = Widen(x), wf = Widen(w);
    at::Tensor out;
    const bool has_bias = b.numel() > 0;  // an empty b: none (autograd takes no undefined inputs)
    if (has_bias) {
      out = Widen(b).reshape({1, N}).expand({M, N}).contiguous();
    } else {
      out = at::empty({M, N}, xf.options());
    }
    ParallelSgemm(false, false, M, N, K, xf, wf, has_bias, out);
    // The ReLU before rounding: rounding keeps signs, so this is relu(round(·)).
    if (relu) ReluInPlace(out);
    at::Tensor y;
    if (float_out) {
      RoundToBf16Into(out, out);  // the bf16 values, kept in float32
      y = out;
    } else {
      y = Narrow(out, x.scalar_type());
    }
    ctx->save_for_backward({x, w, relu ? y : at::Tensor()});
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["float_out"] = float_out;
    ctx->set_materialize_grads(false);
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return torch::autograd::variable_list(5);  // one per input
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &y = saved[2];
    const int64_t M = x.size(0), K = x.size(1), N = w.size(1);
    // A float32 output's gradient rounded to bf16, as the cast's backward would round it.
    at::Tensor g_in;
    if (ctx->saved_data["float_out"].toBool()) {
      const at::Tensor g0 = grads[0].to(at::kFloat).contiguous();
      g_in = at::empty_like(g0);
      RoundToBf16Into(g0, g_in);
    } else {
      g_in = Widen(grads[0]);
    }
    // The ReLU's mask from the rounded output, as relu on the bf16 product would have it.
    const at::Tensor g = y.defined() ? ReluGrad(g_in, Widen(y)) : g_in;
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      at::Tensor out = at::empty({M, K}, g.options());
      ParallelSgemm(false, true, M, K, N, g, Widen(w), false, out);  // g · wᵀ
      dx = Narrow(out, x.scalar_type());
    }
    if (ctx->needs_input_grad(1)) {
      at::Tensor out = at::empty({K, N}, g.options());
      ParallelSgemm(true, false, K, N, M, Widen(x), g, false, out);  // xᵀ · g
      dw = Narrow(out, w.scalar_type());
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      db = Narrow(g.sum(0), x.scalar_type());
    }
    return {dx, dw, db, at::Tensor(), at::Tensor()};
  }
};

// Deterministic probe operands (no random generator: a probe must not move the run's RNG).
at::Tensor ProbeOperand(int64_t rows, int64_t cols, double phase) {
  return at::sin(at::arange(rows * cols, at::kFloat).mul_(0.37).add_(phase))
      .reshape({rows, cols})
      .to(at::kBFloat16);
}

}  // namespace

at::Tensor Bf16AffineNative(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            bool relu, bool float_out) {
  const at::Tensor no_bias = at::empty({0}, x.options());
  return AffineFunction::apply(x, w, b.defined() ? b : no_bias, relu, float_out)[0];
}

bool Bf16AffineRunsNative(int64_t m, int64_t k, int64_t n, bool training) {
  if (!HasSgemm()) return false;
  // One path per weight (k, n) and mode, measured at a fixed row count, whatever the batch: a
  // sentence's bits must not depend on how many others share its batch (sharded decoding,
  // batch-invariant serving), as they would if a path changed with the row count.
  (void)m;
  const int64_t rows = training ? 2048 : 256;
  const std::string shape = StrCat(rows, "x", k, "x", n, training ? " train" : " infer");
  // The operands are made on the probe's first (untimed, warm-up) call: made in every timed call,
  // their sines weighed in both paths' times alike and blurred the difference.
  at::Tensor x, w, b;
  return ChooseNative(KernelChoice::kBf16, "bf16_affine", shape, [&](bool native) {
    at::AutoGradMode grad(training);
    if (!x.defined()) {
      x = ProbeOperand(rows, k, 0.1).requires_grad_(training);
      w = ProbeOperand(k, n, 0.7).mul_(0.05).requires_grad_(training);
      b = ProbeOperand(1, n, 0.3).reshape({n}).requires_grad_(training);
    }
    const at::Tensor y = native ? Bf16AffineNative(x, w, b, false, false) : at::addmm(b, x, w);
    if (training) y.backward(at::ones_like(y));
  });
}

bool SplitGemmsFor(int64_t k, int64_t n) {
  // One choice per weight shape, measured at a fixed row count, whatever the batch.
  constexpr int64_t kRows = 1024;
  if (KernelThreads() < 2 || !HasSgemm() || static_cast<double>(kRows) * k * n < kSplitMacs) {
    return false;
  }
  const std::string shape = StrCat(kRows, "x", k, "x", n, " train, ", KernelThreads(),
                                   " kernel threads");
  at::Tensor x, w, b;  // made on the untimed warm-up call, as Bf16AffineRunsNative's
  return ChooseNative(KernelChoice::kGemmSplit, "fp32_affine", shape, [&](bool split) {
    at::AutoGradMode grad(true);
    if (!x.defined()) {
      x = ProbeOperand(kRows, k, 0.1).to(at::kFloat).requires_grad_(true);
      w = ProbeOperand(k, n, 0.7).to(at::kFloat).mul_(0.05).requires_grad_(true);
      b = ProbeOperand(1, n, 0.3).to(at::kFloat).reshape({n}).requires_grad_(true);
    }
    const at::Tensor y = Fp32AffineFunction::apply(x, w, b, false, split)[0];
    y.backward(at::ones_like(y));
  });
}

at::Tensor Affine(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool relu,
                  bool float_out) {
  if (x.dim() == 2 && x.device().is_cpu() && w.dim() == 2 && x.size(1) == w.size(0) &&
      x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
      (!b.defined() || b.scalar_type() == at::kFloat) &&
      RowKernelsFor(x.size(0), x.size(1), w.size(1))) {
    return InvariantAffine(x, w, b.defined() && b.numel() > 0 ? b : at::Tensor(), relu);
  }
  const bool shapes_ok = x.device().is_cpu() && x.dim() == 2 && w.dim() == 2 &&
                         x.size(1) == w.size(0) && x.numel() > 0 && w.numel() > 0 &&
                         (!b.defined() || (b.dim() == 1 && b.size(0) == w.size(1))) &&
                         std::max({x.size(0), x.size(1), w.size(1)}) < (int64_t{1} << 31);
  const at::Tensor no_bias = at::empty({0}, x.options());
  if (shapes_ok && x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 &&
      (!b.defined() || b.scalar_type() == at::kBFloat16) &&
      Bf16AffineRunsNative(x.size(0), x.size(1), w.size(1),
                           at::GradMode::is_enabled() &&
                               (x.requires_grad() || w.requires_grad() ||
                                (b.defined() && b.requires_grad())))) {
    return Bf16AffineNative(x, w, b, relu, float_out);
  }
  if (shapes_ok && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
      (!b.defined() || b.scalar_type() == at::kFloat) && HasSgemm()) {
    if (!at::GradMode::is_enabled() ||
        !(x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()))) {
      at::Tensor out = b.defined() ? at::addmm(b, x, w) : at::mm(x, w);
      if (relu) ReluInPlace(out);
      return out;
    }
    return Fp32AffineFunction::apply(x, w, b.defined() ? b : no_bias, relu,
                                     SplitGemmsFor(x.size(1), w.size(1)))[0];
  }
  at::Tensor out = b.defined() ? at::addmm(b, x, w) : at::mm(x, w);
  if (relu) out = Bf16Relu(out);
  return float_out ? out.to(at::kFloat) : out;
}

}  // namespace glossa
