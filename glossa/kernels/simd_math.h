// AVX-512 helpers shared by the kernels in this folder (not for layers): e^x for 16 floats and
// tail masks. Include only under GLOSSA_X86_SIMD (glossa/kernels/cpu_features.h).
#pragma once

#include "glossa/kernels/cpu_features.h"

#if !GLOSSA_X86_SIMD
#error "simd_math.h needs GLOSSA_X86_SIMD"
#endif

// GCC 12 reports _mm512_undefined_ps() inside its own AVX-512 intrinsics (reductions, masked
// loads) as maybe-uninitialized; a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

namespace glossa::simd_math {

// e^x for 16 floats: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in two for an exact n·ln2), e^r
// by Cephes' degree-6 expf polynomial, 2^n by scalef. Below −87 (e^x < 1.7·10⁻³⁸, just above
// FLT_MIN = e^−87.34) the result is 0, never subnormal, as under flush-to-zero (−∞ gives 0, not
// NaN): on Intel cores a subnormal result, and each later operation that reads one, takes a
// microcode assist of some hundred cycles, and the masked keys of causal attention put half of
// its softmax's inputs there. NaN passes through (max/min return their second operand when
// either is NaN; the comparison is false for NaN).
__attribute__((target("avx512f"))) inline __m512 Exp16(__m512 x) {
  const __mmask16 below = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  // Clamped there too, so that scalef never computes a subnormal (for the lanes masked below).
  x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);
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
  return _mm512_mask_mov_ps(_mm512_scalef_ps(y, n), below, _mm512_setzero_ps());
}

__attribute__((target("avx512f"))) inline __mmask16 TailMask(int64_t left) {
  return static_cast<__mmask16>((1u << left) - 1u);
}

}  // namespace glossa::simd_math
