#include "glossa/runtime/cpu_runtime.h"

#include <ATen/Parallel.h>
#include <malloc.h>

#include <algorithm>
#include <thread>

extern "C" {
void openblas_set_num_threads(int) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
}

namespace glossa {

CpuRuntimeLayout ConfigureCpuRuntime(int intra_op_threads, bool bf16_compute) {
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 * 1024 * 1024);
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
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

}  // namespace glossa
