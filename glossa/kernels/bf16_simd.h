// AVX-512 bf16 ↔ float32 for 16 lanes at a time, shared by Glossa's kernels (kernels/gemm.cc,
// kernels/layer_norm.cc). Callers check the CPU (avx512f; avx512bw and avx512vl for the masked
// 16-bit loads) before calling. Include only under GLOSSA_X86_SIMD (kernels/cpu_features.h).
#pragma once

#include "glossa/kernels/cpu_features.h"

#if !GLOSSA_X86_SIMD
#error "bf16_simd.h needs GLOSSA_X86_SIMD"
#endif

#include <immintrin.h>

#include <cstdint>

namespace glossa::bf16_simd {

// The first min(left, 16) lanes.
inline __mmask16 FirstLanes(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

// x rounded to bf16 as c10::BFloat16 rounds (nearest, ties to even), each lane's bits in its low
// 16 bits; NaN becomes the quiet NaN 0x7FC0.
__attribute__((target("avx512f"))) inline __m512i RoundToBits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i bias = _mm512_add_epi32(
      _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                               _mm512_set1_epi32(0x7fc0));
}

// The lanes of m among 16 bf16 values at p, widened (exactly); 0 elsewhere.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 Load(const uint16_t* p,
                                                                        __mmask16 m) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// The lanes of m of x, rounded, to 16 bf16 values at p.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void Store(uint16_t* p, __m512 x,
                                                                       __mmask16 m) {
  _mm512_mask_cvtepi32_storeu_epi16(p, m, RoundToBits(x));
}

}  // namespace glossa::bf16_simd
