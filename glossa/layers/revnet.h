// Reversible residual layers (RevNet, Gomez et al. 2017), as Lingvo's reversible_layers:
//   y1 = x1 + f(x2),  y2 = x2 + g(y1)
// The inputs can be rebuilt from the outputs (x2 = y2 − g(y1), x1 = y1 − f(x2)), so a stack of
// them needs no stored activations for its backward pass: StackedRevNetLayer (custom_gradient)
// keeps only the stack's inputs and outputs and recomputes each layer in reverse, replaying the
// step seeds that f and g used so deterministic dropout draws the same masks.
//
//   auto p = StackedRevNetLayer::Params();
//   p.Set("name", "rev").Set("sub_layer_params", ParamValue::List{layer0, layer1});
//   auto [y1, y2] = rev->FProp(rev->theta(), x1, x2);
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

#include "glossa/layers/base_layer.h"

namespace glossa {

class RevNetLayer : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, x1, x2, extra=None) -> (y1, y2).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + f_params, g_params: Params of shape-preserving Blocks (base_layer.h), e.g. a
  // SequentialLayer or a TransformerFeedForwardLayer.
  static glossa::Params Params();
  explicit RevNetLayer(const glossa::Params& p);

  struct Output {
    at::Tensor y1, y2;
    int64_t f_seed = 0, g_seed = 0;  // the step seeds at the start of f and of g
  };
  // `extra` (optional; Lingvo's *extra_inputs): passed to both f and g as their FPropBlock's
  // second input, e.g. paddings [B, T], in the forward and in the reverse pass.
  Output FProp(const NestedMap& theta, const at::Tensor& x1, const at::Tensor& x2,
               const at::Tensor& extra = {}) const;

  struct Reversed {
    at::Tensor x1, x2;    // the reconstructed inputs
    at::Tensor dx1, dx2;  // total derivatives with respect to the inputs
    NestedMap d_theta;    // like theta: {f_block, g_block}
  };
  // Algorithm 1 of the RevNet paper: rebuilds the inputs from the outputs (replaying f_seed and
  // g_seed) and back-propagates dy1, dy2 through the layer. Accumulators do not count the
  // recomputation; the caller's step seed is left as it was.
  Reversed ReverseAndGrad(const NestedMap& theta, const at::Tensor& y1, const at::Tensor& y2,
                          const at::Tensor& dy1, const at::Tensor& dy2, int64_t f_seed,
                          int64_t g_seed, const at::Tensor& extra = {}) const;

 private:
  BaseLayer* f_layer_;
  BaseLayer* g_layer_;
  const Block* f_;
  const Block* g_;
};

class StackedRevNetLayer : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, x1, x2, extra=None) -> (y1, y2).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + sub_layer_params (a list of RevNetLayer Params), custom_gradient (True: the memory-saving
  // backward; False: plain autograd through every layer).
  static glossa::Params Params();
  explicit StackedRevNetLayer(const glossa::Params& p);
  // `extra` goes to every layer's f and g (RevNetLayer::FProp). With custom_gradient it gets no
  // gradient, as in Lingvo ("No gradient will be computed for these inputs"); plain autograd
  // differentiates it like any input.
  std::pair<at::Tensor, at::Tensor> FProp(const NestedMap& theta, const at::Tensor& x1,
                                          const at::Tensor& x2,
                                          const at::Tensor& extra = {}) const;

 private:
  const RevNetLayer& Layer(size_t i) const { return *layers_[i]; }
  std::vector<Child<RevNetLayer>> layers_;
  bool custom_gradient_;
};

}  // namespace glossa
