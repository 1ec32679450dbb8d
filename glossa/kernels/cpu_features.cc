#include "glossa/kernels/cpu_features.h"

#include <cstdlib>
#include <string>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

bool ReadMode() {
  const char* env = std::getenv("GLOSSA_KERNELS");
  const std::string mode = env == nullptr ? "native" : env;
  if (mode != "native" && mode != "reference" && !mode.empty()) {
    throw InvalidArgumentError(
        StrCat("GLOSSA_KERNELS must be native or reference, got '", mode, "'"));
  }
  return mode == "reference";
}

bool Probe(bool bw_vl, bool bf16 = false) {
#if GLOSSA_X86_SIMD
  if (!__builtin_cpu_supports("avx512f")) return false;
  if (bf16 && !__builtin_cpu_supports("avx512bf16")) return false;
  return !bw_vl || (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"));
#else
  (void)bw_vl;
  (void)bf16;
  return false;
#endif
}

}  // namespace

bool KernelsForcedToReference() {
  static const bool forced = ReadMode();
  return forced;
}

bool CpuHasAvx512F() {
  static const bool has = !KernelsForcedToReference() && Probe(false);
  return has;
}

X86Features ProbeX86Features() {
  X86Features f;
#if GLOSSA_X86_SIMD
  __builtin_cpu_init();
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
#endif
  return f;
}

void NoSimdInThisBuild() {
  throw InternalError("a native kernel was called in a build without x86 SIMD (GLOSSA_X86_SIMD 0)");
}

bool CpuHasAvx512BwVl() {
  static const bool has = !KernelsForcedToReference() && Probe(true);
  return has;
}

bool CpuHasAvx512Bf16() {
  static const bool has = !KernelsForcedToReference() && Probe(true, true);
  return has;
}

}  // namespace glossa
