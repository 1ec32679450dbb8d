// Accumulators (Lingvo's base_layer accumulators): values a layer gathers across FProp calls,
// registered by the layer, collected and reset over its whole tree. SetAccumulatorValues, which
// walks the child tree, stays in base_layer.cc.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/base_layer.h"

namespace glossa {

at::Tensor Accumulator::GetValue() const {
  if (IsDisabled() || !value_.defined()) return DefaultValue();
  return value_;
}
void Accumulator::SetValue(at::Tensor value) {
  if (!IsDisabled()) value_ = std::move(value);
}
void Accumulator::Reset() {
  if (!IsDisabled()) value_ = at::Tensor();
}
void Accumulator::Enable() {
  if (disable_count_ <= 0) throw FailedPreconditionError("unbalanced Accumulator Enable/Disable");
  --disable_count_;
}

void BaseLayer::RegisterAccumulator(const std::string& name, std::unique_ptr<Accumulator> acc) {
  CheckConstructing("RegisterAccumulator");
  CheckName(name, "accumulator");
  accumulators_[name] = std::move(acc);
}

Accumulator& BaseLayer::GetAccumulator(const std::string& name) const {
  auto it = accumulators_.find(name);
  if (it == accumulators_.end()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : accumulators_) keys.push_back(k);
    throw NotFoundError(
        StrCat("layer '", path_, "' has no accumulator ", KeyErrorString(name, keys)));
  }
  return *it->second;
}

NestedMap BaseLayer::GetAccumulatorValues() const {
  NestedMap out =
      CollectTree([](const BaseLayer& c) { return NestedValue(c.GetAccumulatorValues()); });
  for (const auto& [name, acc] : accumulators_) out.Put(name, acc->GetValue());
  return out;
}

void BaseLayer::ResetAccumulators() {
  for (auto& [name, acc] : accumulators_) acc->Reset();
  ForEachChild([](BaseLayer& c) { c.ResetAccumulators(); });
}
void BaseLayer::DisableAccumulators() {
  for (auto& [name, acc] : accumulators_) acc->Disable();
  ForEachChild([](BaseLayer& c) { c.DisableAccumulators(); });
}
void BaseLayer::EnableAccumulators() {
  for (auto& [name, acc] : accumulators_) acc->Enable();
  ForEachChild([](BaseLayer& c) { c.EnableAccumulators(); });
}

}  // namespace glossa
