// BaseLayer's uniform call (FPropMap): the checks every class shares, and the default for Blocks.
#include <algorithm>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/layers/base_layer.h"

namespace glossa {
namespace {

// The C++ class, without its namespace ("ProjectionLayer").
std::string ClassNameOf(const BaseLayer& layer) {
  const std::string name = Demangle(typeid(layer).name());
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

}  // namespace

at::Tensor OptionalInput(const NestedMap& inputs, std::string_view key) {
  if (!inputs.contains(key)) return at::Tensor();
  const NestedValue& v = inputs.at(key);
  return v.is_none() ? at::Tensor() : v.AsTensor();
}

BaseLayer::FPropMapSignature BaseLayer::FPropMapSpec() const {
  if (dynamic_cast<const Block*>(this) != nullptr) {
    return {{"x", "paddings"}, 1, {"outputs"}, false, "Tensor"};
  }
  return {};
}

NestedMap BaseLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  const auto* block = dynamic_cast<const Block*>(this);
  if (block == nullptr) {
    throw UnimplementedError(StrCat("layer '", path(), "' (", ClassNameOf(*this),
                                    ") declares an FPropMap signature but implements no FPropMap"));
  }
  NestedMap out;
  out.Put("outputs", block->FPropBlock(theta, inputs.GetTensor("x"),
                                       OptionalInput(inputs, "paddings")));
  return out;
}

NestedMap BaseLayer::FPropMap(const NestedMap& theta, const NestedMap& inputs) const {
  const FPropMapSignature spec = FPropMapSpec();
  if (spec.inputs.empty()) {
    throw UnimplementedError(StrCat("layer '", path(), "' (", ClassNameOf(*this),
                                    ") has no uniform call: it is not a Block and does not "
                                    "override FPropMapSpec/FPropMapImpl"));
  }
  for (const auto& [key, value] : inputs) {
    if (std::find(spec.inputs.begin(), spec.inputs.end(), key) == spec.inputs.end()) {
      throw InvalidArgumentError(StrCat(FPropMapSignatureText(), ": unexpected input ",
                                        KeyErrorString(key, spec.inputs)));
    }
  }
  for (size_t i = 0; i < spec.required && i < spec.inputs.size(); ++i) {
    if (!inputs.contains(spec.inputs[i]) || inputs.at(spec.inputs[i]).is_none()) {
      throw InvalidArgumentError(
          StrCat(FPropMapSignatureText(), ": missing input '", spec.inputs[i], "'"));
    }
  }
  return FPropMapImpl(theta, inputs);
}

std::string BaseLayer::FPropMapSignatureText() const {
  const FPropMapSignature spec = FPropMapSpec();
  if (spec.inputs.empty()) return "";
  std::string s = "FProp(theta";
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    s += ", " + spec.inputs[i] + (i < spec.required ? "" : "=None");
  }
  return StrCat(s, ") -> ", spec.returns, "  [", ClassNameOf(*this), "]");
}

}  // namespace glossa
