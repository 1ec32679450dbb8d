# PyTorch's own communication on the bytes bench_model_parallel moves (the communication peer of
# bench/model_parallel.sh), started with the same environment (WORLD_SIZE, RANK, MASTER_ADDR,
# MASTER_PORT):
#   --op=alltoall: all_to_all_single over Gloo on rows of 64 floats, a multiple of the world size,
#     median milliseconds of --reps exchanges after 3 warm-up ones, printed by rank 0;
#   --op=sendrecv: dist.send/dist.recv passing --bytes down the ranks 0 -> ... -> n-1, median
#     milliseconds per hop, printed by the last rank;
#   --op=allreduce: all_reduce (sum) of --bytes, median milliseconds printed by rank 0.
import argparse
import statistics
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--bytes", type=int, default=524288)
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--op", choices=["alltoall", "sendrecv", "allreduce"], default="alltoall")
a = ap.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
n = dist.get_world_size()
r = dist.get_rank()
if a.op == "sendrecv":
    x = torch.randn(max(1, a.bytes // 4))
    buf = torch.empty_like(x)

    def hop():
        if r > 0:
            dist.recv(buf, r - 1)
        if r + 1 < n:
            dist.send(buf if r > 0 else x, r + 1)

    for _ in range(3):
        hop()
    ms = []
    for _ in range(a.reps):
        dist.barrier()
        t0 = time.perf_counter()
        hop()
        ms.append(1e3 * (time.perf_counter() - t0) / (n - 1))
    if r == n - 1:
        print(f"torch_sendrecv_ms {statistics.median(ms):.3f} bytes {x.numel() * 4} ranks {n}")
    dist.destroy_process_group()
    raise SystemExit(0)
if a.op == "allreduce":
    x = torch.randn(max(1, a.bytes // 4))
    for _ in range(3):
        dist.all_reduce(x)
    ms = []
    for _ in range(a.reps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        ms.append(1e3 * (time.perf_counter() - t0))
    if r == 0:
        print(f"torch_allreduce_ms {statistics.median(ms):.3f} bytes {x.numel() * 4} ranks {n}")
    dist.destroy_process_group()
    raise SystemExit(0)
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
