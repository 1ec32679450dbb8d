// Data-parallel workers over PyTorch's c10d with its Gloo backend (no transport of our own):
// rendezvous through a c10d TCPStore hosted by rank 0, a ProcessGroupGloo, and the collectives a
// data-parallel trainer needs. Workers read the standard environment (MASTER_ADDR, MASTER_PORT,
// WORLD_SIZE, RANK, LOCAL_RANK), so torchrun, Slurm or a Kubernetes PyTorchJob can launch them.
//
//   std::optional<DistributedOptions> o = DistributedOptionsFromEnv();   // nullopt: one worker
//   Distributed dist(*o);
//   dist.CheckSame("model params", params.ToText());    // FailedPrecondition naming the ranks
//   dist.Broadcast(weights);                            // rank 0's values everywhere
//   dist.AllReduceMean(gradients, /*bucket_bytes=*/25 << 20);
//   auto m = dist.ReduceWeighted({{"loss", {2.3, 512}}});   // weighted means over ranks
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>


namespace glossa {

struct DistributedOptions {
  std::string master_addr = "127.0.0.1";
  // 0 (rank 0 only): the store binds a port the kernel picks, so no other program can take it
  // between a probe and the bind; on_listening(port) is then called before rank 0 waits for the
  // others, which must be told the port (the launcher passes it on; MASTER_PORT=0 prints it).
  int master_port = 29500;
  std::function<void(const std::string& addr, int port)> on_listening;
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;
  // Rendezvous and every collective fail after this long (a lost rank): Aborted.
  double timeout_seconds = 300;
  // Rank 0, waiting at the rendezvous for ranks that have not joined, gives up (Aborted) as soon
  // as this returns true (e.g. SIGTERM from the launcher after another rank failed).
  std::function<bool()> stop_requested;
  std::string backend = "gloo";
  // A subgroup's (Distributed::Subgroup): its name and the world ranks of its ranks, in order
  // (errors name world ranks); empty for the world.
  std::string group;
  std::vector<int> world_ranks;
};

// From MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500), WORLD_SIZE, RANK and
// LOCAL_RANK (default RANK); nullopt when WORLD_SIZE is unset. InvalidArgument naming the variable
// for a value that is not a number or out of range (RANK >= WORLD_SIZE, a port outside 1-65535).
// MASTER_PORT=0 on rank 0: a port the kernel picks, said on stderr ("glossa: rank 0 hosts the
// rendezvous at ADDR:PORT") and written to the file descriptor GLOSSA_RENDEZVOUS_PORT_FD when set
// (the local launcher's pipe); on another rank it is InvalidArgument.
std::optional<DistributedOptions> DistributedOptionsFromEnv();

class Distributed {
 public:
  // Rendezvous: rank 0 hosts the TCPStore on master_port (0: a free one); every rank joins within
  // timeout_seconds or gets Aborted naming the address and this rank.
  // InvalidArgument for an unknown backend (gloo; nccl needs a CUDA build).
  explicit Distributed(const DistributedOptions& options);
  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const DistributedOptions& options() const { return options_; }

  // Root's values of every tensor on every rank, in place (same shapes and dtypes everywhere).
  void Broadcast(const std::vector<at::Tensor>& tensors, int root = 0);
  // The mean over ranks of every tensor, in place. Tensors are flattened into buckets of about
  // bucket_bytes per dtype (one allreduce each; a tensor larger than a bucket is its own bucket),
  // as PyTorch DDP's reducer does. Returns the bytes each rank sent into allreduce.
  int64_t AllReduceMean(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes = 25 << 20);
  // Sums in place.
  void AllReduceSum(const std::vector<at::Tensor>& tensors);
  // name -> (mean, weight) of this rank -> (weighted mean over ranks, summed weight). Every rank
  // must pass the same names (FailedPrecondition otherwise, via CheckSame).
  std::map<std::string, std::pair<double, double>> ReduceWeighted(
      const std::map<std::string, std::pair<double, double>>& metrics);
  // name -> (mean, weight) of this rank -> (weighted mean, summed weight) over the ranks that
  // report each name (ranks may differ: an empty eval shard reports nothing). Through the store:
  // for a few values per program run, not per step.
  std::map<std::string, std::pair<double, double>> GatherWeighted(
      const std::map<std::string, std::pair<double, double>>& metrics);
  // Whether `value` is true on any rank (one small allreduce): how the ranks agree to stop.
  bool AnyTrue(bool value);
  // Every rank's strings, in rank order.
  std::vector<std::string> AllGatherStrings(const std::string& value);
  // FailedPrecondition when some rank's `value` differs from rank 0's, naming `what` and the
  // ranks that differ (values are compared by SHA-256).
  void CheckSame(const std::string& what, const std::string& value);
  void Barrier();
  // All-to-all of equal blocks of dim 0 (c10d's alltoall_base): block j of `input` (contiguous,
  // dim 0 divisible by the world size, the same shape on every rank) goes to rank j; block i of
  // the result came from rank i.
  at::Tensor AllToAll(const at::Tensor& input);
  // Point to point (c10d send/recv: the cross-process form of Lingvo's Channel for pipeline
  // stages): Send blocks until `t` (contiguous) is handed to rank dst's matching Recv, which
  // fills `out` (its shape and dtype must be what was sent). Messages between two ranks with the
  // same tag arrive in send order. A peer that is gone fails after the timeout (Aborted, naming
  // it when it can be told); a rank outside the group or this rank itself is InvalidArgument.
  void Send(const at::Tensor& t, int dst, int tag = 0);
  void Recv(at::Tensor& out, int src, int tag = 0);

  // A process group over the world ranks `ranks` (this rank among them, each once), named
  // `name`, on this group's store and network device: every listed rank must create it (with the
  // same name and ranks), the others do not. Its ranks are positions in `ranks`. What a mesh
  // axis's collectives run over (Mesh below).
  std::unique_ptr<Distributed> Subgroup(const std::string& name, const std::vector<int>& ranks);

 private:
  struct NoRendezvous {};
  Distributed(const DistributedOptions& options, NoRendezvous);
  friend class DataParallelGradientSync;
  struct Impl;
  DistributedOptions options_;
  std::unique_ptr<Impl> impl_;
};

// The workers this thread's programs run over, as Lingvo's cluster_factory.Current(): the
// executor and the eval/decode jobs set it for their run; null for one worker. IsChief(): no
// workers, or rank 0 (the one that writes checkpoints, events and logs).
Distributed* CurrentDistributed();
// The ranks whose batches differ, over which metrics are averaged and eval and decode sets
// split: the current workers, or null when every rank reads the same batches (the stages of a
// pipe mesh, whose metrics are the same on every rank).
Distributed* CurrentBatchGroup();
bool IsChief();
class DistributedScope {
 public:
  explicit DistributedScope(Distributed* dist);
  // `batch_group`: the ranks whose batches differ (CurrentBatchGroup; null: every rank reads the
  // same batches).
  DistributedScope(Distributed* dist, Distributed* batch_group);
  ~DistributedScope();
  DistributedScope(const DistributedScope&) = delete;
  DistributedScope& operator=(const DistributedScope&) = delete;

 private:
  Distributed* previous_;
  Distributed* previous_batch_;
};

}  // namespace glossa
