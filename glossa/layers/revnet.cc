#include "glossa/layers/revnet.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <memory>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/custom_gradient.h"
#include "glossa/layers/block.h"
#include "glossa/summary/summary.h"

namespace glossa {
namespace {

// d(out)/d(inputs) · grad_out, with zeros for inputs the output does not depend on.
std::vector<at::Tensor> Grads(const at::Tensor& out, const std::vector<at::Tensor>& inputs,
                              const at::Tensor& grad_out) {
  std::vector<at::Tensor> wrt, grads(inputs.size());
  std::vector<size_t> index;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].requires_grad()) {
      wrt.push_back(inputs[i]);
      index.push_back(i);
    }
  }
  if (out.requires_grad() && !wrt.empty()) {
    auto g = torch::autograd::grad({out}, wrt, {grad_out}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < g.size(); ++k) grads[index[k]] = g[k];
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!grads[i].defined()) grads[i] = at::zeros_like(inputs[i]);
  }
  return grads;
}

}  // namespace

glossa::Params RevNetLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<RevNetLayer>());
  p.Define("f_params", nullptr, "Params of the f block (a shape-preserving layer).");
  p.Define("g_params", nullptr, "Params of the g block (a shape-preserving layer).");
  return p;
}

RevNetLayer::RevNetLayer(const glossa::Params& p) : BaseLayer(p) {
  for (const char* key : {"f_params", "g_params"}) {
    if (!params().Get(key).is_params()) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': ", key, " must be set"));
    }
  }
  f_layer_ = &CreateChild("f_block", params().Get("f_params").AsParams());
  g_layer_ = &CreateChild("g_block", params().Get("g_params").AsParams());
  const std::string container = StrCat("RevNet layer '", path(), "'");
  for (const BaseLayer* block : {f_layer_, g_layer_}) CheckReplayable(*block, container);
  f_ = &AsBlock(*f_layer_, container);
  g_ = &AsBlock(*g_layer_, container);
}

RevNetLayer::Output RevNetLayer::FProp(const NestedMap& theta, const at::Tensor& x1,
                                       const at::Tensor& x2, const at::Tensor& extra) const {
  if (!x1.sizes().equals(x2.sizes())) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': the two halves must have one shape"));
  }
  Output out;
  out.f_seed = GetStepSeed();
  out.y1 = x1 + f_->FPropBlock(ChildTheta(theta, f_layer_, "f_block", -1), x2, extra);
  out.g_seed = GetStepSeed();
  out.y2 = x2 + g_->FPropBlock(ChildTheta(theta, g_layer_, "g_block", -1), out.y1, extra);
  return out;
}

RevNetLayer::Reversed RevNetLayer::ReverseAndGrad(const NestedMap& theta, const at::Tensor& y1,
                                                  const at::Tensor& y2, const at::Tensor& dy1,
                                                  const at::Tensor& dy2, int64_t f_seed,
                                                  int64_t g_seed, const at::Tensor& extra) const {
  at::AutoGradMode grad_mode(true);
  // The recompute replays the forward: accumulators must not count it, and the caller's step
  // seed is restored afterwards (on every exit path).
  struct Replay {
    std::vector<BaseLayer*> blocks;
    int64_t saved_seed = GetStepSeed();
    SummarySuppressScope no_summaries;  // the forward already recorded them
    explicit Replay(std::vector<BaseLayer*> b) : blocks(std::move(b)) {
      for (BaseLayer* l : blocks) l->DisableAccumulators();
    }
    ~Replay() {
      for (BaseLayer* l : blocks) l->EnableAccumulators();
      ResetStepSeed(saved_seed);
    }
  } replay({f_layer_, g_layer_});
  const NestedMap theta_f = DetachedLeaves(ChildTheta(theta, f_layer_, "f_block", -1));
  const NestedMap theta_g = DetachedLeaves(ChildTheta(theta, g_layer_, "g_block", -1));
  // Reverse: x2 = y2 - g(y1), then x1 = y1 - f(x2), replaying each block's step seed.
  const at::Tensor z1 = y1.detach().requires_grad_(true);
  ResetStepSeed(g_seed);
  const at::Tensor ex = extra.defined() ? extra.detach() : extra;  // no gradient for it
  const at::Tensor gz1 = g_->FPropBlock(theta_g, z1, ex);
  const at::Tensor x2 = (y2.detach() - gz1.detach()).requires_grad_(true);
  ResetStepSeed(f_seed);
  const at::Tensor fx2 = f_->FPropBlock(theta_f, x2, ex);
  Reversed r;
  r.x1 = z1.detach() - fx2.detach();
  r.x2 = x2.detach();
  // Gradients: dz1 = dy1 + (dg/dz1)ᵀ dy2, dx2 = dy2 + (df/dx2)ᵀ dz1.
  std::vector<at::Tensor> g_in = {z1};
  for (const auto& t : theta_g.FlattenTensors()) g_in.push_back(t);
  std::vector<at::Tensor> g_grads = Grads(gz1, g_in, dy2);
  const at::Tensor dz1 = dy1 + g_grads[0];
  std::vector<at::Tensor> f_in = {x2};
  for (const auto& t : theta_f.FlattenTensors()) f_in.push_back(t);
  std::vector<at::Tensor> f_grads = Grads(fx2, f_in, dz1);
  r.dx1 = dz1;
  r.dx2 = dy2 + f_grads[0];
  r.d_theta.Set("f_block",
                theta_f.Pack(std::vector<at::Tensor>(f_grads.begin() + 1, f_grads.end())));
  r.d_theta.Set("g_block",
                theta_g.Pack(std::vector<at::Tensor>(g_grads.begin() + 1, g_grads.end())));
  return r;
}

glossa::Params StackedRevNetLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<StackedRevNetLayer>());
  p.Define("sub_layer_params", ParamValue::List{}, "A list of RevNetLayer Params.");
  p.Define("custom_gradient", true,
           "True: the backward pass rebuilds activations layer by layer from the outputs "
           "(memory flat in depth); False: plain autograd (for tests and benchmarks).");
  return p;
}

StackedRevNetLayer::StackedRevNetLayer(const glossa::Params& p) : BaseLayer(p) {
  const ParamValue& sub = params().Get("sub_layer_params");
  if (!sub.is_list() || sub.AsList().empty()) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': sub_layer_params must be a non-empty list"));
  }
  layers_ = CreateChildren<RevNetLayer>("sub_layers", sub.AsList());
  custom_gradient_ = params().GetBool("custom_gradient");
}

std::pair<at::Tensor, at::Tensor> StackedRevNetLayer::FProp(const NestedMap& theta,
                                                            const at::Tensor& x1,
                                                            const at::Tensor& x2,
                                                            const at::Tensor& extra) const {
  if (!custom_gradient_) {
    at::Tensor a1 = x1, a2 = x2;
    for (size_t i = 0; i < layers_.size(); ++i) {
      auto out = Layer(i).FProp(layers_[i].Theta(theta), a1, a2, extra);
      a1 = out.y1;
      a2 = out.y2;
    }
    return {a1, a2};
  }
  // The forward runs without autograd history; its step seeds are recorded for the backward.
  struct Seeds {
    std::vector<std::pair<int64_t, int64_t>> per_layer;
    int64_t end = 0;
  };
  auto seeds = std::make_shared<Seeds>();
  const int64_t initial_seed = GetStepSeed();
  NestedMap xs;
  xs.Set("theta", theta.at("sub_layers"));
  xs.Set("x1", x1);
  xs.Set("x2", x2);
  // The lambdas outlive this call (bak runs in the backward pass): they capture `this` only.
  const at::Tensor ex = extra.defined() ? extra.detach() : extra;  // no gradient, as in Lingvo
  auto fwd = [this, seeds, initial_seed, ex](const NestedMap& in) {
    ResetStepSeed(initial_seed);
    seeds->per_layer.clear();
    const auto& th = in.at("theta").AsList();
    at::Tensor a1 = in.GetTensor("x1"), a2 = in.GetTensor("x2");
    for (size_t i = 0; i < layers_.size(); ++i) {
      auto out = Layer(i).FProp(th[i].AsMap(), a1, a2, ex);
      seeds->per_layer.emplace_back(out.f_seed, out.g_seed);
      a1 = out.y1;
      a2 = out.y2;
    }
    seeds->end = GetStepSeed();
    return NestedMap{{"y1", a1}, {"y2", a2}};
  };
  auto bak = [this, seeds, ex](const NestedMap& in, const NestedMap& ys, const NestedMap& dys) {
    const auto& th = in.at("theta").AsList();
    at::Tensor y1 = ys.GetTensor("y1"), y2 = ys.GetTensor("y2");
    at::Tensor dy1 = dys.GetTensor("y1"), dy2 = dys.GetTensor("y2");
    NestedValue::List d_thetas(layers_.size());
    for (size_t i = layers_.size(); i-- > 0;) {
      auto r = Layer(i).ReverseAndGrad(th[i].AsMap(), y1, y2, dy1, dy2, seeds->per_layer[i].first,
                                       seeds->per_layer[i].second, ex);
      d_thetas[i] = std::move(r.d_theta);
      y1 = r.x1;
      y2 = r.x2;
      dy1 = r.dx1;
      dy2 = r.dx2;
    }
    NestedMap dxs;
    dxs.Set("theta", std::move(d_thetas));
    dxs.Set("x1", dy1);
    dxs.Set("x2", dy2);
    return dxs;
  };
  NestedMap ys = CallWithCustomGradient(fwd, bak, xs);
  // Leave the step seed where the plain stack would, so later layers draw the same seeds.
  ResetStepSeed(seeds->end);
  return {ys.GetTensor("y1"), ys.GetTensor("y2")};
}

GLOSSA_REGISTER_CLASS(RevNetLayer, "glossa.layers.RevNetLayer");
GLOSSA_REGISTER_CLASS(StackedRevNetLayer, "glossa.layers.StackedRevNetLayer");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature RevNetLayer::FPropMapSpec() const {
  return {{"x1", "x2", "extra"}, 2, {"y1", "y2"}, true, "(y1, y2)"};
}

NestedMap RevNetLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  auto r = FProp(theta, inputs.GetTensor("x1"), inputs.GetTensor("x2"), OptionalInput(inputs, "extra"));
  NestedMap out;
  out.Put("y1", r.y1);
  out.Put("y2", r.y2);
  return out;
}

BaseLayer::FPropMapSignature StackedRevNetLayer::FPropMapSpec() const {
  return {{"x1", "x2", "extra"}, 2, {"y1", "y2"}, true, "(y1, y2)"};
}

NestedMap StackedRevNetLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  auto [y1, y2] = FProp(theta, inputs.GetTensor("x1"), inputs.GetTensor("x2"), OptionalInput(inputs, "extra"));
  NestedMap out;
  out.Put("y1", y1);
  out.Put("y2", y2);
  return out;
}

}  // namespace glossa
