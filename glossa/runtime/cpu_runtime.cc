#include "glossa/runtime/cpu_runtime.h"

#include <ATen/Parallel.h>
#include <malloc.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

extern "C" {
void openblas_set_num_threads(int) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
}

namespace glossa {

CpuRuntimeLayout ConfigureCpuRuntime(int intra_op_threads, bool bf16_compute) {
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 * 1024 * 1024);
  int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // Data-parallel workers on one machine (LOCAL_WORLD_SIZE, set by torchrun and by glossa's
  // --nproc_per_node) share its cores.
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE"); local != nullptr) {
    const int n = std::atoi(local);
    if (n > 1) cores = std::max(1, cores / n);
  }
  CpuRuntimeLayout layout;
  if (intra_op_threads > 0) {
    layout.aten_threads = intra_op_threads;
    layout.blas_threads = std::max(1, cores - intra_op_threads + 1);
  } else if (bf16_compute) {
    layout.aten_threads = cores;
    layout.blas_threads = 1;
  } else {
    layout.aten_threads = 1;
    layout.blas_threads = cores;
  }
  at::set_num_threads(layout.aten_threads);
  if (openblas_set_num_threads != nullptr) {
    openblas_set_num_threads(layout.blas_threads);
  } else {
    layout.blas_threads = 0;
  }
  return layout;
}

const char* BlasCoreName() {
  return openblas_get_corename != nullptr ? openblas_get_corename() : "";
}

void UseBestBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv("GLOSSA_KEEP_BLAS_KERNELS")) {
    return;
  }
  const std::string core = BlasCoreName();
  // OpenBLAS's kernel sets without AVX2 GEMMs.
  static const char* const kOld[] = {"Prescott", "Core2",    "Penryn",    "Dunnington", "Nehalem",
                                     "Atom",     "Sandybridge", "Barcelona", "Bobcat",  "Katmai",
                                     "Coppermine", "Northwood", "Banias",  "Opteron", "Opteron_SSE3"};
  if (std::none_of(std::begin(kOld), std::end(kOld), [&](const char* c) { return core == c; })) {
    return;
  }
  __builtin_cpu_init();
  const char* better = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    better = "Haswell";
  }
  if (better == nullptr) return;
  setenv("OPENBLAS_CORETYPE", better, 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // exec failed: go on with the kernels we have
}

}  // namespace glossa
