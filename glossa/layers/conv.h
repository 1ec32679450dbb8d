// 2-D convolution and pooling on NHWC inputs with TensorFlow's SAME/VALID padding (Lingvo's
// Conv2DLayerNoPadding/ConvLayer and PoolingLayer). Optional sequence paddings [B, H] (time on H,
// as in speech models) mask the input and are strided to the output.
//
//   auto [y, y_paddings] = conv->FProp(conv->theta(), x, paddings);   // x [B, H, W, C_in]
#pragma once

#include <utility>
#include <vector>

#include "glossa/layers/base_layer.h"

namespace glossa {

class Conv2DLayer : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs, paddings=None) -> (outputs, paddings).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + filter_shape [h, w, in, out], filter_stride [sh, sw], dilation_rate [dh, dw], padding
  // ('SAME' | 'VALID'), bias (False), activation ('NONE').
  static glossa::Params Params();
  explicit Conv2DLayer(const glossa::Params& p);
  // inputs [B, H, W, C_in], paddings [B, H] (optional). Returns (outputs [B, H', W', C_out],
  // output paddings [B, H'] or undefined).
  std::pair<at::Tensor, at::Tensor> FProp(const NestedMap& theta, const at::Tensor& inputs,
                                          const at::Tensor& paddings = {}) const;

 private:
  std::vector<int64_t> filter_shape_, stride_, dilation_;
  bool same_, bias_;
  std::string activation_;
};

class PoolingLayer : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs, paddings=None) -> (outputs, paddings).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + window_shape [h, w], window_stride [sh, sw], pooling_type ('MAX' | 'AVG'),
  // padding ('SAME' | 'VALID'). AVG over SAME padding averages the real values only (as TF).
  static glossa::Params Params();
  explicit PoolingLayer(const glossa::Params& p);
  std::pair<at::Tensor, at::Tensor> FProp(const NestedMap& theta, const at::Tensor& inputs,
                                          const at::Tensor& paddings = {}) const;

 private:
  std::vector<int64_t> window_, stride_;
  bool same_, max_;
};

// TensorFlow's SAME padding for one dim: (before, after).
std::pair<int64_t, int64_t> SamePadding(int64_t in, int64_t window, int64_t stride,
                                        int64_t dilation = 1);

}  // namespace glossa
