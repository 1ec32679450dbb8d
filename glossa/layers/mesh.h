// Axes of the device mesh that sharded layers spread their weights over (GShard's expert axis,
// GPipe's stages, tensor parallelism's model axis), as seen from a layer: this rank's index on the axis, the axis's size, and the
// exchanges among its ranks. The runtime provides the axes (glossa/runtime/distributed.h:
// DistributedMeshAxis, over c10d) in the BuildContext it builds the model with; each layer keeps
// its context (BaseLayer::build_context()), so which shard a rank holds is decided when the layer
// is built, from its Params and the mesh, never by what a thread has in scope.
//
//   BuildContext ctx = BuildContext().WithAxis("expert", &axis);
//   auto model = InstantiateLayer<BaseModel>(params, ctx);  // every layer under it has ctx
//   MeshAxis* axis = build_context().axis("expert");        // in a layer; null: not sharded
//   at::Tensor y = AllToAll(*axis, x);                      // differentiable; block j to rank j
#pragma once

#include <ATen/core/Tensor.h>

#include "glossa/core/params.h"

#include <string>
#include <utility>
#include <vector>

namespace glossa {

class MeshAxis {
 public:
  virtual ~MeshAxis() = default;
  virtual int size() const = 0;
  virtual int index() const = 0;
  // input [size · n, ...] (contiguous): block j (rows j·n … j·n + n − 1) goes to the axis's rank
  // j; the result holds in block i what rank i sent to this rank. Every rank of the axis calls it
  // with the same shape. Not differentiable (see AllToAll below).
  virtual at::Tensor ExchangeBlocks(const at::Tensor& input) = 0;
  // Point to point along the axis (what pipeline stages on different ranks pass micro-batches
  // and their gradients with, as Lingvo's cross-device Channel): `t` to the axis's rank `dst`,
  // or into `out` (the shape and dtype sent) from rank `src`; between two ranks, in send order.
  // The default: UnimplementedError naming the axis kind.
  virtual void SendTo(const at::Tensor& t, int dst);
  virtual void RecvFrom(at::Tensor& out, int src);
  // Rank `root`'s `t` (contiguous, the same shape and dtype on every rank) everywhere, in place:
  // what a pipeline's last stage hands its output to every rank with.
  virtual void Broadcast(at::Tensor& t, int root);
  // The sum of every rank's `t` (contiguous, the same shape and dtype on every rank) everywhere,
  // in place: what a model axis's row-parallel projections combine their partial products with.
  virtual void AllReduceSum(at::Tensor& t);
};

// What a layer is built for beyond its Params: the mesh axes this process's rank sits on, by name
// ("expert", "pipe", "model"), and the collections its variables join. A layer whose Params shard it over an axis builds this rank's shard when its
// context has that axis, and the whole layer (every shard, in one process) when it has not.
// Copied into every layer of a model at construction: the axes must outlive the model.
class BuildContext {
 public:
  BuildContext() = default;
  // With `axis` as `name` (replacing one of that name); a null axis or one of size 1 removes it.
  BuildContext& WithAxis(const std::string& name, MeshAxis* axis);
  // The axis named `name`, or null (the layer is not sharded over it).
  MeshAxis* axis(const std::string& name) const;
  // With every variable the layers create joining `collection` too (a pipeline stage's cells
  // are built with kPipelineStageCollection: BaseLayer::CreateChildrenIn).
  BuildContext& WithCollection(const std::string& collection);
  const std::vector<std::string>& collections() const { return collections_; }

 private:
  std::vector<std::pair<std::string, MeshAxis*>> axes_;
  std::vector<std::string> collections_;
};

// A weight's split over a mesh axis, from Lingvo's `weight_split_dims_mapping`: one entry per
// dim of the weight, None (that dim is not split) or the name of a mesh axis (e.g.
// [None, "model"]: columns split over the "model" axis). At most one dim is split.
struct WeightSplit {
  int64_t dim = -1;  // -1: not split
  std::string axis;
  // The context's axis for it; null when not split or the context lacks the axis (the layer is
  // then built whole, as in one process).
  MeshAxis* Resolve(const BuildContext& context) const {
    return dim < 0 ? nullptr : context.axis(axis);
  }
};
// From a mapping value (None, or a list of `rank` entries each None or an axis name);
// InvalidArgument naming `what` (the layer and field) otherwise.
WeightSplit ParseWeightSplit(const ParamValue& mapping, int64_t rank, const std::string& what);
// The mapping value for a weight of `rank` dims split along `dim` over `axis`.
ParamValue WeightSplitMapping(int64_t rank, int64_t dim, const std::string& axis);

// ExchangeBlocks with a gradient: the adjoint of sending block j to rank j is sending the
// gradient's block i back to rank i, the same exchange. Every rank must run the backward pass
// too (each rank's backward calls the exchange once per forward call, in reverse order).
at::Tensor AllToAll(MeshAxis& axis, const at::Tensor& input);

// Megatron's conjugate pair for tensor parallelism on a model axis (every rank of the axis calls
// them in the same order, forward and backward):
// ReduceOverAxis: the sum of `input` over the axis's ranks; its gradient passes through as it is
// (each rank's partial product's gradient is the whole output's). What a row-parallel
// projection's output goes through.
at::Tensor ReduceOverAxis(MeshAxis& axis, const at::Tensor& input);
// ReplicateOverAxis: `input` itself (the same on every rank); its gradient is the sum of the
// ranks' gradients (each rank's computation saw only its shard of what the input feeds). What a
// replicated tensor goes through before sharded computation reads it: a column-parallel
// projection's input, a replicated variable every shard uses.
at::Tensor ReplicateOverAxis(MeshAxis& axis, const at::Tensor& input);

}  // namespace glossa
