// Axes of the device mesh that sharded layers spread their weights over (GShard's expert axis),
// as seen from a layer: this rank's index on the axis, the axis's size, and an all-to-all among
// its ranks. The runtime provides the axes (glossa/runtime/distributed.h: DistributedMeshAxis,
// over c10d) for the scope of a program; layers find them by name.
//
//   MeshAxisScope scope("expert", &axis);          // this thread, innermost wins
//   MeshAxis* axis = CurrentMeshAxis("expert");   // null: not sharded
//   at::Tensor y = AllToAll(*axis, x);            // differentiable; block j of dim 0 to rank j
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

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
};

// The axis named `name` on this thread (innermost MeshAxisScope), or null.
MeshAxis* CurrentMeshAxis(const std::string& name);

class MeshAxisScope {
 public:
  MeshAxisScope(std::string name, MeshAxis* axis);
  ~MeshAxisScope();
  MeshAxisScope(const MeshAxisScope&) = delete;
  MeshAxisScope& operator=(const MeshAxisScope&) = delete;

 private:
  std::string name_;
  MeshAxis* axis_;
  MeshAxisScope* previous_;
  friend MeshAxis* CurrentMeshAxis(const std::string& name);
};

// ExchangeBlocks with a gradient: the adjoint of sending block j to rank j is sending the
// gradient's block i back to rank i, the same exchange. Every rank must run the backward pass
// too (each rank's backward calls the exchange once per forward call, in reverse order).
at::Tensor AllToAll(MeshAxis& axis, const at::Tensor& input);

}  // namespace glossa
