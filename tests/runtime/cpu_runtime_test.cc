#include "glossa/runtime/cpu_runtime.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <chrono>
#include <set>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/layers/attention.h"
#include "glossa/kernels/fused_xent.h"
#include "glossa/kernels/parallel.h"
#include "glossa/optim/optimizer.h"

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
  // The fp32 layout runs Glossa's kernels on as many threads as OpenBLAS has; bf16 on ATen's.
  if (explicit_one.blas_threads > 0) {
    EXPECT_EQ(KernelThreads(), explicit_one.blas_threads);
  }
  if (explicit_one.blas_threads > 1 && std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) {
    EXPECT_EQ(BlasThreadTimeout(), 8);  // OpenBLAS's idle threads sleep at once
    check_blas(explicit_one);
    EXPECT_EQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), nullptr);  // not left for children
    // Inference gives OpenBLAS its spin back (its default, 2^28 cycles), and training takes it
    // again, the thread counts unchanged.
    const CpuRuntimeLayout inference = ConfigureCpuRuntime(0, false, CpuWorkload::kInference);
    EXPECT_NE(BlasThreadTimeout(), 8);  // 0: OpenBLAS's default
    EXPECT_EQ(inference.blas_threads, cores);
    check_blas(inference);
    EXPECT_EQ(KernelThreads(), cores);
    ConfigureCpuRuntime(0, false);
    EXPECT_EQ(BlasThreadTimeout(), 8);
    check_blas(explicit_one);
  }
  ConfigureCpuRuntime(0, /*bf16_compute=*/true);
  EXPECT_EQ(KernelThreads(), 1);
  at::set_num_threads(saved);
  SetKernelThreads(1);
}

TEST(CpuRuntime, ParallelGrainGivesEachChunkTheMinimumWork) {
  for (int64_t work : {int64_t{1}, int64_t{7}, int64_t{4096}, kParallelMinWork - 1, kParallelMinWork,
                       kParallelMinWork + 1, int64_t{1} << 40}) {
    const int64_t g = ParallelGrain(work);
    EXPECT_GE(g, 1);
    EXPECT_GE(g * work, kParallelMinWork) << work;        // enough work per chunk
    EXPECT_LT((g - 1) * work, kParallelMinWork) << work;  // and no more grain than that needs
  }
  EXPECT_EQ(ParallelGrain(0), kParallelMinWork);  // a free item counts as one unit
  EXPECT_EQ(ParallelGrain(-5), kParallelMinWork);
}

TEST(CpuRuntime, BadKernelThreadsAreAnError) {
  const int saved = at::get_num_threads();
  for (const char* bad : {"", "abc", "0", "-2", "2x", "100000", "99999999999999999999"}) {
    setenv("GLOSSA_KERNEL_THREADS", bad, 1);
    try {
      ConfigureCpuRuntime(0, false);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("GLOSSA_KERNEL_THREADS"), std::string::npos) << e.what();
    }
  }
  setenv("GLOSSA_KERNEL_THREADS", "3", 1);
  ConfigureCpuRuntime(0, false);
  EXPECT_EQ(KernelThreads(), 3);
  unsetenv("GLOSSA_KERNEL_THREADS");
  SetKernelThreads(1);
  at::set_num_threads(saved);
}

// Sets ATen to one thread and Glossa's kernel threads to n for a scope.
class KernelThreadsScope {
 public:
  explicit KernelThreadsScope(int n) : aten_(at::get_num_threads()), kernel_(KernelThreads()) {
    at::set_num_threads(1);
    SetKernelThreads(n);
  }
  ~KernelThreadsScope() {
    SetKernelThreads(kernel_);
    at::set_num_threads(aten_);
  }

 private:
  int aten_, kernel_;
};

// A loop nested in a chunk runs inline on the chunk's thread, in one call, whatever ATen's thread
// count on that thread. A worker whose own OpenMP count stayed 2 (ATen sets a thread's count from
// its global one once, on the thread's first query; here set by hand in a chunk, then the global
// count put back to 1) once ran the nested loop on 2 OpenMP threads: a chunk's nested loop that
// summed into a local saw 8 of 10 in a stress pass.
TEST(CpuRuntime, NestedKernelLoopsRunInlineOnTheChunksThread) {
  KernelThreadsScope scope(2);
  std::atomic<int> primed{0};
  KernelParallelFor(0, 2, 1, [&](int64_t, int64_t) {
    (void)at::get_num_threads();
    at::set_num_threads(2);
    ++primed;
  });
  at::set_num_threads(1);
  ASSERT_EQ(primed.load(), 2) << "the loop did not run a chunk on each of the 2 kernel threads";
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> bad{0};
    KernelParallelFor(0, 2, 1, [&](int64_t, int64_t) {
      const std::thread::id me = std::this_thread::get_id();
      int calls = 0;
      int64_t covered = 0;
      KernelParallelFor(0, 10, 1, [&](int64_t a, int64_t b) {
        if (std::this_thread::get_id() != me) ++bad;
        ++calls;
        covered += b - a;
      });
      if (calls != 1 || covered != 10) ++bad;
    });
    EXPECT_EQ(bad.load(), 0) << "round " << round;
  }
  KernelParallelFor(0, 2, 1, [&](int64_t, int64_t) { at::set_num_threads(1); });
  at::set_num_threads(1);
}

TEST(CpuRuntime, KernelLoopsCoverEachIndexOnceAndPassErrorsOn) {
  for (int threads : {1, 2, 3, 5}) {
    KernelThreadsScope scope(threads);
    for (int64_t n : {1, 2, 7, 1000}) {
      for (int64_t grain : {1, 3, 64}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> calls{0};
        KernelParallelFor(0, n, grain, [&](int64_t lo, int64_t hi) {
          ASSERT_LT(lo, hi);
          ++calls;
          for (int64_t i = lo; i < hi; ++i) ++hits[i];
          // A nested loop runs inline on this thread, also where the outer loop was one chunk
          // run inline (n = 1, or a grain larger than n).
          int64_t inner = 0;
          bool elsewhere = false;
          const std::thread::id me = std::this_thread::get_id();
          KernelParallelFor(0, 10, 1, [&](int64_t a, int64_t b) {
            if (std::this_thread::get_id() != me) elsewhere = true;
            inner += b - a;
          });
          EXPECT_FALSE(elsewhere) << threads << " threads, n " << n << ", grain " << grain;
          EXPECT_EQ(inner, 10);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << i;
        EXPECT_LE(calls.load(), std::max<int64_t>(1, std::min<int64_t>(threads, (n + grain - 1) / grain)));
      }
    }
    // An exception in any chunk (the caller's or a worker's) reaches the caller, and the threads
    // keep working afterwards.
    for (int64_t bad : {0, 999}) {
      EXPECT_THROW(KernelParallelFor(0, 1000, 1,
                                     [&](int64_t lo, int64_t hi) {
                                       if (lo <= bad && bad < hi) throw std::runtime_error("chunk");
                                     }),
                   std::runtime_error);
    }
    // The workers run chunks: the caller's chunk waits (for the event, with a deadline far past
    // any wake-up) until another chunk has started, which only a worker can start while the
    // caller is inside its own. A chunk no worker has started when the caller is done with its
    // own is run by the caller, so at most `threads` threads run chunks and the caller may run
    // several.
    if (threads == 1) continue;  // (one thread: the loop runs inline, nothing else to wait for)
    std::atomic<int64_t> sum{0}, elsewhere{0};
    std::mutex mu;
    std::set<std::thread::id> ids;
    const std::thread::id caller = std::this_thread::get_id();
    KernelParallelFor(0, threads, 1, [&](int64_t lo, int64_t hi) {
      if (lo == 0) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (elsewhere.load() == 0 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
      } else if (std::this_thread::get_id() != caller) {
        ++elsewhere;
      }
      sum += hi - lo;
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    });
    EXPECT_EQ(sum.load(), threads);
    EXPECT_GE(elsewhere.load(), 1);
    EXPECT_GE(static_cast<int>(ids.size()), 2);
    EXPECT_LE(static_cast<int>(ids.size()), threads);
  }
}

// Serving's replicas: each of `groups` callers running a loop at once gets workers of its own.
// Every caller's first chunk waits (for the event, with a deadline far past any wake-up) until
// all callers are inside their loops and its own second chunk has started on another thread,
// which only a worker of its own group can do while the caller is inside its chunk: with one
// group for two callers, the second runs inline and its wait times out.
TEST(CpuRuntime, KernelLoopGroupsRunSeveralCallersLoopsAtOnce) {
  const int saved_aten = at::get_num_threads(), saved_kernel = KernelThreads();
  at::set_num_threads(1);
  for (int threads : {2, 3}) {
    constexpr int kCallers = 2;
    SetKernelThreads(threads, kCallers);
    EXPECT_EQ(KernelLoopGroups(), kCallers);
    std::atomic<int> inside{0}, timed_out{0};
    std::mutex mu;
    std::set<std::thread::id> ids;
    std::vector<std::thread> callers;
    for (int c = 0; c < kCallers; ++c) {
      callers.emplace_back([&] {
        const std::thread::id me = std::this_thread::get_id();
        std::atomic<int> elsewhere{0};
        KernelParallelFor(0, threads, 1, [&](int64_t lo, int64_t) {
          {
            std::lock_guard<std::mutex> lock(mu);
            ids.insert(std::this_thread::get_id());
          }
          if (lo != 0) {
            if (std::this_thread::get_id() != me) ++elsewhere;
            return;
          }
          ++inside;
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          while ((inside.load() < kCallers || elsewhere.load() == 0) &&
                 std::chrono::steady_clock::now() < deadline) {
            std::this_thread::yield();
          }
          if (inside.load() < kCallers || elsewhere.load() == 0) ++timed_out;
        });
      });
    }
    for (auto& t : callers) t.join();
    EXPECT_EQ(timed_out.load(), 0) << threads << " threads";
    // The callers and at least one worker of each group; at most every group's workers.
    EXPECT_GE(static_cast<int>(ids.size()), 2 * kCallers) << threads << " threads";
    EXPECT_LE(static_cast<int>(ids.size()), kCallers * threads) << threads << " threads";
  }
  SetKernelThreads(saved_kernel);
  EXPECT_EQ(KernelLoopGroups(), 1);
  at::set_num_threads(saved_aten);
}

TEST(CpuRuntime, ServingLayoutIsChosenFromTheCores) {
  struct Case {
    int cores, replicas, threads;
    int want_replicas, want_threads;
  };
  for (const Case& c : std::vector<Case>{{2, 0, 0, 2, 1},     // one replica per core
                                         {16, 0, 0, 16, 1},
                                         {1, 0, 0, 1, 1},
                                         {16, 0, 4, 4, 4},    // threads given: cores / threads
                                         {2, 0, 4, 1, 4},     // more threads than cores: 1 replica
                                         {16, 4, 0, 4, 4},    // replicas given: cores / replicas
                                         {2, 1, 0, 1, 2},     // one replica on every core
                                         {2, 8, 0, 8, 1},     // more replicas than cores
                                         {8, 3, 3, 3, 3},     // both given: as given
                                         {0, 0, 0, 1, 1}}) {  // no cores known: one
    const ServingLayout l = ChooseServingLayout(c.cores, c.replicas, c.threads);
    EXPECT_EQ(l.replicas, c.want_replicas) << c.cores << " " << c.replicas << " " << c.threads;
    EXPECT_EQ(l.threads, c.want_threads) << c.cores << " " << c.replicas << " " << c.threads;
  }
  EXPECT_EQ(ChooseServingLayout(2, 0, 0).ToString(), "2 replicas x 1 thread on 2 cores (weights shared)");
  EXPECT_EQ(ChooseServingLayout(1, 1, 1).ToString(), "1 replica x 1 thread on 1 core (weights shared)");
  EXPECT_THROW(ChooseServingLayout(2, -1, 0), InvalidArgumentError);
  EXPECT_THROW(ChooseServingLayout(2, 0, -3), InvalidArgumentError);
  // Applied: ATen, OpenBLAS and the kernel threads held to a replica's threads, a kernel group per
  // replica.
  const int saved = at::get_num_threads();
  const CpuRuntimeLayout runtime = ConfigureCpuRuntime(0, false, CpuWorkload::kInference);
  const CpuRuntimeLayout applied = ApplyServingLayout(ChooseServingLayout(ProcessCores(), 3, 1), runtime);
  EXPECT_EQ(applied.aten_threads, 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  if (runtime.blas_threads > 0) {
    EXPECT_EQ(applied.blas_threads, 1);
  }
  EXPECT_EQ(KernelThreads(), 1);
  EXPECT_EQ(KernelLoopGroups(), 3);
  SetKernelThreads(1);
  at::set_num_threads(saved);
  ConfigureCpuRuntime(0, false);
  at::set_num_threads(saved);
  SetKernelThreads(1);
}

// A forked child (the workers are not copied) runs its loops inline instead of waiting for them.
TEST(CpuRuntime, AForkedChildRunsKernelLoopsWithoutTheWorkers) {
  KernelThreadsScope scope(2);
  KernelParallelFor(0, 100, 1, [](int64_t, int64_t) {});  // the workers exist
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);  // a hang kills the child, and the parent sees the signal
    int64_t sum = 0;
    KernelParallelFor(0, 100, 1, [&](int64_t lo, int64_t hi) { sum += hi - lo; });
    _exit(sum == 100 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::atomic<int64_t> sum{0};
  KernelParallelFor(0, 100, 1, [&](int64_t lo, int64_t hi) { sum += hi - lo; });  // parent: still
  EXPECT_EQ(sum.load(), 100);
}

// The kernels that run their loops on the kernel threads (the strided attention core, the
// attention softmax, the fused cross-entropy's forward, Adam) give bit-identical results on any
// number of them.
TEST(CpuRuntime, KernelsGiveTheSameBitsOnAnyNumberOfThreads) {
  Params p = MultiHeadedAttention::Params();
  p.Set("name", "atten").Set("random_seed", 3).Set("input_dim", 16).Set("num_heads", 4);
  auto atten = InstantiateLayer<MultiHeadedAttention>(p);
  at::manual_seed(11);
  const at::Tensor x = at::randn({3, 9, 16});
  at::Tensor paddings = at::zeros({3, 9});
  paddings.narrow(1, 6, 3).select(0, 1).fill_(1.0);
  const at::Tensor logits = at::randn({2000, 50}), labels = at::randint(0, 50, {2000}, at::kLong);
  const at::Tensor w0 = at::randn({70000}), g = at::randn({70000});
  struct Outputs {
    std::vector<at::Tensor> tensors;
  };
  auto run = [&]() {
    Outputs out;
    NestedMap theta = atten->theta();
    std::vector<at::Tensor> leaves = theta.FlattenTensors();
    for (auto& t : leaves) t.requires_grad_(true);
    at::Tensor xi = x.clone().requires_grad_(true);
    auto [y, probs] = atten->FProp(theta, xi, xi, xi, paddings, /*causal=*/true);
    (y * y).sum().backward();
    out.tensors = {y.detach(), probs.detach(), xi.grad()};
    for (auto& t : leaves) out.tensors.push_back(t.grad());
    if (FusedSoftmaxXentSupported()) {
      const SoftmaxXent xe = FusedSoftmaxXent(logits, labels, 0.9, 0.1 / 50, true);
      out.tensors.push_back(xe.xent);
      out.tensors.push_back(xe.argmax);
    }
    auto opt = Adam::ParamsB().Instantiate<Optimizer>();
    at::Tensor w = w0.clone();
    for (int t = 0; t < 3; ++t) opt->Apply(0.01, {{"w", w, g * (t + 1)}}, t);
    out.tensors.push_back(w);
    return out;
  };
  Outputs one, many;
  {
    KernelThreadsScope scope(1);
    one = run();
  }
  {
    KernelThreadsScope scope(3);
    many = run();
  }
  ASSERT_EQ(one.tensors.size(), many.tensors.size());
  for (size_t i = 0; i < one.tensors.size(); ++i) {
    ASSERT_TRUE(one.tensors[i].defined()) << i;
    EXPECT_TRUE(at::equal(one.tensors[i], many.tensors[i])) << "output " << i;
  }
}

}  // namespace
}  // namespace glossa
