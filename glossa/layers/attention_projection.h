// The multi-headed attention's parts with weights (attention.h): the projections to and from
// heads, [B, T, D] <-> [B, T, N, H], and the learned per-dim query scale.
//
//   auto p = MultiHeadedProjectionLayer::Params();
//   p.Set("name", "q").Set("input_dim", 16).Set("num_heads", 4).Set("dim_per_head", 4);
//   at::Tensor q = proj->FProp(proj->theta(), x);   // [B, T, 16] -> [B, T, 4, 4]
#pragma once

#include "glossa/layers/base_layer.h"

namespace glossa {

// Projects [B, T, D] to [B, T, N, H] (or back, as the output projection): w [D, N, H],
// b [N, H] (output projection: b [D]).
class MultiHeadedProjectionLayer : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs) -> Tensor.
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + input_dim, num_heads, dim_per_head, is_output_projection (False), use_bias (True).
  static glossa::Params Params();
  explicit MultiHeadedProjectionLayer(const glossa::Params& p);
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs) const;
  // The inference plan's form of w (glossa/kernels/compute_plan.h), [K, N] as FProp multiplies
  // it: [D, N·H], or an output projection's [N·H, D] transposed once. Not for a block of heads.
  void PrepareWeights(const NestedMap& theta, ComputePlan& plan) const override;

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  friend class FusedStepBuilder;  // the fused decoding step (glossa/layers/fused_step.cc)
  bool is_output_projection_, use_bias_;
  MeshAxis* axis_ = nullptr;  // the heads are split over it (weight_split_dims_mapping)
};

// Scales the last dim by 1.442695041/sqrt(dim) · softplus(per_dim_scale) (1/sqrt(dim) at init).
class PerDimScaleLayer : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs) -> Tensor.
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + dim.
  static glossa::Params Params();
  explicit PerDimScaleLayer(const glossa::Params& p);
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs) const;
  // The scale FProp multiplies by: softplus(per_dim_scale) / (softplus(0)·√dim), [dim].
  at::Tensor Scale(const NestedMap& theta) const;

 private:
  int64_t dim_;
};

}  // namespace glossa
