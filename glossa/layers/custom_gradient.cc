#include "glossa/layers/custom_gradient.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"

namespace glossa {
namespace {

// Runs `f` with the step seed reset to 0, restoring the caller's step seed afterwards.
template <typename F>
auto WithFreshStepSeed(F&& f) {
  const int64_t saved = GetStepSeed();
  ResetStepSeed(0);
  try {
    auto result = f();
    ResetStepSeed(saved);
    return result;
  } catch (...) {
    ResetStepSeed(saved);
    throw;
  }
}

// What the backward needs besides the saved tensors. The templates keep only the NestedMap
// structure (every tensor leaf undefined): holding the outputs here would tie them to this node
// and the node to them, a reference cycle that never frees the step's tensors.
struct CallState : torch::CustomClassHolder {
  CustomFwdFn fwd;
  CustomBakFn bak;
  NestedMap xs_template;
  NestedMap ys_template;
  int64_t global_step = 0;
  int64_t overwrite_global_step = 0;
};

NestedMap StructureOnly(const NestedMap& m) {
  return m.Transform([](const NestedValue& v) -> NestedValue {
    return v.is_tensor() ? NestedValue(at::Tensor()) : v;
  });
}

class CustomGradientFunction : public torch::autograd::Function<CustomGradientFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<CallState> state,
                                                at::TensorList xs_list) {
    // The inputs arrive as a TensorList: that is what autograd records as differentiable inputs.
    std::vector<at::Tensor> xs = xs_list.vec();
    NestedMap ys = WithFreshStepSeed([&] { return state->fwd(state->xs_template.Pack(xs)); });
    state->ys_template = StructureOnly(ys);
    std::vector<at::Tensor> flat_ys = ys.FlattenTensors();
    // Outputs that alias inputs confuse autograd's bookkeeping; hand out fresh tensors.
    for (auto& y : flat_ys) {
      for (const auto& x : xs) {
        if (y.defined() && x.defined() && y.is_same(x)) y = y.clone();
      }
    }
    // Inputs and outputs both go through save_for_backward, which keeps saved outputs without a
    // strong reference back to this node.
    std::vector<at::Tensor> saved = xs;
    saved.insert(saved.end(), flat_ys.begin(), flat_ys.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["num_xs"] = static_cast<int64_t>(xs.size());
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return flat_ys;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list dys) {
    auto state =
        c10::static_intrusive_pointer_cast<CallState>(ctx->saved_data["state"].toCapsule());
    std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const auto num_xs = static_cast<size_t>(ctx->saved_data["num_xs"].toInt());
    std::vector<at::Tensor> xs(saved.begin(), saved.begin() + num_xs);
    std::vector<at::Tensor> ys(saved.begin() + num_xs, saved.end());
    for (size_t i = 0; i < dys.size(); ++i) {
      if (!dys[i].defined()) dys[i] = at::zeros_like(ys[i]);
    }
    GlobalStepContext step(state->global_step);
    OverWriteGlobalStepContext overwrite(state->overwrite_global_step);
    NestedMap dxs = WithFreshStepSeed([&] {
      return state->bak(state->xs_template.Pack(xs), state->ys_template.Pack(ys),
                        state->ys_template.Pack(dys));
    });
    if (!dxs.IsCompatible(state->xs_template)) {
      throw InvalidArgumentError(StrCat("CallWithCustomGradient: bak returned keys [",
                                        Join(dxs.Keys(), ", "), "], expected the keys of xs [",
                                        Join(state->xs_template.Keys(), ", "), "]"));
    }
    torch::autograd::variable_list out;
    out.push_back(at::Tensor());  // no gradient for the state argument
    for (const auto& v : dxs.Flatten()) out.push_back(v.is_tensor() ? v.AsTensor() : at::Tensor());
    return out;
  }
};

}  // namespace

NestedMap CallWithCustomGradient(const CustomFwdFn& fwd, const CustomBakFn& bak,
                                 const NestedMap& xs) {
  if (!bak) return WithFreshStepSeed([&] { return fwd(xs); });
  auto state = c10::make_intrusive<CallState>();
  state->fwd = fwd;
  state->bak = bak;
  state->xs_template = StructureOnly(xs);
  state->global_step = GetGlobalStep();
  state->overwrite_global_step = GetOverWriteGlobalStep();
  std::vector<at::Tensor> flat_xs = xs.FlattenTensors();
  std::vector<at::Tensor> flat_ys = CustomGradientFunction::apply(state, at::TensorList(flat_xs));
  return state->ys_template.Pack(flat_ys);
}

NestedMap DetachedLeaves(const NestedMap& m) {
  return m.Transform([](const NestedValue& v) -> NestedValue {
    if (!v.is_tensor()) return v;
    const at::Tensor& t = v.AsTensor();
    return t.detach().requires_grad_(at::isFloatingType(t.scalar_type()));
  });
}

}  // namespace glossa
