// LayerNorm and BatchNorm with Lingvo's variables and semantics.
//
//   y = ln->FProp(ln->theta(), x);                  // normalizes the last dim
//   y = bn->FProp(bn->theta(), x, paddings);        // training: batch stats + moving averages
#pragma once

#include "glossa/layers/base_layer.h"

namespace glossa {

// (x - mean) / sqrt(var + epsilon) · (1 + scale) + bias over the last dim; `scale` starts at 0
// (Lingvo's default, direct_scale = False) or is used directly (direct_scale = True, init 1).
class LayerNorm : public BaseLayer, public Block {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs) -> Tensor.
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + input_dim, epsilon (1e-6), direct_scale (False).
  static glossa::Params Params();
  explicit LayerNorm(const glossa::Params& p);
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs) const;
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor&) const override {
    return FProp(theta, x);
  }

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  friend class FusedStepBuilder;  // the fused decoding step (glossa/layers/fused_step.cc)
  int64_t input_dim_;
  double epsilon_;
  bool direct_scale_;
};

// Batch normalization over every dim but the last. Variables: beta, gamma (applied as 1 + gamma),
// and the non-trainable moving_mean and moving_variance. In training the batch statistics (over
// non-padded positions) normalize the input and update the moving averages,
// moving -= (1 - decay)·(moving - batch_stat), in place on this layer's own variables (as Lingvo
// does); in eval the moving averages are used.
class BatchNormLayer : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs, paddings=None) -> Tensor.
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + dim, decay (0.999), epsilon (0.001), set_padded_output_to_zero (True),
  // use_moving_avg_in_training (False).
  static glossa::Params Params();
  explicit BatchNormLayer(const glossa::Params& p);
  // inputs [..., dim]; paddings (optional) shaped like inputs without the last dim.
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs,
                   const at::Tensor& paddings = {}) const;

 private:
  at::Tensor FusedFProp(const NestedMap& theta, const at::Tensor& x, bool training) const;
  int64_t dim_;
  double decay_, epsilon_;
  bool set_padded_output_to_zero_, use_moving_avg_in_training_;
};

}  // namespace glossa
