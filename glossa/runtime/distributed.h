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

#include "glossa/layers/mesh.h"
#include "glossa/optim/learner.h"

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

// A mesh axis over the ranks of `group` (glossa/layers/mesh.h): GShard's expert axis, over the
// whole world or over one row of a data × expert mesh (DistributedMesh). Counts what it exchanged
// (the trainer prints it).
class DistributedMeshAxis : public MeshAxis {
 public:
  explicit DistributedMeshAxis(Distributed& group) : group_(group) {}
  int size() const override { return group_.world_size(); }
  int index() const override { return group_.rank(); }
  at::Tensor ExchangeBlocks(const at::Tensor& input) override {
    const int64_t b = input.numel() * static_cast<int64_t>(input.element_size());
    ++exchanges_;
    bytes_ += b;
    max_bytes_ = std::max(max_bytes_, b);
    return group_.AllToAll(input);
  }
  void SendTo(const at::Tensor& t, int dst) override {
    ++sends_;
    send_bytes_ += t.numel() * static_cast<int64_t>(t.element_size());
    group_.Send(t, dst);
  }
  void RecvFrom(at::Tensor& out, int src) override { group_.Recv(out, src); }
  void Broadcast(at::Tensor& t, int root) override { group_.Broadcast({t}, root); }
  // Exchanges so far, the bytes this rank passed to them (its whole input, its own block
  // included), and the largest input.
  int64_t exchanges() const { return exchanges_; }
  int64_t bytes() const { return bytes_; }
  int64_t max_bytes() const { return max_bytes_; }
  // Point-to-point sends so far and their bytes (a pipeline's micro-batches and gradients).
  int64_t sends() const { return sends_; }
  int64_t send_bytes() const { return send_bytes_; }

 private:
  Distributed& group_;
  int64_t exchanges_ = 0, bytes_ = 0, max_bytes_ = 0, sends_ = 0, send_bytes_ = 0;
};

// GShard's 2-D device mesh, data × expert (`glossa train --mesh=data:2,expert:2`): world rank
// r = d·E + e sits at data index d and expert index e. The E ranks that share d form the expert
// axis (together they hold every expert once, and exchange tokens by all-to-all); the D ranks
// that share e form the data axis (replicas of the same experts, whose gradients they sum).
// Dense variables are replicated on every rank and averaged over the world as in plain data
// parallelism.
//
// GPipe's data × pipe mesh (`--mesh=pipe:S` or `--mesh=data:D,pipe:S`): world rank r = d·S + s
// holds pipeline stage s of every pipelined layer (gpipe.h). The S ranks that share d form the
// pipe axis (one pipeline; they read the same batches, the layers around the pipeline running
// replicated); the D ranks that share s are replicas of the same stage, which average its
// gradients and read different batches. A pipe axis does not combine with an expert axis yet.
struct MeshShape {
  int data = 1, expert = 1, pipe = 1;
  // Where a rank sits on each axis. The rank layout is defined here alone: world rank
  // r = (d·S + s)·E + e, the data index outermost and the expert index fastest (so r = d·S + s on
  // a pipe mesh and r = d·E + e on an expert mesh).
  struct Coordinates {
    int data = 0, pipe = 0, expert = 0;
  };
  Coordinates Of(int rank) const;
  int RankAt(const Coordinates& c) const;
  int64_t world_size() const { return static_cast<int64_t>(data) * pipe * expert; }
  // "data 2 x pipe 2", naming the axes over 1 ("data 1" when none is).
  std::string Describe() const;
};
// "data:D,expert:E" or "data:D,pipe:S" (data may be left out: 1). Empty: the expert axis over
// the whole world (data 1). InvalidArgument naming --mesh for an unknown axis, a size < 1, pipe
// with expert, or a product other than world_size.
MeshShape ParseMesh(const std::string& text, int world_size);

class DistributedMesh {
 public:
  // Every rank of `world` constructs it with the same shape (it forms the subgroups).
  DistributedMesh(Distributed& world, MeshShape shape);
  const MeshShape& shape() const { return shape_; }
  int data_index() const { return data_index_; }
  int expert_index() const { return expert_index_; }
  // The ranks sharing this rank's data index (the world itself when data is 1).
  Distributed& expert_group() { return expert_group_ ? *expert_group_ : world_; }
  // The ranks sharing this rank's expert index; null when data is 1.
  Distributed* data_group() { return data_group_.get(); }
  // Null on a pipe mesh.
  DistributedMeshAxis* expert_axis() { return expert_axis_.get(); }
  // The pipe axis (this rank's pipeline, stage s its rank s); null unless pipe > 1.
  DistributedMeshAxis* pipe_axis() { return pipe_axis_.get(); }
  // The ranks of this rank's pipeline (the world itself when data is 1).
  Distributed& pipe_group() { return pipe_group_ ? *pipe_group_ : world_; }
  int pipe_index() const { return pipe_index_; }
  // How many ranks read different batches (data · expert), and which of them this one is.
  int batch_shards() const { return shape_.data * shape_.expert; }
  int batch_shard() const { return data_index_ * shape_.expert + expert_index_; }

 private:
  // The ranks of a data × `axis` grid (`along`: that axis's coordinate): this rank's row (the
  // ranks sharing its data index, into row_group) and column (the data replicas sharing its index
  // on the axis, into data_group_); nothing when data is 1.
  void FormGrid(const std::string& axis, int MeshShape::Coordinates::*along,
                std::unique_ptr<Distributed>& row_group);
  Distributed& world_;
  MeshShape shape_;
  MeshShape::Coordinates here_;
  int data_index_ = 0, expert_index_ = 0, pipe_index_ = 0;
  std::unique_ptr<Distributed> expert_group_, data_group_, pipe_group_;
  std::unique_ptr<DistributedMeshAxis> expert_axis_, pipe_axis_;
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

// PyTorch DDP's reducer for the Learner (Learner::SetGradientSync): gradients are averaged over
// the ranks in flattened buckets of about bucket_bytes (variables in reverse order, the order
// the backward pass finishes them, one dtype per bucket). With overlap, hooks on the variables'
// gradient accumulators copy each gradient into its bucket as soon as the backward pass has
// finished it, and a full bucket's allreduce starts right away (buckets start in order, so every
// rank issues the same collectives; the first bucket holds 1 MB at most, so that communication
// starts early), while the backward pass goes on; Reduce zero-fills what the loss did not reach,
// starts the remaining buckets, waits for all and hands back the means as views of the buckets.
// Without overlap, Reduce does it all after the backward pass (Distributed::AllReduceMean).
class DataParallelGradientSync : public Learner::GradientSync {
 public:
  DataParallelGradientSync(Distributed& dist, int64_t bucket_bytes = 25 << 20,
                           bool overlap = true);
  ~DataParallelGradientSync() override;
  bool overlaps() const override { return overlap_; }
  void BeforeBackward(const std::vector<at::Tensor>& vars) override;
  void Reduce(std::vector<at::Tensor>& grads) override;
  // Rank-local variables (kExpertShardedCollection, kPipelineStageCollection) stay out of the
  // buckets: their gradient is divided by the world size (SetShardedScale) instead of averaged; the gradient norm sums their squares over
  // the ranks (one small allreduce, only when there are such variables).
  void SetSharded(const std::vector<bool>& sharded) override;
  double GlobalSquaredNorm(double replicated, double sharded) override;
  // On a data × expert mesh: the sharded gradients are summed over `data` (the replicas of this
  // rank's experts) before the division, and their squares over `expert` (every expert once)
  // for the norm. Null: the world is one expert axis.
  void SetShardGroups(Distributed* expert, Distributed* data) {
    shard_norm_group_ = expert;
    shard_data_group_ = data;
  }
  // What this rank's own gradients (of rank-local variables) are multiplied by: 1 / world for
  // experts (the default; each sums every rank's tokens), 1 for pipeline stages (each rank's stage
  // saw the whole batch).
  void SetShardedScale(double scale) { sharded_scale_ = scale; }

  struct Stats {
    int64_t steps = 0;
    int64_t bytes = 0;              // sent into allreduce by this rank, all steps
    int64_t buckets = 0;            // allreduces, all steps
    int64_t early_buckets = 0;      // of those, started while the backward pass still ran
    double exposed_seconds = 0;     // in Reduce: the communication the backward did not hide
  };
  Stats stats() const;

 private:
  struct Core;
  Distributed& dist_;
  int64_t bucket_bytes_;
  bool overlap_;
  std::vector<bool> sharded_;
  double sharded_scale_ = 1.0;
  Distributed* shard_norm_group_ = nullptr;
  Distributed* shard_data_group_ = nullptr;
  std::shared_ptr<Core> core_;
};

}  // namespace glossa
