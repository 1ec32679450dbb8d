#include "glossa/kernels/step_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
#include "glossa/kernels/simd_math.h"
#endif

namespace glossa {
namespace {

void Check(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
           const at::Tensor& rows, int64_t length, const at::Tensor& bias) {
  const bool ok = q.dim() == 3 && key.dim() == 4 && value.sizes() == key.sizes() &&
                  key.size(2) == q.size(1) && key.size(3) == q.size(2) && rows.dim() == 2 &&
                  rows.size(0) == q.size(0) && rows.scalar_type() == at::kLong && length >= 1 &&
                  rows.size(1) >= length && key.size(1) >= length &&
                  (!bias.defined() ||
                   (bias.dim() == 2 && bias.size(0) == q.size(0) && bias.size(1) == length));
  if (!ok) {
    throw InvalidArgumentError(StrCat(
        "StepAttention: q [N, heads, dim], key and value [slots, C, heads, dim], rows [N, >= L] "
        "int64, bias [N, L], 1 <= L <= C; got q ", q.sizes(), ", key ", key.sizes(), ", value ",
        value.sizes(), ", rows ", rows.sizes(), ", L ", length, ", bias ",
        bias.defined() ? bias.sizes() : at::IntArrayRef{}));
  }
}

// Hypothesis i's own slot when no row table names one: its source's (i % sources), or i.
int64_t SourceSlot(const StepAttentionArgs& a, int64_t i) {
  return a.sources > 0 ? i % a.sources : i;
}

const float* KeyRow(const StepAttentionArgs& a, const float* base, int64_t i, int64_t s,
                    int64_t n) {
  const int64_t slot = a.rows != nullptr ? a.rows[i * a.rows_stride + s] : SourceSlot(a, i);
  return base + ((slot * a.capacity + s) * a.heads + n) * a.dim;
}

// Hypothesis i's row of the additive bias: its own with a row table, else its source's.
const float* BiasRow(const StepAttentionArgs& a, int64_t i) {
  if (a.bias == nullptr) return nullptr;
  return a.bias + (a.rows != nullptr ? i : SourceSlot(a, i)) * a.length;
}

// Row (i, n), portable: the dot products as fma chains over the head dim, the softmax with the
// sum in step order, the output as an fma chain over the steps, scaled by 1 / sum.
void StepRowPortable(const StepAttentionArgs& a, int64_t i, int64_t n, std::vector<float>& p) {
  const int64_t H = a.dim, L = a.length;
  p.resize(static_cast<size_t>(L));
  const float* qr = a.q + (i * a.heads + n) * H;
  const float* bias = BiasRow(a, i);
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < L; ++s) {
    const float* kr = KeyRow(a, a.key, i, s, n);
    float acc = 0.0f;
    for (int64_t h = 0; h < H; ++h) acc = std::fma(qr[h], kr[h], acc);
    if (bias != nullptr) acc += bias[s];
    p[static_cast<size_t>(s)] = acc;
    m = std::max(m, acc);
  }
  float sum = 0.0f;
  for (int64_t s = 0; s < L; ++s) {
    p[static_cast<size_t>(s)] = std::exp(p[static_cast<size_t>(s)] - m);
    sum += p[static_cast<size_t>(s)];
  }
  const float inv = 1.0f / sum;
  float* o = a.out + (i * a.heads + n) * H;
  for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
  for (int64_t s = 0; s < L; ++s) {
    const float* vr = KeyRow(a, a.value, i, s, n);
    for (int64_t h = 0; h < H; ++h) o[h] = std::fma(p[static_cast<size_t>(s)], vr[h], o[h]);
  }
  for (int64_t h = 0; h < H; ++h) o[h] *= inv;
}

#if GLOSSA_X86_SIMD
__attribute__((target("avx512f"))) void StepRow512(const StepAttentionArgs& a, int64_t i,
                                                   int64_t n, std::vector<float>& p) {
  const int64_t H = a.dim, L = a.length;
  p.resize(static_cast<size_t>(L));
  const float* qr = a.q + (i * a.heads + n) * H;
  const float* bias = BiasRow(a, i);
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < L; ++s) {
    const float* kr = KeyRow(a, a.key, i, s, n);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < H; c += 16) {
      const __mmask16 mk = H - c >= 16 ? 0xFFFF : simd_math::TailMask(H - c);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, qr + c), _mm512_maskz_loadu_ps(mk, kr + c),
                            acc);
    }
    float logit = _mm512_reduce_add_ps(acc);
    if (bias != nullptr) logit += bias[s];
    p[static_cast<size_t>(s)] = logit;
    m = std::max(m, logit);
  }
  const __m512 vm = _mm512_set1_ps(m);
  for (int64_t c = 0; c < L; c += 16) {
    const __mmask16 mk = L - c >= 16 ? 0xFFFF : simd_math::TailMask(L - c);
    _mm512_mask_storeu_ps(p.data() + c, mk,
                          simd_math::Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, p.data() + c), vm)));
  }
  float sum = 0.0f;
  for (int64_t s = 0; s < L; ++s) sum += p[static_cast<size_t>(s)];
  const float inv = 1.0f / sum;
  float* o = a.out + (i * a.heads + n) * H;
  for (int64_t c = 0; c < H; c += 16) {
    const __mmask16 mk = H - c >= 16 ? 0xFFFF : simd_math::TailMask(H - c);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t s = 0; s < L; ++s) {
      acc = _mm512_fmadd_ps(_mm512_set1_ps(p[static_cast<size_t>(s)]),
                            _mm512_maskz_loadu_ps(mk, KeyRow(a, a.value, i, s, n) + c), acc);
    }
    _mm512_mask_storeu_ps(o + c, mk, _mm512_mul_ps(acc, _mm512_set1_ps(inv)));
  }
}
#endif

}  // namespace

void StepAttentionRaw(const StepAttentionArgs& a) {
  const bool simd = CpuHasAvx512F();
  KernelParallelFor(0, a.n * a.heads, ParallelGrain(2 * a.length * a.dim),
                    [&](int64_t lo, int64_t hi) {
                      std::vector<float> p;
                      for (int64_t j = lo; j < hi; ++j) {
#if GLOSSA_X86_SIMD
                        if (simd) {
                          StepRow512(a, j / a.heads, j % a.heads, p);
                          continue;
                        }
#endif
                        StepRowPortable(a, j / a.heads, j % a.heads, p);
                      }
                    });
  (void)simd;
}

at::Tensor StepAttentionReference(const at::Tensor& q, const at::Tensor& key,
                                  const at::Tensor& value, const at::Tensor& rows, int64_t length,
                                  const at::Tensor& bias) {
  Check(q, key, value, rows, length, bias);
  const at::Tensor r = rows.narrow(1, 0, length);                           // [N, L]
  const at::Tensor s = at::arange(length, rows.options()).unsqueeze(0).expand_as(r);
  const at::Tensor k = key.index({r, s}), v = value.index({r, s});        // [N, L, heads, dim]
  at::Tensor logits = at::einsum("inh,isnh->ins", {q, k.to(q.scalar_type())});
  if (bias.defined()) logits = logits + bias.to(logits.scalar_type()).unsqueeze(1);
  return at::einsum("ins,isnh->inh", {at::softmax(logits, -1), v.to(q.scalar_type())});
}

at::Tensor StepAttention(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
                         const at::Tensor& rows, int64_t length, const at::Tensor& bias) {
  Check(q, key, value, rows, length, bias);
#if GLOSSA_X86_SIMD
  if (CpuHasAvx512F() && q.device().is_cpu() && q.scalar_type() == at::kFloat &&
      key.scalar_type() == at::kFloat && value.scalar_type() == at::kFloat) {
    const at::Tensor qc = q.contiguous(), kc = key.contiguous(), vc = value.contiguous();
    const at::Tensor rc = rows.contiguous();
    const at::Tensor bc = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
    // A row's slot must exist: a bad table would read out of bounds.
    const at::Tensor used = rc.narrow(1, 0, length);
    if (used.min().item<int64_t>() < 0 || used.max().item<int64_t>() >= kc.size(0)) {
      throw InvalidArgumentError(StrCat("StepAttention: rows name slots outside [0, ",
                                        kc.size(0), ")"));
    }
    at::Tensor out = at::empty(qc.sizes(), qc.options());
    StepAttentionArgs a;
    a.q = qc.data_ptr<float>(), a.key = kc.data_ptr<float>(), a.value = vc.data_ptr<float>();
    a.bias = bc.defined() ? bc.data_ptr<float>() : nullptr;
    a.rows = rc.data_ptr<int64_t>(), a.rows_stride = rc.size(1);
    a.n = qc.size(0), a.heads = qc.size(1), a.dim = qc.size(2), a.capacity = kc.size(1);
    a.length = length, a.out = out.data_ptr<float>();
    StepAttentionRaw(a);
    return out;
  }
#endif
  return StepAttentionReference(q, key, value, rows, length, bias);
}

}  // namespace glossa
