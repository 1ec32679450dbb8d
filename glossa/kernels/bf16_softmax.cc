#include "glossa/kernels/bf16_softmax.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
#include <immintrin.h>

#include "glossa/kernels/bf16_simd.h"
#include "glossa/kernels/simd_math.h"
#endif

namespace glossa {
namespace {

// Where row r (of B·N·T rows) finds its bias row: bias [Bb, 1, Tb, S] with Bb, Tb 1 or full.
struct BiasRows {
  const void* data = nullptr;
  bool bf16 = false;
  int64_t N = 1, T = 1, S = 0, sb = 0, st = 0;
  int64_t Offset(int64_t r) const { return r / (N * T) * sb + r % T * st; }
};

#if GLOSSA_X86_SIMD

using bf16_simd::FirstLanes;

__attribute__((target("avx512f,avx512bw,avx512vl"))) void ForwardRows(
    const uint16_t* x, uint16_t* y, int64_t S, int64_t lo, int64_t hi, const BiasRows& bias) {
  thread_local std::vector<float> buf;  // per-thread cache: a row's float32 values
  buf.resize(static_cast<size_t>(S));
  float* z = buf.data();
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = lo; r < hi; ++r) {
    const uint16_t* xr = x + r * S;
    const int64_t off = bias.data ? bias.Offset(r) : 0;
    __m512 vmax = neg_inf;
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = FirstLanes(S - c);
      __m512 v = bf16_simd::Load(xr + c, m);
      if (bias.data) {
        v = _mm512_add_ps(
            v, bias.bf16 ? bf16_simd::Load(static_cast<const uint16_t*>(bias.data) + off + c, m)
                         : _mm512_maskz_loadu_ps(m, static_cast<const float*>(bias.data) + off + c));
      }
      _mm512_mask_storeu_ps(z + c, m, v);
      vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
    }
    const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = FirstLanes(S - c);
      const __m512 e =
          _mm512_maskz_mov_ps(m, simd_math::Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, z + c), vm)));
      _mm512_mask_storeu_ps(z + c, m, e);
      sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = FirstLanes(S - c);
      bf16_simd::Store(y + r * S + c, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, z + c), inv), m);
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void BackwardRows(
    const uint16_t* dy, const uint16_t* y, uint16_t* dx, int64_t S, int64_t lo, int64_t hi) {
  for (int64_t r = lo; r < hi; ++r) {
    const uint16_t *d = dy + r * S, *p = y + r * S;
    __m512 dot = _mm512_setzero_ps();
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = FirstLanes(S - c);
      dot = _mm512_fmadd_ps(bf16_simd::Load(d + c, m), bf16_simd::Load(p + c, m), dot);
    }
    const __m512 vd = _mm512_set1_ps(_mm512_reduce_add_ps(dot));
    for (int64_t c = 0; c < S; c += 16) {
      const __mmask16 m = FirstLanes(S - c);
      bf16_simd::Store(dx + r * S + c,
                       _mm512_mul_ps(bf16_simd::Load(p + c, m),
                                     _mm512_sub_ps(bf16_simd::Load(d + c, m), vd)),
                       m);
    }
  }
}

#else

void ForwardRows(const uint16_t*, uint16_t*, int64_t, int64_t, int64_t, const BiasRows&) {
  NoSimdInThisBuild();
}
void BackwardRows(const uint16_t*, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t) {
  NoSimdInThisBuild();
}

#endif

const uint16_t* Bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}

class Bf16SoftmaxFunction : public torch::autograd::Function<Bf16SoftmaxFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& logits_in,
                                                const at::Tensor& bias_in) {
    const at::Tensor logits = logits_in.contiguous();
    const int64_t B = logits.size(0), N = logits.size(1), T = logits.size(2), S = logits.size(3);
    BiasRows bias;
    at::Tensor b;
    if (bias_in.defined() && bias_in.numel() > 0) {
      b = bias_in.contiguous();
      bias.data = b.data_ptr();
      bias.bf16 = b.scalar_type() == at::kBFloat16;
      bias.N = N, bias.T = T, bias.S = S;
      bias.sb = b.size(0) > 1 ? b.size(2) * S : 0;
      bias.st = b.size(2) > 1 ? S : 0;
    }
    at::Tensor y = at::empty_like(logits);
    const uint16_t* xp = Bits(logits);
    uint16_t* yp = const_cast<uint16_t*>(Bits(y));
    KernelParallelFor(0, B * N * T, ParallelGrain(8 * S),
                      [&](int64_t lo, int64_t hi) { ForwardRows(xp, yp, S, lo, hi, bias); });
    ctx->save_for_backward({y});
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].to(at::kBFloat16).contiguous();
    const int64_t S = y.size(-1);
    at::Tensor dx = at::empty_like(y);
    const uint16_t *dyp = Bits(dy), *yp = Bits(y);
    uint16_t* dxp = const_cast<uint16_t*>(Bits(dx));
    KernelParallelFor(0, y.numel() / S, ParallelGrain(4 * S),
                      [&](int64_t lo, int64_t hi) { BackwardRows(dyp, yp, dxp, S, lo, hi); });
    return {dx, at::Tensor()};
  }
};

}  // namespace

bool Bf16SoftmaxApplies(const at::Tensor& logits, const at::Tensor& bias) {
  static const bool simd = CpuHasAvx512BwVl();
  if (!simd || KernelsForcedToReference() || !logits.defined() || logits.dim() != 4 ||
      logits.scalar_type() != at::kBFloat16 || !logits.device().is_cpu() || logits.numel() == 0) {
    return false;
  }
  if (!bias.defined() || bias.numel() == 0) return true;
  return bias.dim() == 4 && bias.device().is_cpu() && !bias.requires_grad() &&
         (bias.scalar_type() == at::kBFloat16 || bias.scalar_type() == at::kFloat) &&
         (bias.size(0) == 1 || bias.size(0) == logits.size(0)) && bias.size(1) == 1 &&
         (bias.size(2) == 1 || bias.size(2) == logits.size(2)) && bias.size(3) == logits.size(3);
}

at::Tensor Bf16SoftmaxWithBias(const at::Tensor& logits, const at::Tensor& bias) {
  return Bf16SoftmaxFunction::apply(logits, bias.defined() ? bias : at::empty({0}))[0];
}

}  // namespace glossa
