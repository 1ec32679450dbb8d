# PyTorch's all_to_all_single over Gloo on the bytes bench_model_parallel exchanges (the
# communication peer of bench/model_parallel.sh): rows of 64 floats, a multiple of the world size,
# median milliseconds of --reps exchanges after 3 warm-up ones, printed by rank 0. Started with
# the same environment (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT).
import argparse
import statistics
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--bytes", type=int, default=524288)
ap.add_argument("--reps", type=int, default=20)
a = ap.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
n = dist.get_world_size()
rows = max(1, a.bytes // (64 * 4) // n) * n
x = torch.randn(rows, 64)
y = torch.empty_like(x)
for _ in range(3):
    dist.all_to_all_single(y, x)
ms = []
for _ in range(a.reps):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_to_all_single(y, x)
    ms.append(1e3 * (time.perf_counter() - t0))
if dist.get_rank() == 0:
    print(f"torch_alltoall_ms {statistics.median(ms):.3f} bytes {rows * 64 * 4} ranks {n}")
dist.destroy_process_group()
