#include "glossa/layers/layer_fn.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/dropout.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/moe.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/transformer.h"

namespace glossa {
namespace {

struct LayerFnRegistry {
  std::mutex mu;
  std::map<std::type_index, LayerFn> fns;
};

LayerFnRegistry& Registry() {
  static LayerFnRegistry* registry = [] {
    auto* r = new LayerFnRegistry;
    auto add = [r](std::type_index t, LayerFn fn) { r->fns[t] = std::move(fn); };
    add(typeid(ProjectionLayer),
        [](const BaseLayer& l, const NestedMap& th, const at::Tensor& x, const at::Tensor& pad) {
          return static_cast<const ProjectionLayer&>(l).FProp(
              th, x, pad.defined() && x.dim() == pad.dim() + 1 ? pad : at::Tensor());
        });
    add(typeid(FCLayer),
        [](const BaseLayer& l, const NestedMap& th, const at::Tensor& x, const at::Tensor& pad) {
          return static_cast<const FCLayer&>(l).FProp(
              th, x, pad.defined() && x.dim() == pad.dim() + 1 ? pad : at::Tensor());
        });
    add(typeid(LayerNorm),
        [](const BaseLayer& l, const NestedMap& th, const at::Tensor& x, const at::Tensor&) {
          return static_cast<const LayerNorm&>(l).FProp(th, x);
        });
    // Only the seeded dropout: containers replay their blocks (RevNet's reverse pass, GPipe's
    // recompute), and plain dropout would draw new masks there.
    add(typeid(DeterministicDropoutLayer),
        [](const BaseLayer& l, const NestedMap& th, const at::Tensor& x, const at::Tensor&) {
          return static_cast<const DropoutLayer&>(l).FProp(th, x);
        });
    add(typeid(TransformerFeedForwardLayer),
        [](const BaseLayer& l, const NestedMap& th, const at::Tensor& x, const at::Tensor& pad) {
          return static_cast<const TransformerFeedForwardLayer&>(l).FProp(th, x, pad);
        });
    add(typeid(TransformerShardedMoeLayer),
        [](const BaseLayer& l, const NestedMap& th, const at::Tensor& x, const at::Tensor& pad) {
          return static_cast<const TransformerShardedMoeLayer&>(l).FProp(th, x, pad);
        });
    add(typeid(TransformerLayer),
        [](const BaseLayer& l, const NestedMap& th, const at::Tensor& x, const at::Tensor& pad) {
          return static_cast<const TransformerLayer&>(l).FProp(th, x, pad).first;
        });
    add(typeid(SequentialLayer),
        [](const BaseLayer& l, const NestedMap& th, const at::Tensor& x, const at::Tensor& pad) {
          return static_cast<const SequentialLayer&>(l).FProp(th, x, pad);
        });
    return r;
  }();
  return *registry;
}

}  // namespace

void RegisterLayerFn(std::type_index type, LayerFn fn) {
  auto& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.fns[type] = std::move(fn);
}

bool HasLayerFn(const BaseLayer& layer) {
  auto& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.fns.count(std::type_index(typeid(layer))) > 0;
}

at::Tensor ApplyLayerFn(const BaseLayer& layer, const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor& paddings) {
  LayerFn fn;
  {
    auto& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.fns.find(std::type_index(typeid(layer)));
    if (it == r.fns.end()) {
      throw InvalidArgumentError(StrCat("layer '", layer.path(), "' (", layer.params().ClsKey(),
                                        ") cannot be used as a tensor -> tensor block; register it "
                                        "with RegisterLayerFn"));
    }
    fn = it->second;
  }
  return fn(layer, theta, x, paddings);
}

void CheckReplayable(const BaseLayer& block, std::string_view container) {
  std::function<void(const BaseLayer&)> walk = [&](const BaseLayer& l) {
    if (dynamic_cast<const TransformerShardedMoeLayer*>(&l) != nullptr) {
      throw InvalidArgumentError(StrCat(
          "layer '", l.path(), "' (", l.params().ClsKey(), ") cannot be inside ", container,
          ": its aux loss would be lost (the block runs without gradients or on another thread)"));
    }
    if (typeid(l) == typeid(DropoutLayer) && l.params().GetFloat("keep_prob") < 1.0) {
      throw InvalidArgumentError(StrCat("layer '", l.path(), "' is a plain DropoutLayer inside ",
                                        container,
                                        ", whose replay would draw new masks; use "
                                        "DeterministicDropoutLayer"));
    }
    for (const auto& name : l.ChildNames()) {
      for (const BaseLayer* child : l.GetChildren(name)) walk(*child);
    }
  };
  walk(block);
}

glossa::Params SequentialLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<SequentialLayer>());
  p.Define("sub", ParamValue::List{}, "Layers applied in order (a list of Params).");
  return p;
}

SequentialLayer::SequentialLayer(const glossa::Params& p) : BaseLayer(p) {
  const ParamValue& sub = params().Get("sub");
  if (!sub.is_list() || sub.AsList().empty()) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': sub must be a non-empty list of Params"));
  }
  CreateChildren("sub", sub);
  sub_ = GetChildren("sub");
  for (const BaseLayer* l : sub_) {
    if (!HasLayerFn(*l)) {
      throw InvalidArgumentError(StrCat("layer '", l->path(), "' (", l->params().ClsKey(),
                                        ") cannot be used in a SequentialLayer; register it with "
                                        "RegisterLayerFn"));
    }
  }
}

at::Tensor SequentialLayer::FProp(const NestedMap& theta, const at::Tensor& x,
                                  const at::Tensor& paddings) const {
  const auto& thetas = theta.at("sub").AsList();
  at::Tensor y = x;
  for (size_t i = 0; i < sub_.size(); ++i)
    y = ApplyLayerFn(*sub_[i], thetas[i].AsMap(), y, paddings);
  return y;
}

GLOSSA_REGISTER_CLASS(SequentialLayer, "glossa.layers.SequentialLayer");

}  // namespace glossa
