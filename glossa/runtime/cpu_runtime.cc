#include "glossa/runtime/cpu_runtime.h"

#ifndef _OPENMP
#error "cpu_runtime.cc must be built with -fopenmp (glossa/CMakeLists.txt)"
#endif

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

// Glossa's kernel threads: workers with one job slot each, statically assigned a chunk per loop.
class KernelPool {
 public:
  static KernelPool& Get() {
    static std::once_flag once;
    std::call_once(once, [] {
      current_ = new KernelPool;  // never destroyed: workers may still be blocked
      // A forked child has none of the workers (fork copies only the calling thread), and the
      // pool's locks may be held: it starts over with a pool of its own, one thread, so its
      // loops run inline instead of waiting for workers that do not exist.
      pthread_atfork(nullptr, nullptr, [] { current_ = new KernelPool; });
    });
    return *current_;
  }

  void SetThreads(int threads) {
    std::lock_guard<std::mutex> run(run_mu_);
    threads_.store(std::max(1, threads));
    while (static_cast<int>(workers_.size()) < threads_.load() - 1) {
      workers_.push_back(std::make_unique<Worker>());
      Worker* w = workers_.back().get();
      w->thread = std::thread([this, w] { WorkerLoop(w); });
      w->thread.detach();
    }
  }
  int threads() const { return threads_.load(); }

  // Runs f over [begin, end) on the caller and up to threads() - 1 workers; false (nothing run)
  // when the pool is busy with another thread's loop or there is a single chunk.
  bool Run(int64_t begin, int64_t end, int64_t grain,
           const std::function<void(int64_t, int64_t)>& f) {
    if (in_loop_) return false;
    const int64_t n = end - begin;
    grain = std::max<int64_t>(grain, 1);
    int64_t chunks = std::min<int64_t>(threads_.load(), (n + grain - 1) / grain);
    const int64_t per = (n + chunks - 1) / std::max<int64_t>(chunks, 1);
    chunks = (n + per - 1) / per;  // none empty (7 over 5 threads: 4 chunks of 2, 2, 2, 1)
    if (chunks <= 1) return false;
    std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
    if (!run.owns_lock()) return false;
    const int blas = openblas_get_num_threads != nullptr ? openblas_get_num_threads() : 1;
    if (blas > 1) openblas_set_num_threads(1);
    error_ = nullptr;
    outstanding_.store(static_cast<int>(chunks - 1));
    for (int64_t c = 1; c < chunks; ++c) {
      Worker* w = workers_[c - 1].get();
      {
        std::lock_guard<std::mutex> lock(w->mu);
        w->f = &f;
        w->lo = begin + c * per;
        w->hi = std::min(end, begin + (c + 1) * per);
        ++w->generation;
      }
      w->cv.notify_one();
    }
    in_loop_ = true;
    std::exception_ptr mine;
    try {
      f(begin, std::min(end, begin + per));
    } catch (...) {
      mine = std::current_exception();
    }
    in_loop_ = false;
    // The workers' chunks take about as long as ours: spin briefly, then sleep.
    for (int i = 0; i < 4000 && outstanding_.load(std::memory_order_acquire) > 0; ++i) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    {
      std::unique_lock<std::mutex> lock(done_mu_);
      done_cv_.wait(lock, [&] { return outstanding_.load(std::memory_order_acquire) == 0; });
    }
    if (blas > 1) openblas_set_num_threads(blas);
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  struct Worker {
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t generation = 0;
    const std::function<void(int64_t, int64_t)>* f = nullptr;
    int64_t lo = 0, hi = 0;
  };

  void WorkerLoop(Worker* w) {
    uint64_t seen = 0;
    while (true) {
      const std::function<void(int64_t, int64_t)>* f;
      int64_t lo, hi;
      {
        std::unique_lock<std::mutex> lock(w->mu);
        w->cv.wait(lock, [&] { return w->generation != seen; });
        seen = w->generation;
        f = w->f;
        lo = w->lo;
        hi = w->hi;
      }
      in_loop_ = true;
      try {
        (*f)(lo, hi);
      } catch (...) {
        std::lock_guard<std::mutex> lock(done_mu_);
        if (!error_) error_ = std::current_exception();
      }
      in_loop_ = false;
      if (outstanding_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(done_mu_);
        done_cv_.notify_one();
      }
    }
  }

  std::mutex run_mu_;  // one loop at a time
  std::atomic<int> threads_{1};
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<int> outstanding_{0};
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::exception_ptr error_;
  static thread_local bool in_loop_;
  static KernelPool* current_;
};

thread_local bool KernelPool::in_loop_ = false;
KernelPool* KernelPool::current_ = nullptr;

// OpenBLAS's idle GEMM threads spin (yielding) for 2^28 cycles, about 0.1 s, after each GEMM
// before they sleep. A spinning thread makes its core look busy, so the scheduler put Glossa's
// kernel worker on the caller's core instead, and the attention core ran no faster on two
// threads than on one (tiny LM layer, fwd+bwd: 23 ms either way; 18.8 ms with the spin cut).
// Unless OPENBLAS_THREAD_TIMEOUT is set, this restarts OpenBLAS's threads with a spin of 2^8
// cycles: they sleep right after each GEMM, and each GEMM wakes them (microseconds).
void ShortenBlasSpin() {
  static bool done = false;
  if (done || std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr || openblas_read_env == nullptr ||
      openblas_thread_timeout == nullptr || blas_thread_init == nullptr ||
      blas_thread_shutdown_ == nullptr || openblas_set_num_threads == nullptr ||
      openblas_get_num_threads == nullptr) {
    return;
  }
  done = true;
  const int threads = openblas_get_num_threads();
  setenv("OPENBLAS_THREAD_TIMEOUT", "8", 0);
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

void SetKernelThreads(int threads) { KernelPool::Get().SetThreads(threads); }
int KernelThreads() { return KernelPool::Get().threads(); }

void KernelParallelFor(int64_t begin, int64_t end, int64_t grain,
                       const std::function<void(int64_t, int64_t)>& f) {
  if (begin >= end) return;
  if (at::get_num_threads() > 1 || at::in_parallel_region()) {
    // This file is built with -fopenmp: ATen's OpenMP threads (at::parallel_for runs inline in
    // code built without it).
    at::parallel_for(begin, end, grain, [&f](int64_t lo, int64_t hi) { f(lo, hi); });
    return;
  }
  if (KernelPool::Get().threads() > 1 && KernelPool::Get().Run(begin, end, grain, f)) return;
  f(begin, end);
}

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
  if (kernel_threads > 1 && layout.blas_threads > 1) ShortenBlasSpin();
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
