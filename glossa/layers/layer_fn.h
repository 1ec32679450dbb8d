// Layers as generic tensor → tensor blocks, for containers that hold arbitrary layers: RevNet's f
// and g blocks, pipeline cells, SequentialLayer. A layer class becomes usable by registering how
// to apply it; the built-in ones (projections, layer norm, deterministic dropout, the Transformer
// blocks and layers, MoE, SequentialLayer) are registered here.
//
//   at::Tensor y = ApplyLayerFn(layer, theta, x, paddings);   // InvalidArgument if unregistered
//   RegisterLayerFn<MyLayer>([](const MyLayer& l, const NestedMap& theta, const at::Tensor& x,
//                               const at::Tensor& paddings) { return l.FProp(theta, x); });
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string_view>
#include <typeindex>

#include "glossa/layers/base_layer.h"

namespace glossa {

using LayerFn = std::function<at::Tensor(const BaseLayer& layer, const NestedMap& theta,
                                         const at::Tensor& x, const at::Tensor& paddings)>;

// Registers `fn` for layers whose dynamic type is exactly `type` (later registrations win).
void RegisterLayerFn(std::type_index type, LayerFn fn);

template <typename T>
void RegisterLayerFn(
    std::function<at::Tensor(const T&, const NestedMap&, const at::Tensor&, const at::Tensor&)>
        fn) {
  RegisterLayerFn(std::type_index(typeid(T)),
                  [fn](const BaseLayer& l, const NestedMap& theta, const at::Tensor& x,
                       const at::Tensor& paddings) {
                    return fn(static_cast<const T&>(l), theta, x, paddings);
                  });
}

bool HasLayerFn(const BaseLayer& layer);
// Applies `layer` to x ([B, T, D] for the Transformer blocks) with `paddings` ([B, T] or
// undefined; layers without paddings ignore them). InvalidArgument naming the layer and its class
// when the class is not registered.
at::Tensor ApplyLayerFn(const BaseLayer& layer, const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor& paddings = {});

// Containers that replay their blocks (RevNet's reverse pass, GPipe's recompute on stage
// threads) call this on each block: InvalidArgument naming the layer for a MoE layer anywhere in
// the subtree (its aux loss would be lost) or a plain DropoutLayer with keep_prob < 1 (its replay
// would draw new masks).
void CheckReplayable(const BaseLayer& block, std::string_view container);

// Lingvo's SequentialLayer: `sub` (a list of layer Params) applied in order, each through
// ApplyLayerFn.
class SequentialLayer : public BaseLayer {
 public:
  // + sub (list of Params).
  static glossa::Params Params();
  explicit SequentialLayer(const glossa::Params& p);
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& x,
                   const at::Tensor& paddings = {}) const;

 private:
  std::vector<BaseLayer*> sub_;
};

}  // namespace glossa
