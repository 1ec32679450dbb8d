// One CPU-feature probe for Glossa's native kernels, the switch that forces their ATen reference
// paths, and the build switch for their intrinsics.
//
//   GLOSSA_KERNELS=reference build/bin/glossa_tests   # every kernel on its reference path
//
// GLOSSA_KERNELS is "native" (the default: the CPU's features decide) or "reference" (every
// native kernel reports its features absent, so callers take the ATen paths, on any machine).
// CI runs the unit tests both ways, so the fallbacks run on AVX-512 machines too.
//
// GLOSSA_X86_SIMD is 1 where the native kernels' x86 intrinsics are compiled (an x86 target
// without -DGLOSSA_NO_X86_SIMD) and 0 elsewhere: every <immintrin.h> and every AVX-512 function
// in glossa/kernels/ sits under it, and without it the features below are always absent, so the
// library builds and runs on the reference paths on any target (CTest `kernels_portable`
// compiles glossa/kernels/ with -DGLOSSA_NO_X86_SIMD and with -march=x86-64).
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && !defined(GLOSSA_NO_X86_SIMD)
#define GLOSSA_X86_SIMD 1
#else
#define GLOSSA_X86_SIMD 0
#endif

namespace glossa {

// True with GLOSSA_KERNELS=reference. Another value than native or reference is InvalidArgument.
bool KernelsForcedToReference();

// What the native kernels need; false when forced to reference, and on a non-x86 build.
bool CpuHasAvx512F();      // AVX-512 Foundation
bool CpuHasAvx512BwVl();   // AVX-512 F + BW + VL
bool CpuHasAvx512Bf16();   // AVX-512 F + BW + VL + BF16 (vdpbf16ps: bf16 pair dot products)

// What the CPU itself supports, whatever GLOSSA_KERNELS says (for choices outside Glossa's own
// kernels, such as OpenBLAS's kernel set); all false on a non-x86 build.
struct X86Features {
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx2 = false, fma = false;
};
X86Features ProbeX86Features();

// What a native kernel's entry point calls in a build without GLOSSA_X86_SIMD, where the
// features above are false and it is never reached (an InternalError if it is).
[[noreturn]] void NoSimdInThisBuild();

}  // namespace glossa
