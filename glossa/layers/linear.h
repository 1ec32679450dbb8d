// ProjectionLayer and FCLayer: y = activation(x·w + b), with optional paddings that zero padded
// positions (Lingvo's ProjectionLayer / FCLayer).
//
//   auto p = FCLayer::Params();
//   p.Set("name", "fc").Set("input_dim", 8).Set("output_dim", 4).Set("activation", "GELU");
//   at::Tensor y = fc->FProp(fc->theta(), x);          // x [..., 8] -> y [..., 4]
#pragma once

#include "glossa/layers/base_layer.h"

namespace glossa {

class ProjectionLayer : public BaseLayer, public Block {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs, paddings=None) -> Tensor.
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + input_dim, output_dim, activation ('RELU'), has_bias (False), bias_init (0.0),
  // weight_split_dims_mapping (None).
  static glossa::Params Params();
  explicit ProjectionLayer(const glossa::Params& p);
  // inputs [..., input_dim]; paddings (optional) [...] or [..., 1], 1 = padded: those outputs are
  // 0.
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs,
                   const at::Tensor& paddings = {}) const;
  // As a block, [B, T] paddings apply to [B, T, D] inputs; others are ignored.
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor& paddings) const override;
  // The inference plan's form of w (glossa/kernels/compute_plan.h): a whole w, under "w".
  void PrepareWeights(const NestedMap& theta, ComputePlan& plan) const override;

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  friend class FusedStepBuilder;  // the fused decoding step (glossa/layers/fused_step.cc)
  int64_t input_dim_, output_dim_;  // this rank's (of a split w)
  std::string activation_;
  bool has_bias_;
  // The model axis w is split over (weight_split_dims_mapping); null: whole.
  MeshAxis* axis_ = nullptr;
  bool row_parallel_ = false;  // split along the input dim (else the output's)
};

// A ProjectionLayer with has_bias = True.
class FCLayer : public ProjectionLayer {
 public:
  static glossa::Params Params();
  explicit FCLayer(const glossa::Params& p) : ProjectionLayer(p) {}
};

// Zeroes padded positions: x · (1 - paddings), with paddings broadcast over x's trailing dims.
// Returns x itself when no position is padded (CPU).
at::Tensor ApplyPaddings(const at::Tensor& x, const at::Tensor& paddings);
// Whether `paddings` (on the CPU) has any non-zero entry; the last answer is cached per thread.
bool AnyPadding(const at::Tensor& paddings);

}  // namespace glossa
