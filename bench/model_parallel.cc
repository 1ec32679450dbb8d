// The expert all-to-all alone: Distributed::AllToAll (c10d alltoall_base over Gloo, what the
// expert mesh axis runs) on a float32 tensor of --bytes per rank, every rank started from the
// environment (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT) as bench/model_parallel.sh starts them
// beside PyTorch's all_to_all_single on the same bytes (bench/model_parallel.py). Rank 0 prints
// the median milliseconds of --reps exchanges after 3 warm-up ones.
//   WORLD_SIZE=2 RANK=r MASTER_PORT=p bench_model_parallel --bytes=524288 --reps=20
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
  auto f = bench::ParseFlags(argc, argv, {{"bytes", "524288"}, {"reps", "20"}});
  const std::optional<DistributedOptions> o = DistributedOptionsFromEnv();
  if (!o || o->world_size < 2) {
    std::fprintf(stderr, "bench_model_parallel: start 2 or more ranks (WORLD_SIZE, RANK)\n");
    return 1;
  }
  // The process as `glossa train` sets it up (threads, the allocator's thresholds).
  ConfigureCpuRuntime(1, false);
  Distributed dist(*o);
  const int64_t n = o->world_size;
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
  if (o->rank == 0) {
    std::printf("glossa_alltoall_ms %.3f bytes %lld ranks %lld\n", ms[ms.size() / 2],
                static_cast<long long>(rows * 64 * 4), static_cast<long long>(n));
  }
  return 0;
}
