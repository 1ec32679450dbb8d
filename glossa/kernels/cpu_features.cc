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

bool Probe(bool bw_vl) {
#if defined(__x86_64__) || defined(__i386__)
  if (!__builtin_cpu_supports("avx512f")) return false;
  return !bw_vl || (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"));
#else
  (void)bw_vl;
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

bool CpuHasAvx512BwVl() {
  static const bool has = !KernelsForcedToReference() && Probe(true);
  return has;
}

}  // namespace glossa
