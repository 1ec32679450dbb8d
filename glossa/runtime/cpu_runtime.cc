#include "glossa/runtime/cpu_runtime.h"

#include <ATen/Parallel.h>
#include <malloc.h>
#include <pthread.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/runtime/block_cache.h"

extern "C" {
void openblas_set_num_threads(int) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
void openblas_read_env(void) __attribute__((weak));
int openblas_thread_timeout(void) __attribute__((weak));
int blas_thread_init(void) __attribute__((weak));
int blas_thread_shutdown_(void) __attribute__((weak));
}

namespace glossa {
namespace {

// OpenBLAS's idle GEMM threads spin (yielding) for 2^28 cycles, about 0.1 s, after each GEMM
// before they sleep. A spinning thread makes its core look busy, so the scheduler put Glossa's
// kernel worker on the caller's core instead, and the attention core ran no faster on two
// threads than on one (tiny LM layer, fwd+bwd: 23 ms either way; 18.8 ms with the spin cut).
// Unless OPENBLAS_THREAD_TIMEOUT is set, this restarts OpenBLAS's threads with a spin of 2^8
// cycles: they sleep right after each GEMM, and each GEMM wakes them (microseconds).
// Inference is the other way round: its GEMMs are small and follow each other closely, and
// waking the threads for each cost the tiny LM's batch-1 scoring 30% (39k against 57k tokens/s),
// while its kernel loops are mostly too small to split (kernels/parallel.h: ParallelGrain). The
// inference workload keeps OpenBLAS's spin, or gives it back (its value when the process started).
void SetBlasSpin(bool shorten) {
  static int original = -1;  // the timeout OpenBLAS started with; -1: never changed
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr || openblas_read_env == nullptr ||
      openblas_thread_timeout == nullptr || blas_thread_init == nullptr ||
      blas_thread_shutdown_ == nullptr || openblas_set_num_threads == nullptr ||
      openblas_get_num_threads == nullptr) {
    return;
  }
  if (original < 0 && !shorten) return;  // OpenBLAS's own spin, never changed
  if (original < 0) original = openblas_thread_timeout();
  const int want = shorten ? 8 : original;
  if (openblas_thread_timeout() == want) return;
  const int threads = openblas_get_num_threads();
  setenv("OPENBLAS_THREAD_TIMEOUT", std::to_string(want).c_str(), 1);
  openblas_read_env();
  unsetenv("OPENBLAS_THREAD_TIMEOUT");  // not for child processes
  blas_thread_shutdown_();
  blas_thread_init();
  openblas_set_num_threads(threads);
}

}  // namespace

int BlasThreadTimeout() {
  return openblas_thread_timeout != nullptr ? openblas_thread_timeout() : 0;
}


int ProcessCores() {
  int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // Data-parallel workers on one machine (LOCAL_WORLD_SIZE, set by torchrun and by glossa's
  // --nproc_per_node) share its cores.
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE"); local != nullptr) {
    const int n = std::atoi(local);
    if (n > 1) cores = std::max(1, cores / n);
  }
  return cores;
}

std::string ServingLayout::ToString() const {
  return StrCat(replicas, replicas == 1 ? " replica x " : " replicas x ", threads,
                threads == 1 ? " thread" : " threads", " on ", cores,
                cores == 1 ? " core" : " cores", " (weights shared)");
}

ServingLayout ChooseServingLayout(int cores, int replicas, int threads) {
  if (replicas < 0 || threads < 0) {
    throw InvalidArgumentError(StrCat("serving layout: replicas (", replicas, ") and threads (",
                                      threads, ") must be 0 (chosen from the cores) or more"));
  }
  ServingLayout layout;
  layout.cores = std::max(1, cores);
  layout.replicas = replicas > 0 ? replicas : std::max(1, layout.cores / std::max(1, threads));
  layout.threads = threads > 0 ? threads : std::max(1, layout.cores / layout.replicas);
  return layout;
}

CpuRuntimeLayout ApplyServingLayout(const ServingLayout& layout, CpuRuntimeLayout runtime) {
  const int t = std::max(1, layout.threads);
  runtime.aten_threads = std::min(std::max(1, runtime.aten_threads), t);
  at::set_num_threads(runtime.aten_threads);
  if (runtime.blas_threads > 0 && openblas_set_num_threads != nullptr) {
    runtime.blas_threads = std::min(runtime.blas_threads, t);
    openblas_set_num_threads(runtime.blas_threads);
  }
  SetKernelThreads(std::min(KernelThreads(), t), layout.replicas);
  return runtime;
}

CpuRuntimeLayout ConfigureCpuRuntime(int intra_op_threads, bool bf16_compute,
                                     CpuWorkload workload) {
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 * 1024 * 1024);
  InstallLargeBlockCache();  // the blocks above the mmap threshold (glossa/runtime/block_cache.h)
  const int cores = ProcessCores();
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
  // Glossa's own kernels run on ATen's threads, or in the fp32 layout on as many kernel threads
  // as OpenBLAS has cores.
  // GLOSSA_KERNEL_THREADS sets them (1: Glossa's kernels run on the calling thread alone).
  int kernel_threads = layout.aten_threads == 1 ? std::max(1, layout.blas_threads) : 1;
  if (const char* env = std::getenv("GLOSSA_KERNEL_THREADS"); env != nullptr) {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || errno != 0 || n < 1 || n > 1024) {
      throw InvalidArgumentError(StrCat("GLOSSA_KERNEL_THREADS must be an integer from 1 to 1024, got '",
                                        env, "'"));
    }
    kernel_threads = static_cast<int>(n);
  }
  SetKernelThreads(kernel_threads);
  SetBlasSpin(workload == CpuWorkload::kTraining && kernel_threads > 1 && layout.blas_threads > 1);
  return layout;
}

const char* BlasCoreName() {
  return openblas_get_corename != nullptr ? openblas_get_corename() : "";
}

}  // namespace glossa
