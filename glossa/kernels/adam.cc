#include "glossa/kernels/adam.h"

#include <ATen/ATen.h>

#include <cstdint>

#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
#include <immintrin.h>

#include "glossa/kernels/bf16_simd.h"
#endif

namespace glossa {
namespace {

// GCC 12 reports _mm512_undefined_ps() inside its masked-load intrinsics as maybe-uninitialized;
// a known false positive.
#if GLOSSA_X86_SIMD
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Adam's update of float32 var, m and v from g in one pass (AVX-512), as the ATen ops do in
// seven (mul_, add_, mul_, addcmul_, sqrt, add_, addcdiv_) with a temporary:
//   m = b1·m + (1 − b1)·g;  v = b2·v + (1 − b2)·g²;  var −= lr_t · m / (√v + ε).
// The same roundings as those ops (tests/optim/optimizer_test.cc checks bit equality).
// With `copy`: the updated values rounded to bf16 there too.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void FusedAdamRange(
    float* var, float* m, float* v, const float* g, uint16_t* copy, int64_t lo, int64_t hi,
    double b1, double b2, double eps, double lr_t) {
  // The constants as ATen's ops get them: each scalar rounded to float from double.
  const __m512 vb1 = _mm512_set1_ps(static_cast<float>(b1));
  const __m512 vc1 = _mm512_set1_ps(static_cast<float>(1 - b1));
  const __m512 vb2 = _mm512_set1_ps(static_cast<float>(b2));
  const __m512 vc2 = _mm512_set1_ps(static_cast<float>(1 - b2));
  const __m512 veps = _mm512_set1_ps(static_cast<float>(eps));
  const __m512 vlr = _mm512_set1_ps(static_cast<float>(-lr_t));
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 k =
        hi - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (hi - i)) - 1);
    const __m512 gi = _mm512_maskz_loadu_ps(k, g + i);
    // Rounded where ATen's ops round: m·b1, then the add with alpha as a fused multiply-add;
    // v·b2, then (c2·g)·g + v as one; √v, + ε, then (−lr_t·m) / denominator + var.
    const __m512 mi = _mm512_fmadd_ps(gi, vc1, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, m + i), vb1));
    const __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(vc2, gi), gi,
                                      _mm512_mul_ps(_mm512_maskz_loadu_ps(k, v + i), vb2));
    const __m512 step =
        _mm512_div_ps(_mm512_mul_ps(vlr, mi), _mm512_add_ps(_mm512_sqrt_ps(vi), veps));
    _mm512_mask_storeu_ps(m + i, k, mi);
    _mm512_mask_storeu_ps(v + i, k, vi);
    const __m512 updated = _mm512_add_ps(_mm512_maskz_loadu_ps(k, var + i), step);
    _mm512_mask_storeu_ps(var + i, k, updated);
    if (copy != nullptr) bf16_simd::Store(copy + i, updated, k);
  }
}
#pragma GCC diagnostic pop
#else
void FusedAdamRange(float*, float*, float*, const float*, uint16_t*, int64_t, int64_t, double,
                    double, double, double) {
  NoSimdInThisBuild();
}
#endif  // GLOSSA_X86_SIMD

bool FusedAdamApplies(const at::Tensor& var, const at::Tensor& m, const at::Tensor& v,
                      const at::Tensor& g) {
  if (!CpuHasAvx512BwVl() || KernelsForcedToReference()) return false;
  for (const at::Tensor* t : {&var, &m, &v, &g}) {
    if (t->scalar_type() != at::kFloat || !t->device().is_cpu() || !t->is_contiguous()) {
      return false;
    }
  }
  return true;
}

}  // namespace

void AdamUpdate(const at::Tensor& var, const at::Tensor& m, const at::Tensor& v,
                const at::Tensor& g, double b1, double b2, double eps, double lr_t,
                at::Tensor* bf16_copy) {
  if (FusedAdamApplies(var, m, v, g)) {
    float *pw = var.data_ptr<float>(), *pm = m.data_ptr<float>(), *pv = v.data_ptr<float>();
    const float* pg = g.data_ptr<float>();
    uint16_t* pc = nullptr;
    if (bf16_copy != nullptr) {
      at::Tensor& c = *bf16_copy;
      if (!c.defined() || c.scalar_type() != at::kBFloat16 || c.sizes() != var.sizes() ||
          !c.is_contiguous() || !c.device().is_cpu()) {
        c = at::empty(var.sizes(), var.options().dtype(at::kBFloat16));
      } else {
        c.unsafeGetTensorImpl()->bump_version();  // rewritten in place
      }
      pc = reinterpret_cast<uint16_t*>(c.data_ptr());
    }
    KernelParallelFor(0, var.numel(), 1 << 16, [&](int64_t lo, int64_t hi) {
      FusedAdamRange(pw, pm, pv, pg, pc, lo, hi, b1, b2, eps, lr_t);
    });
    // Written through pointers: moved on by hand, as the in-place ops would.
    for (const at::Tensor* t : {&var, &m, &v}) t->unsafeGetTensorImpl()->bump_version();
    return;
  }
  if (bf16_copy != nullptr) *bf16_copy = at::Tensor();
  AdamUpdateReference(var, m, v, g, b1, b2, eps, lr_t);
}

void AdamUpdateReference(const at::Tensor& var, const at::Tensor& m, const at::Tensor& v,
                const at::Tensor& g,
                         double b1, double b2, double eps, double lr_t) {
  // In place, one temporary (the denominator) per variable.
  m.mul_(b1).add_(g, 1 - b1);
  v.mul_(b2).addcmul_(g, g, 1 - b2);
  var.addcdiv_(m, v.sqrt().add_(eps), -lr_t);
}

}  // namespace glossa
