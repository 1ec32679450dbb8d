// Process setup for training, serving and benchmarks: the thread layout (ATen, OpenBLAS and the
// kernel threads of glossa/kernels/parallel.h), the allocator and the BLAS kernel choice.
//
// On a CPU, ATen's intra-op OpenMP threads and OpenBLAS's own GEMM threads oversubscribe the cores
// when both use all of them (measured on 2 cores: the tiny LM trains 2.4x slower). The layout:
//   fp32 compute: ATen 1 intra-op thread, OpenBLAS all cores (GEMMs dominate and run in OpenBLAS);
//   bf16 compute: ATen all cores (oneDNN GEMMs run on OpenMP threads), OpenBLAS 1 thread.
// An explicit `intra_op_threads` > 0 sets ATen's threads and gives OpenBLAS the rest (at least 1).
// "All cores" is the machine's cores divided by LOCAL_WORLD_SIZE when several data-parallel
// workers share the machine (torchrun and `glossa --nproc_per_node` set it).
// glibc's allocator is kept from returning large blocks to the kernel after each step (mmap
// threshold at its maximum, no trimming): otherwise every step re-faults and zeroes its
// activations' pages (about a third of the 512x6 LM's step time). Blocks above that threshold
// (32 MiB) are cached by Glossa's CPU allocator (glossa/runtime/block_cache.h).
//
//   ConfigureCpuRuntime(/*intra_op_threads=*/0, /*bf16_compute=*/false);
#pragma once

#include <cstdint>
#include <string>

#include "glossa/kernels/parallel.h"  // SetKernelThreads: the layout sets the kernel threads

namespace glossa {

struct CpuRuntimeLayout {
  int aten_threads = 0;
  int blas_threads = 0;  // 0: OpenBLAS not found (its threads left as they are)
};

// kTraining: with kernel threads, OpenBLAS's idle threads sleep right after each GEMM, so that
// the kernel threads' loops get both cores. kInference (the Predictor, glossa serve): they keep
// OpenBLAS's spin, which catches the next of many small GEMMs at once (cpu_runtime.cc).
enum class CpuWorkload { kTraining, kInference };
CpuRuntimeLayout ConfigureCpuRuntime(int intra_op_threads, bool bf16_compute,
                                     CpuWorkload workload = CpuWorkload::kTraining);

// The cores this process may use: the machine's, divided among LOCAL_WORLD_SIZE data-parallel
// workers when several share it.
int ProcessCores();

// Serving's layout (glossa serve): `replicas` batches of a subgraph run at once, each on its own
// batch thread over the one copy of the weights, with `threads` threads each (ATen's, OpenBLAS's
// and a group of kernel threads: SetKernelThreads). Chosen from the cores:
//  - replicas 0 (the default): one per core when threads is 0 too, else cores / threads. Short
//    requests barely split over threads (a 12-word sentence's loops are below ParallelGrain's
//    grain), so one replica per core scores the most under load and loses nothing alone;
//  - threads 0 (the default): cores / replicas, at least 1.
// Replicas x threads may exceed the cores only when both are given.
struct ServingLayout {
  int cores = 1;
  int replicas = 1;
  int threads = 1;
  // "2 replicas x 1 thread on 2 cores (weights shared)"
  std::string ToString() const;
};
// InvalidArgument when replicas or threads is negative.
ServingLayout ChooseServingLayout(int cores, int replicas, int threads);
// Holds ATen's, OpenBLAS's and the kernel threads to `layout.threads` each, with a group of kernel
// threads per replica (call after ConfigureCpuRuntime). Returns the resulting layout.
CpuRuntimeLayout ApplyServingLayout(const ServingLayout& layout, CpuRuntimeLayout runtime);

// OpenBLAS's idle-thread spin, as log2 cycles (0: OpenBLAS's default, 2^28 cycles, or unknown). With kernel threads, the fp32 training
// layout sets it to 8 unless OPENBLAS_THREAD_TIMEOUT says otherwise (cpu_runtime.cc: SetBlasSpin).
int BlasThreadTimeout();

// The kernel set OpenBLAS uses ("" when OpenBLAS is not loaded).
const char* BlasCoreName();

}  // namespace glossa
