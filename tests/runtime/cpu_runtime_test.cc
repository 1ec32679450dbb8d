#include "glossa/runtime/cpu_runtime.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <thread>

namespace glossa {
namespace {

extern "C" int openblas_get_num_threads(void) __attribute__((weak));

TEST(CpuRuntime, ThreadLayoutPerComputeDtype) {
  const int saved = at::get_num_threads();
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  auto check_blas = [](const CpuRuntimeLayout& l) {
    if (openblas_get_num_threads != nullptr && l.blas_threads > 0) {
      EXPECT_EQ(openblas_get_num_threads(), l.blas_threads);
    }
  };
  CpuRuntimeLayout fp32 = ConfigureCpuRuntime(0, /*bf16_compute=*/false);
  EXPECT_EQ(fp32.aten_threads, 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  if (fp32.blas_threads > 0) {
    EXPECT_EQ(fp32.blas_threads, cores);
  }
  check_blas(fp32);
  CpuRuntimeLayout bf16 = ConfigureCpuRuntime(0, /*bf16_compute=*/true);
  EXPECT_EQ(bf16.aten_threads, cores);
  EXPECT_EQ(at::get_num_threads(), cores);
  if (bf16.blas_threads > 0) {
    EXPECT_EQ(bf16.blas_threads, 1);
  }
  check_blas(bf16);
  CpuRuntimeLayout explicit_one = ConfigureCpuRuntime(1, false);
  EXPECT_EQ(explicit_one.aten_threads, 1);
  if (explicit_one.blas_threads > 0) {
    EXPECT_EQ(explicit_one.blas_threads, cores);
  }
  check_blas(explicit_one);
  at::set_num_threads(saved);
}

}  // namespace
}  // namespace glossa
