// BaseLayer's calls around FProp (the tree and its variables are base_layer.cc):
// - the uniform call (FPropMap): the checks every class shares, and the default for Blocks;
// - the accumulators (Lingvo's): registered by a layer, collected and reset over its whole tree
//   (SetAccumulatorValues, which walks the child tree, stays in base_layer.cc);
// - the export formats' default: a class that writes no ONNX or TorchScript is refused by name;
// - the inference plan (glossa/kernels/compute_plan.h): made over the tree, read by FProp;
// - theta, what FProp reads: EMA averages in eval, variational noise in training, cast to each
//   layer's fprop_dtype with every cast of the tree in one autograd node per target dtype
//   (kernels/cast_together.h).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/core/step_seed.h"
#include "glossa/kernels/cast_together.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/kernels/gemm.h"
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

// ---- The inference plan ----

void BaseLayer::SetComputePlan(std::shared_ptr<const ComputePlan> plan) {
  compute_plan_ = std::move(plan);
}

const ComputePlan* BaseLayer::compute_plan() const {
  const ComputePlan* plan = Root().compute_plan_.get();
  return plan != nullptr && ComputePlan::AppliesNow() ? plan : nullptr;
}

void BaseLayer::PrepareWeights(const NestedMap& /*theta*/, ComputePlan& /*plan*/) const {}

void BaseLayer::PrepareWeightsTree(ComputePlan& plan) const {
  if (fprop_dtype_ == dtype_) {
    PrepareWeights(theta(), plan);
  } else if (!var_infos_.empty() && plan.policy().precision != Precision::kFloat32) {
    // theta() casts the variables on every call: no prepared weight could be checked against it,
    // and int8 or bf16 weights would silently not apply here.
    const char* p = PrecisionName(plan.policy().precision);
    throw FailedPreconditionError(StrCat(
        "layer '", path_, "' computes in ", c10::toString(fprop_dtype_), " on ",
        c10::toString(dtype_), " variables: ", p, " needs float32 activations (export the bundle "
        "with --quantize=", p, ", which sets them)"));
  }  // else its FProp casts theta on every call, as without a plan
  ForEachChild([&](BaseLayer& c) { c.PrepareWeightsTree(plan); });
}

std::string BaseLayer::PlanKey(const std::string& name) const { return scope_ + "/" + name; }

const PreparedWeight* BaseLayer::PlannedWeight(const std::string& name,
                                               std::initializer_list<at::Tensor> sources) const {
  const ComputePlan* plan = compute_plan();
  return plan != nullptr ? plan->Find(PlanKey(name), sources) : nullptr;
}

at::Tensor BaseLayer::PlannedAffine(const std::string& name, const at::Tensor& source,
                                    const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                    bool relu, bool float_out) const {
  const ComputePlan* plan = compute_plan();
  if (const PreparedWeight* p = plan != nullptr ? plan->Find(PlanKey(name), {source}) : nullptr) {
    return plan->Affine(*p, x, b, relu, float_out);
  }
  return Affine(x, w, b, relu, float_out);
}

bool BaseLayer::PlannedBatchInvariant() const {
  const ComputePlan* plan = compute_plan();
  return plan != nullptr && plan->BatchInvariantNow();
}

std::shared_ptr<const ComputePlan> PlanInference(const BaseLayer& model,
                                                 const ComputePolicy& policy) {
  auto plan = std::make_shared<ComputePlan>(policy);
  at::NoGradGuard no_grad;
  model.PrepareWeightsTree(*plan);
  return plan;
}

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

// ---- Accumulators ----

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

namespace {

std::optional<int64_t> IntOrNone(const Params& p, const char* key) {
  const ParamValue& v = p.Get(key);
  if (v.is_none()) return std::nullopt;
  return v.AsInt();
}

}  // namespace

NestedMap BaseLayer::theta() const {
  // Two walks of the tree (lambdas: a member function's access to every layer's members). The
  // first finds the leaves, EMA and variational noise applied, and the dtype each is cast to.
  struct Leaf {
    at::Tensor value;
    at::ScalarType cast_to;
    at::Tensor ready;  // the cast the optimizer made already (FpropCopy), if it stands for value
  };
  std::vector<Leaf> found;
  std::function<void(const BaseLayer&)> collect = [&](const BaseLayer& l) {
    l.CollectTree([&](const BaseLayer& c) {
      collect(c);
      return NestedValue(NestedMap());
    });
    const EmaSource* ema_source = IsEvalMode() && !l.is_inference() ? l.ema() : nullptr;
    const glossa::Params& vn = l.params_.GetParams("vn");
    const bool add_vn = !IsEvalMode() && vn.GetBool("global_vn");
    for (const auto& info : l.var_infos_) {
      at::Tensor v = l.vars_.at(info.name);
      if (ema_source != nullptr) {
        if (auto avg = ema_source->Average(info.full_name)) v = *avg;
      }
      if (add_vn && info.trainable && v.is_floating_point()) {
        if (vn.Get("scale").is_none()) {
          throw InvalidArgumentError(StrCat("layer '", l.path_, "': vn.global_vn needs vn.scale"));
        }
        double scale = GetGlobalStep() >= vn.GetInt("start_step") ? vn.GetFloat("scale") : 0.0;
        at::Generator gen = MakeSeededGenerator(
            GenerateStepSeedPair(IntOrNone(l.params_, "random_seed"), IntOrNone(vn, "seed")));
        at::Tensor noise = vn.GetBool("use_uniform_noise")
                               ? at::empty(v.sizes(), at::TensorOptions().dtype(at::kFloat))
                                     .uniform_(-0.5, 0.5, gen)
                               : at::normal(0.0, 1.0, v.sizes().vec(), gen,
                                            at::TensorOptions().dtype(at::kFloat));
        v = v + noise.to(v.options()) * scale;
      }
      const bool cast = l.fprop_dtype_ != l.dtype_ && v.scalar_type() == l.dtype_;
      at::Tensor ready;
      if (cast && info.fprop_copy) ready = info.fprop_copy->For(v, l.fprop_dtype_);
      found.push_back({std::move(v), cast ? l.fprop_dtype_ : at::ScalarType::Undefined,
                       std::move(ready)});
    }
  };
  collect(*this);
  // The casts grouped by target dtype and by whether the leaf takes a gradient (CastTogether's
  // inputs all do or none do); each group in one call.
  std::vector<at::Tensor> leaves;
  leaves.reserve(found.size());
  std::map<std::pair<int, bool>, std::vector<size_t>> groups;
  for (size_t i = 0; i < found.size(); ++i) {
    leaves.push_back(found[i].value);
    if (found[i].cast_to != at::ScalarType::Undefined) {
      groups[{static_cast<int>(found[i].cast_to), found[i].value.requires_grad()}].push_back(i);
    }
  }
  for (const auto& [key, members] : groups) {
    std::vector<at::Tensor> xs, ready;
    xs.reserve(members.size());
    ready.reserve(members.size());
    for (size_t i : members) {
      xs.push_back(found[i].value);
      ready.push_back(found[i].ready);
    }
    std::vector<at::Tensor> cast = CastTogether(xs, static_cast<at::ScalarType>(key.first), ready);
    for (size_t j = 0; j < members.size(); ++j) leaves[members[j]] = std::move(cast[j]);
  }
  // The second walk, in the same order, builds the map.
  size_t next = 0;
  std::function<NestedMap(const BaseLayer&)> build = [&](const BaseLayer& l) {
    NestedMap out = l.CollectTree([&](const BaseLayer& c) { return NestedValue(build(c)); });
    for (const auto& info : l.var_infos_) out.Put(info.name, leaves.at(next++));
    return out;
  };
  return build(*this);
}

}  // namespace glossa
