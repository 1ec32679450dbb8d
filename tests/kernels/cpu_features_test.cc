// The CPU-feature probe and GLOSSA_KERNELS: CTest runs this binary twice (unit_tests and
// unit_tests_reference_kernels), so each mode is checked against the environment it runs in.
#include "glossa/kernels/cpu_features.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace glossa {
namespace {

TEST(CpuFeatures, ReferenceModeTurnsEveryNativeFeatureOff) {
  const char* env = std::getenv("GLOSSA_KERNELS");
  const bool reference = env != nullptr && std::string(env) == "reference";
  EXPECT_EQ(KernelsForcedToReference(), reference);
  if (reference) {
    EXPECT_FALSE(CpuHasAvx512F());
    EXPECT_FALSE(CpuHasAvx512BwVl());
  }
#if defined(__x86_64__) || defined(__i386__)
  if (!reference) {
    EXPECT_EQ(CpuHasAvx512F(), __builtin_cpu_supports("avx512f") != 0);
  }
#endif
  // BW and VL come with F on every AVX-512 CPU: never BW+VL without F.
  EXPECT_TRUE(!CpuHasAvx512BwVl() || CpuHasAvx512F());
}

}  // namespace
}  // namespace glossa
