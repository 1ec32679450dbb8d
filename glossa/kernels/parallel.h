// The kernel thread pool: parallel loops of Glossa's own kernels (glossa/kernels/).
//
//   KernelParallelFor(0, rows, /*grain=*/16, [&](int64_t lo, int64_t hi) {
//     for (int64_t r = lo; r < hi; ++r) Row(r);
//   });
//
// The process layout (how many kernel threads, against ATen's and OpenBLAS's) is set by
// glossa/runtime/cpu_runtime.h; kernels only use the pool.
#pragma once

#include <cstdint>
#include <functional>

namespace glossa {

// Parallel loops of Glossa's own kernels (attention heads, softmax rows, the fused
// cross-entropy's forward, Adam): f(lo, hi) over [begin, end) in chunks of at least `grain`.
// Where ATen has several intra-op threads (the bf16 layout) they run on them (at::parallel_for).
// In the fp32 layout ATen has one thread and they run on Glossa's kernel threads instead: the
// caller plus workers, woken per loop; between loops a worker spins for up to 200 µs, yielding
// its core to any thread with work (OpenBLAS's GEMM threads), then sleeps. (On a VM an idle core
// halts, and waking a worker there took tens of µs: batch-1 scoring ran 0.75× as fast whenever
// no OpenBLAS thread happened to be spinning on the other core.) The chunks are fixed by the
// range, the grain and the thread count; a chunk no worker has started by the time the caller
// is done with its own is run by the caller, so a late wake-up never makes the caller wait. OpenBLAS is held to one thread while such a
// loop runs (GEMMs inside it, such as the attention core's per-head ones, run one per thread).
// Each index's result must not depend on how the range is split: results are then the same for
// any number of threads. Nested calls, and calls while other threads' loops hold every group (SetKernelThreads), run
// inline.
// The workers do not carry the caller's ThreadState (glossa/base/thread_state.h: that would cost
// a copy per loop): a loop body is arithmetic, and whatever depends on a context (eval mode, the
// int8 or batch-invariant scopes, grad mode) is decided by the caller before the loop.
void KernelParallelFor(int64_t begin, int64_t end, int64_t grain,
                       const std::function<void(int64_t, int64_t)>& f);
// The grain (items per chunk) of a loop whose items cost `work_per_item` units each (a unit: a
// multiply-add, or one element of an exp, a division or a reduction): chunks of at least
// kParallelMinWork units. Waking a sleeping worker costs some 10-30 µs (a futex wake and a
// reschedule), a few times less than 2^20 units take on one core; smaller chunks made the tiny
// LM's batch-1 scoring slower on two kernel threads than on one (its attention heads and softmax
// rows are a few thousand units each), while its training steps ran the same with chunks of 2^16
// to 2^22 units. The rule is per loop and does not depend on the core count.
constexpr int64_t kParallelMinWork = int64_t{1} << 20;
int64_t ParallelGrain(int64_t work_per_item);
// The kernel threads of a loop, the caller included (1: loops run inline). ConfigureCpuRuntime
// sets them to the fp32 layout's BLAS threads, and to 1 in the bf16 layout. `groups`: how many
// callers' loops run at once on workers of their own (glossa serve's replicas,
// glossa/runtime/cpu_runtime.h: ServingLayout): the pool keeps groups x (threads - 1) workers, a
// loop takes a free group's, and a loop that finds every group busy runs inline. OpenBLAS is held
// to one thread while any loop runs.
void SetKernelThreads(int threads, int groups = 1);
int KernelThreads();
int KernelLoopGroups();

}  // namespace glossa
