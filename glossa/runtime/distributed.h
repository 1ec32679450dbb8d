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
  void AllReduceSum(at::Tensor& t) override {
    ++reductions_;
    reduce_bytes_ += t.numel() * static_cast<int64_t>(t.element_size());
    group_.AllReduceSum({t});
  }
  // Exchanges so far, the bytes this rank passed to them (its whole input, its own block
  // included), and the largest input.
  int64_t exchanges() const { return exchanges_; }
  int64_t bytes() const { return bytes_; }
  int64_t max_bytes() const { return max_bytes_; }
  // Point-to-point sends so far and their bytes (a pipeline's micro-batches and gradients).
  int64_t sends() const { return sends_; }
  int64_t send_bytes() const { return send_bytes_; }
  // All-reduces so far (a model axis's row-parallel outputs and replicated inputs' gradients)
  // and their bytes.
  int64_t reductions() const { return reductions_; }
  int64_t reduce_bytes() const { return reduce_bytes_; }

 private:
  Distributed& group_;
  int64_t exchanges_ = 0, bytes_ = 0, max_bytes_ = 0, sends_ = 0, send_bytes_ = 0;
  int64_t reductions_ = 0, reduce_bytes_ = 0;
};

// The device mesh over the ranks (`glossa train --mesh=data:D,pipe:S,expert:E,model:M`, any
// subset; the sizes' product is the world size). Each axis is a set of process groups: the ranks
// that differ only in their index on that axis.
//   data:   replicas that read different batches and average their gradients.
//   expert: GShard's expert axis. Its E ranks hold every expert once and exchange tokens by
//           all-to-all; they read different batches (data and expert together split the batch).
//   pipe:   GPipe's stages (gpipe.h). The S ranks of one pipeline read the same batches; stage s
//           holds the cells of stage s of every pipelined layer.
//   model:  tensor (Megatron / GShard dense) parallelism. The M ranks read the same batches and
//           each holds 1/M of every layer whose Params split its weights over "model" (attention
//           heads, the feed-forward hidden units), with one all-reduce per such block.
// Variables no axis splits are replicated on every rank and averaged over the world. An expert
// axis combines with data and pipe (a MoE layer inside a pipeline stage), not yet with model.
struct MeshShape {
  int data = 1, expert = 1, pipe = 1, model = 1;
  // Where a rank sits on each axis. The rank layout is defined here alone: world rank
  // r = ((d·S + s)·E + e)·M + m, the data index outermost and the model index fastest (a model
  // axis's ranks are neighbours, as Megatron places tensor parallelism inside a host).
  struct Coordinates {
    int data = 0, pipe = 0, expert = 0, model = 0;
  };
  Coordinates Of(int rank) const;
  int RankAt(const Coordinates& c) const;
  int64_t world_size() const { return static_cast<int64_t>(data) * pipe * expert * model; }
  // How many ranks read different batches (data · expert), and which of them rank `c` is.
  int batch_shards() const { return data * expert; }
  int BatchShard(const Coordinates& c) const { return c.data * expert + c.expert; }
  // "data 2 x pipe 2", naming the axes over 1 ("data 1" when none is).
  std::string Describe() const;
};
// "data:D,expert:E", "data:D,pipe:S,model:M", ... (an axis left out: 1). Empty: the expert axis
// over the whole world (data 1). InvalidArgument naming --mesh for an unknown or repeated axis, a
// size < 1, a combination not supported yet (pipe with expert, expert with model), or a product
// other than world_size.
MeshShape ParseMesh(const std::string& text, int world_size);

class DistributedMesh {
 public:
  // Every rank of `world` constructs it with the same shape (it forms the subgroups).
  DistributedMesh(Distributed& world, MeshShape shape);
  const MeshShape& shape() const { return shape_; }
  const MeshShape::Coordinates& here() const { return here_; }
  int data_index() const { return here_.data; }
  int expert_index() const { return here_.expert; }
  int pipe_index() const { return here_.pipe; }
  int model_index() const { return here_.model; }
  // The ranks sharing every index but the expert one (the world itself when it is all of them).
  Distributed& expert_group() { return expert_group_ ? *expert_group_ : world_; }
  // The ranks sharing every index but the data one; null when data is 1.
  Distributed* data_group() { return data_group_.get(); }
  // The axes (null when the mesh has none of that name, or it is of size 1).
  DistributedMeshAxis* expert_axis() { return expert_axis_.get(); }
  // The pipe axis (this rank's pipeline, stage s its rank s).
  DistributedMeshAxis* pipe_axis() { return pipe_axis_.get(); }
  DistributedMeshAxis* model_axis() { return model_axis_.get(); }
  // The ranks of this rank's pipeline (the world itself when it is all of them).
  Distributed& pipe_group() { return pipe_group_ ? *pipe_group_ : world_; }
  // The ranks sharing every index but the model one (the world itself when it is all of them).
  Distributed& model_group() { return model_group_ ? *model_group_ : world_; }
  // How many ranks read different batches (data · expert), and which of them this one is.
  int batch_shards() const { return shape_.batch_shards(); }
  int batch_shard() const { return shape_.BatchShard(here_); }
  // One rank per batch shard, over which metrics are averaged and eval and decode sets split
  // (CurrentBatchGroup): the world when every rank reads its own batches, the data group when
  // pipe or model ranks share theirs (with an expert axis, the data and expert ranks of this
  // pipeline stage); null when every rank reads the same batches.
  Distributed* batch_group();

 private:
  // The ranks that differ from this one only in `along` (size `size`), as a subgroup named after
  // the axis and its first rank; null when that is one rank or the whole world.
  std::unique_ptr<Distributed> FormAxis(const std::string& axis,
                                        int MeshShape::Coordinates::*along, int size);
  Distributed& world_;
  MeshShape shape_;
  MeshShape::Coordinates here_;
  std::unique_ptr<Distributed> expert_group_, data_group_, pipe_group_, model_group_;
  std::unique_ptr<Distributed> batch_group_;  // pipe x expert: this stage's data x expert ranks
  std::unique_ptr<DistributedMeshAxis> expert_axis_, pipe_axis_, model_axis_;
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
  // Rank-local variables (LearnerVariable::rank_local: an expert axis's experts, a pipeline
  // stage's layers, a model axis's blocks) stay out of the buckets. Each is summed over the ranks
  // that hold replicas of the same values but read other rows of the batch (its rule's group: the
  // data group, or a pipeline stage's data x expert ranks), then multiplied by its scale; the
  // global norm counts its squares times its norm weight (1 / the ranks holding the same
  // values), summed over the world in one small allreduce. The rule gives these per variable
  // (ParallelPlan::Configure). Without one: the world is one expert axis (scale 1 / world,
  // weight 1, no group).
  struct RankLocalSync {
    double scale = 1.0, norm_weight = 1.0;
    Distributed* group = nullptr;  // null or of one rank: no sum
  };
  using RankLocalRule = std::function<RankLocalSync(const LearnerVariable&)>;
  void SetRankLocalRule(RankLocalRule rule) { rule_ = std::move(rule); }
  void SetVariables(const std::vector<LearnerVariable>& vars) override;
  double NormWeight(size_t k) const override;
  double GlobalSquaredNorm(double replicated, double sharded) override;

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
  std::vector<double> sharded_scale_, norm_weight_;  // per variable (rank-local ones)
  std::vector<Distributed*> sum_group_;               // per variable (rank-local ones)
  RankLocalRule rule_;
  std::shared_ptr<Core> core_;
};

}  // namespace glossa
