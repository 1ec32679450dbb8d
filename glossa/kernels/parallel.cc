#include "glossa/kernels/parallel.h"

#ifndef _OPENMP
#error "parallel.cc must be built with -fopenmp (glossa/CMakeLists.txt)"
#endif

#include <ATen/Parallel.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

extern "C" {
void openblas_set_num_threads(int) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
}

namespace glossa {
namespace {

// How long a worker spins (yielding) for the next loop before it sleeps.
constexpr int64_t kSpinMicros = 200;

// Glossa's kernel threads: workers with one job slot each, statically assigned a chunk per loop.
// They come in groups of threads - 1 (the caller is the group's other thread): a loop takes a
// free group, so as many loops as there are groups run at once on workers of their own (glossa
// serve's replicas), and a loop that finds every group busy runs inline.
class KernelPool {
 public:
  static constexpr int kMaxGroups = 256;

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

  void SetThreads(int threads, int groups) {
    std::lock_guard<std::mutex> config(config_mu_);
    threads = std::max(1, threads);
    groups = std::clamp(groups, 1, kMaxGroups);
    for (int g = 0; g < groups; ++g) {
      if (groups_[g] == nullptr) groups_[g] = std::make_unique<Group>();
      Group& group = *groups_[g];
      std::lock_guard<std::mutex> run(group.run_mu);
      while (static_cast<int>(group.workers.size()) < threads - 1) {
        group.workers.push_back(std::make_unique<Worker>());
        Worker* w = group.workers.back().get();
        w->group = &group;
        w->thread = std::thread([w] { WorkerLoop(w); });
        w->thread.detach();
      }
    }
    threads_.store(threads);
    groups_in_use_.store(groups, std::memory_order_release);
  }
  int threads() const { return threads_.load(); }
  int groups() const { return groups_in_use_.load(); }
  // Whether this thread runs a chunk of a loop (the caller's or a worker's, or a whole loop that
  // ran inline).
  static bool InLoop() { return in_loop_; }
  // f(begin, end) on this thread as one chunk: the loops nested in it run inline too, as they do
  // in a chunk the pool ran. (Unmarked, a loop of one chunk let its nested loops spread over the
  // workers while the caller's chunk was not done with its own state.)
  static void RunInline(int64_t begin, int64_t end,
                        const std::function<void(int64_t, int64_t)>& f) {
    struct Mark {
      bool saved = in_loop_;
      Mark() { in_loop_ = true; }
      ~Mark() { in_loop_ = saved; }
    } mark;
    f(begin, end);
  }

  // Runs f over [begin, end) on the caller and up to threads() - 1 workers of a free group; false
  // (nothing run) when every group is busy with another thread's loop or there is a single chunk.
  bool Run(int64_t begin, int64_t end, int64_t grain,
           const std::function<void(int64_t, int64_t)>& f) {
    if (in_loop_) return false;
    const int64_t n = end - begin;
    grain = std::max<int64_t>(grain, 1);
    if ((n + grain - 1) / grain <= 1) return false;
    const int groups = groups_in_use_.load(std::memory_order_acquire);
    for (int g = 0; g < groups; ++g) {
      Group& group = *groups_[g];
      std::unique_lock<std::mutex> run(group.run_mu, std::try_to_lock);
      if (!run.owns_lock()) continue;
      const int64_t workers = std::min<int64_t>(threads_.load() - 1, group.workers.size());
      int64_t chunks = std::min<int64_t>(workers + 1, (n + grain - 1) / grain);
      const int64_t per = (n + chunks - 1) / std::max<int64_t>(chunks, 1);
      chunks = (n + per - 1) / per;  // none empty (7 over 5 threads: 4 chunks of 2, 2, 2, 1)
      if (chunks <= 1) return false;
      BlasHold hold;
      RunOn(group, begin, end, per, chunks, f);
      return true;
    }
    return false;
  }

 private:
  struct Group;
  struct Worker {
    Group* group = nullptr;
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t generation = 0;
    std::atomic<uint64_t> generation_seen{0};  // generation, readable without the lock
    // A chunk posted and not yet started (by this worker, or taken back by the caller).
    bool posted = false;
    const std::function<void(int64_t, int64_t)>* f = nullptr;
    int64_t lo = 0, hi = 0;
  };
  struct Group {
    std::mutex run_mu;  // one loop at a time
    std::vector<std::unique_ptr<Worker>> workers;
    std::atomic<int> outstanding{0};
    std::mutex done_mu;
    std::condition_variable done_cv;
    std::exception_ptr error;
  };

  // OpenBLAS is held to one thread while any loop runs (its GEMMs inside a chunk run one per
  // thread); the first loop to start saves its thread count and the last to end restores it, so
  // loops of several groups at once never restore it under each other.
  struct BlasHold {
    BlasHold() {
      std::lock_guard<std::mutex> lock(blas_mu_);
      if (blas_holders_++ == 0) {
        blas_saved_ = openblas_get_num_threads != nullptr ? openblas_get_num_threads() : 1;
        if (blas_saved_ > 1) openblas_set_num_threads(1);
      }
    }
    ~BlasHold() {
      std::lock_guard<std::mutex> lock(blas_mu_);
      if (--blas_holders_ == 0 && blas_saved_ > 1) openblas_set_num_threads(blas_saved_);
    }
  };

  // The loop on `group` (its run_mu held): chunk 0 on the caller, chunks 1.. on its workers.
  static void RunOn(Group& group, int64_t begin, int64_t end, int64_t per, int64_t chunks,
                    const std::function<void(int64_t, int64_t)>& f) {
    group.error = nullptr;
    group.outstanding.store(static_cast<int>(chunks - 1));
    for (int64_t c = 1; c < chunks; ++c) {
      Worker* w = group.workers[c - 1].get();
      {
        std::lock_guard<std::mutex> lock(w->mu);
        w->f = &f;
        w->lo = begin + c * per;
        w->hi = std::min(end, begin + (c + 1) * per);
        w->posted = true;
        ++w->generation;
        w->generation_seen.store(w->generation, std::memory_order_release);
      }
      w->cv.notify_one();
    }
    in_loop_ = true;
    std::exception_ptr mine;
    try {
      f(begin, std::min(end, begin + per));
      // A worker that has not started its chunk yet (waking one takes 10-30 µs, longer than a
      // small loop's chunk) gives it up to the caller, which runs it now rather than wait: the
      // chunks, and so every index's arithmetic, are the same whoever runs them.
      for (int64_t c = 1; c < chunks; ++c) {
        Worker* w = group.workers[c - 1].get();
        bool take = false;
        {
          std::lock_guard<std::mutex> lock(w->mu);
          take = w->posted;
          w->posted = false;
        }
        if (!take) continue;
        group.outstanding.fetch_sub(1, std::memory_order_acq_rel);  // (the caller's now, even if it throws)
        f(begin + c * per, std::min(end, begin + (c + 1) * per));
      }
    } catch (...) {
      mine = std::current_exception();
      // The chunks not started are not run: withdrawn, so the wait below does not wait for them.
      for (int64_t c = 1; c < chunks; ++c) {
        Worker* w = group.workers[c - 1].get();
        std::lock_guard<std::mutex> lock(w->mu);
        if (w->posted) {
          w->posted = false;
          group.outstanding.fetch_sub(1, std::memory_order_acq_rel);
        }
      }
    }
    in_loop_ = false;
    // The workers' chunks take about as long as ours: spin briefly, then sleep.
    for (int i = 0; i < 4000 && group.outstanding.load(std::memory_order_acquire) > 0; ++i) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    {
      std::unique_lock<std::mutex> lock(group.done_mu);
      group.done_cv.wait(lock, [&] { return group.outstanding.load(std::memory_order_acquire) == 0; });
    }
    if (mine) std::rethrow_exception(mine);
    if (group.error) std::rethrow_exception(group.error);
  }

  static void WorkerLoop(Worker* w) {
    Group& group = *w->group;
    // The pool runs loops only while ATen has one thread (the fp32 layout), and a worker's ATen
    // ops must run as the caller's do. OpenMP's thread count is per thread, and ATen sets a
    // thread's own from its global count once, on the thread's first query: a worker first
    // asked while ATen had 2 threads would keep 2, and the ATen ops in its chunks (and a nested
    // at::parallel_for) would fork OpenMP threads of their own. Before each chunk (never at the
    // thread's start, which could race with a process that exits at once: a short command's
    // error path then corrupted the heap), settle ATen's lazy setting once and hold this thread
    // to one OpenMP thread.
    bool settled = false;
    uint64_t seen = 0;
    while (true) {
      const std::function<void(int64_t, int64_t)>* f;
      int64_t lo, hi;
      // Spin a while before sleeping: loops come in quick succession (a scoring pass runs one
      // every few µs), and on a VM a core left idle halts, so the next loop's wake-up waits for
      // the hypervisor to run it again (tens of µs; OpenBLAS's threads, which spin and yield for
      // a long time after each GEMM, hid this whenever a GEMM had run just before). Yielding
      // each round leaves the core to any thread that has work.
      {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
        for (int i = 0; w->generation_seen.load(std::memory_order_acquire) == seen; ++i) {
#if defined(__x86_64__)
          __builtin_ia32_pause();
#endif
          if ((i & 63) == 63) {
            if (std::chrono::steady_clock::now() > until) break;
            sched_yield();
          }
        }
      }
      {
        std::unique_lock<std::mutex> lock(w->mu);
        w->cv.wait(lock, [&] { return w->generation != seen; });
        seen = w->generation;
        if (!w->posted) continue;  // the caller ran it (f may be gone already)
        w->posted = false;
        f = w->f;
        lo = w->lo;
        hi = w->hi;
      }
      if (!settled) {
        (void)at::get_num_threads();
        settled = true;
      }
      if (omp_get_max_threads() != 1) omp_set_num_threads(1);
      in_loop_ = true;
      try {
        (*f)(lo, hi);
      } catch (...) {
        std::lock_guard<std::mutex> lock(group.done_mu);
        if (!group.error) group.error = std::current_exception();
      }
      in_loop_ = false;
      if (group.outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(group.done_mu);
        group.done_cv.notify_one();
      }
    }
  }

  std::mutex config_mu_;  // SetThreads
  std::atomic<int> threads_{1};
  std::atomic<int> groups_in_use_{0};
  std::unique_ptr<Group> groups_[kMaxGroups];  // created by SetThreads, never destroyed
  static std::mutex blas_mu_;
  static int blas_holders_;
  static int blas_saved_;
  // per-thread (not carried): whether this thread runs a kernel loop's chunk now.
  static thread_local bool in_loop_;
  static KernelPool* current_;
};

thread_local bool KernelPool::in_loop_ = false;  // per-thread (not carried)
KernelPool* KernelPool::current_ = nullptr;
std::mutex KernelPool::blas_mu_;
int KernelPool::blas_holders_ = 0;
int KernelPool::blas_saved_ = 1;

}  // namespace

int64_t ParallelGrain(int64_t work_per_item) {
  const int64_t w = std::max<int64_t>(1, work_per_item);
  return std::max<int64_t>(1, (kParallelMinWork + w - 1) / w);
}

void SetKernelThreads(int threads, int groups) { KernelPool::Get().SetThreads(threads, groups); }
int KernelThreads() { return KernelPool::Get().threads(); }
int KernelLoopGroups() { return KernelPool::Get().groups(); }

void KernelParallelFor(int64_t begin, int64_t end, int64_t grain,
                       const std::function<void(int64_t, int64_t)>& f) {
  if (begin >= end) return;
  // Nested in a chunk of a pool loop: inline, on this thread (checked first: ATen's thread count
  // on a worker is not the caller's to go by).
  if (KernelPool::InLoop()) {
    f(begin, end);
    return;
  }
  if (at::get_num_threads() > 1 || at::in_parallel_region()) {
    // This file is built with -fopenmp: ATen's OpenMP threads (at::parallel_for runs inline in
    // code built without it).
    at::parallel_for(begin, end, grain, [&f](int64_t lo, int64_t hi) { f(lo, hi); });
    return;
  }
  if (KernelPool::Get().threads() > 1 && KernelPool::Get().Run(begin, end, grain, f)) return;
  KernelPool::RunInline(begin, end, f);
}

}  // namespace glossa
