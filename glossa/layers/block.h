// Containers of blocks: layers applied through the Block interface (base_layer.h), checked when the
// container is built, and Lingvo's SequentialLayer.
//
//   const Block& b = AsBlock(layer, "RevNet layer 'rev'");   // InvalidArgument if not a Block
//   at::Tensor y = b.FPropBlock(theta, x, paddings);
#pragma once

#include <ATen/core/Tensor.h>

#include <string_view>
#include <vector>

#include "glossa/layers/base_layer.h"

namespace glossa {

// `layer` as a Block; InvalidArgument naming the layer, its class and `container` otherwise.
const Block& AsBlock(const BaseLayer& layer, std::string_view container);

// Containers that replay their blocks (RevNet's reverse pass, GPipe's recompute on stage
// threads) call this on each block: InvalidArgument naming the layer for one whose ReplayHazard
// says why it cannot be replayed (a plain DropoutLayer with keep_prob < 1 would draw new masks),
// or, unless the container `carries_aux_losses` out of its replay (a pipeline does), one that
// AddsAuxLoss (a MoE layer: its aux loss would be lost).
void CheckReplayable(const BaseLayer& block, std::string_view container,
                     bool carries_aux_losses = false);

// Lingvo's SequentialLayer: `sub` (a list of block Params) applied in order.
class SequentialLayer : public BaseLayer, public Block {
 public:
  // + sub (list of Params).
  static glossa::Params Params();
  explicit SequentialLayer(const glossa::Params& p);
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& x,
                   const at::Tensor& paddings = {}) const;
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor& paddings) const override {
    return FProp(theta, x, paddings);
  }

 private:
  std::vector<const Block*> blocks_;
  std::vector<Child<BaseLayer>> sub_;
};

}  // namespace glossa
