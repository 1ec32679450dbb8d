// The model-parallel communication alone, every rank started from the environment (WORLD_SIZE,
// RANK, MASTER_ADDR, MASTER_PORT) as bench/model_parallel.sh starts them beside PyTorch's own on
// the same bytes (bench/model_parallel.py):
//   --op=alltoall: the expert all-to-all, Distributed::AllToAll (c10d alltoall_base over Gloo,
//     what the expert mesh axis runs) on a float32 tensor of --bytes per rank; rank 0 prints the
//     median milliseconds of --reps exchanges after 3 warm-up ones.
//   --op=sendrecv: a pipeline's micro-batch of --bytes passed down the ranks 0 -> 1 -> ... -> n-1
//     by Distributed::Send/Recv (what the pipe axis runs); the last rank prints the median
//     milliseconds per hop.
//   --op=allreduce: a model axis's sum of --bytes (Distributed::AllReduceSum, c10d allreduce over
//     Gloo), median milliseconds printed by rank 0.
//   WORLD_SIZE=2 RANK=r MASTER_PORT=p bench_model_parallel --op=alltoall --bytes=524288 --reps=20
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/runtime/distributed.h"

int main(int argc, char** argv) {
  using namespace glossa;
  auto f = bench::ParseFlags(argc, argv, {{"bytes", "524288"}, {"reps", "20"}, {"op", "alltoall"}});
  const std::optional<DistributedOptions> o = DistributedOptionsFromEnv();
  if (!o || o->world_size < 2) {
    std::fprintf(stderr, "bench_model_parallel: start 2 or more ranks (WORLD_SIZE, RANK)\n");
    return 1;
  }
  // The process as `glossa train` sets it up (threads, the allocator's thresholds).
  ConfigureCpuRuntime(1, false);
  Distributed dist(*o);
  const int64_t n = o->world_size;
  const int r = o->rank;
  if (f["op"] == "sendrecv") {
    const at::Tensor x = at::randn({std::max<int64_t>(1, std::stoll(f["bytes"]) / 4)});
    at::Tensor in = at::empty_like(x);
    auto hop = [&] {
      if (r > 0) dist.Recv(in, r - 1);
      if (r + 1 < n) dist.Send(r > 0 ? in : x, r + 1);
    };
    for (int i = 0; i < 3; ++i) hop();
    std::vector<double> ms;
    for (int i = 0; i < std::stoi(f["reps"]); ++i) {
      dist.Barrier();
      const double t0 = bench::Now();
      hop();
      ms.push_back(1e3 * (bench::Now() - t0) / static_cast<double>(n - 1));
    }
    std::sort(ms.begin(), ms.end());
    if (r == n - 1) {
      std::printf("glossa_sendrecv_ms %.3f bytes %lld ranks %lld\n", ms[ms.size() / 2],
                  static_cast<long long>(x.numel() * 4), static_cast<long long>(n));
    }
    return 0;
  }
  if (f["op"] == "allreduce") {
    // A model axis's sum of one block's output (MeshAxis::AllReduceSum: c10d allreduce).
    at::Tensor x = at::randn({std::max<int64_t>(1, std::stoll(f["bytes"]) / 4)});
    for (int i = 0; i < 3; ++i) dist.AllReduceSum({x});
    std::vector<double> ms;
    for (int i = 0; i < std::stoi(f["reps"]); ++i) {
      dist.Barrier();
      const double t0 = bench::Now();
      dist.AllReduceSum({x});
      ms.push_back(1e3 * (bench::Now() - t0));
    }
    std::sort(ms.begin(), ms.end());
    if (r == 0) {
      std::printf("glossa_allreduce_ms %.3f bytes %lld ranks %lld\n", ms[ms.size() / 2],
                  static_cast<long long>(x.numel() * 4), static_cast<long long>(n));
    }
    return 0;
  }
  if (f["op"] != "alltoall") {
    std::fprintf(stderr,
                 "bench_model_parallel: --op must be alltoall, sendrecv or allreduce, got '%s'\n",
                 f["op"].c_str());
    return 1;
  }
  // Rows of 64 floats, a multiple of n of them.
  const int64_t rows = std::max<int64_t>(1, std::stoll(f["bytes"]) / (64 * 4) / n) * n;
  const at::Tensor x = at::randn({rows, 64});
  for (int i = 0; i < 3; ++i) dist.AllToAll(x);
  std::vector<double> ms;
  for (int i = 0; i < std::stoi(f["reps"]); ++i) {
    dist.Barrier();
    const double t0 = bench::Now();
    dist.AllToAll(x);
    ms.push_back(1e3 * (bench::Now() - t0));
  }
  std::sort(ms.begin(), ms.end());
  if (r == 0) {
    std::printf("glossa_alltoall_ms %.3f bytes %lld ranks %lld\n", ms[ms.size() / 2],
                static_cast<long long>(rows * 64 * 4), static_cast<long long>(n));
  }
  return 0;
}
