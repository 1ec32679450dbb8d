#include "glossa/layers/block.h"

#include <ATen/ATen.h>

#include <functional>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {

const Block& AsBlock(const BaseLayer& layer, std::string_view container) {
  const auto* block = dynamic_cast<const Block*>(&layer);
  if (block == nullptr) {
    throw InvalidArgumentError(StrCat("layer '", layer.path(), "' (", layer.params().ClsKey(),
                                      ") cannot be a block of ", container,
                                      ": its class does not implement the Block interface "
                                      "(FPropBlock(theta, x, paddings))"));
  }
  return *block;
}

void CheckReplayable(const BaseLayer& block, std::string_view container,
                     bool carries_aux_losses) {
  std::function<void(const BaseLayer&)> walk = [&](const BaseLayer& l) {
    std::string why = l.ReplayHazard();
    if (why.empty() && l.AddsAuxLoss() && !carries_aux_losses) {
      why = "its aux loss would be lost (the block runs without gradients or on another thread)";
    }
    if (!why.empty()) {
      throw InvalidArgumentError(StrCat("layer '", l.path(), "' (", l.params().ClsKey(),
                                        ") cannot be inside ", container, ": ", why));
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
  p.Define("sub", ParamValue::List{}, "Blocks applied in order (a list of Params).");
  return p;
}

SequentialLayer::SequentialLayer(const glossa::Params& p) : BaseLayer(p) {
  const ParamValue& sub = p.Get("sub");
  if (!sub.is_list() || sub.AsList().empty()) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': sub must be a non-empty list of Params"));
  }
  sub_ = CreateChildren<BaseLayer>("sub", sub.AsList());
  for (const auto& l : sub_) {
    blocks_.push_back(&AsBlock(*l, StrCat("SequentialLayer '", path(), "'")));
  }
}

at::Tensor SequentialLayer::FProp(const NestedMap& theta, const at::Tensor& x,
                                  const at::Tensor& paddings) const {
  at::Tensor y = x;
  for (size_t i = 0; i < sub_.size(); ++i) {
    y = blocks_[i]->FPropBlock(sub_[i].Theta(theta), y, paddings);
  }
  return y;
}

GLOSSA_REGISTER_CLASS(SequentialLayer, "glossa.layers.SequentialLayer");

}  // namespace glossa
