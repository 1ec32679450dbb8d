// The device mesh over the ranks of a Distributed world (`glossa train --mesh=...`): its shape
// and rank layout (MeshShape, ParseMesh), its axes as process subgroups (DistributedMesh), and a
// mesh axis over one of them for the layers (DistributedMeshAxis, glossa/layers/mesh.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "glossa/layers/mesh.h"
#include "glossa/runtime/distributed.h"

namespace glossa {

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
// Variables no axis splits are replicated on every rank and averaged over the world. The axes
// combine in any subset: a MoE layer inside a pipeline stage (pipe x expert), its experts on an
// expert axis beside dense layers split over a model axis (expert x model: each model shard has
// its own expert group, the MoE layer computed alike on a shard's model ranks).
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
// size < 1, or a product other than world_size.
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
  // pipeline stage and model shard); null when every rank reads the same batches.
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
  // expert with pipe or model: this stage's and model shard's data x expert ranks
  std::unique_ptr<Distributed> batch_group_;
  std::unique_ptr<DistributedMeshAxis> expert_axis_, pipe_axis_, model_axis_;
};

}  // namespace glossa
