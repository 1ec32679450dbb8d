#include "glossa/layers/onnx_graph.h"
#include "glossa/layers/torchscript.h"
#include "glossa/layers/softmax.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/fused_xent.h"
#include "glossa/kernels/gemm.h"

namespace glossa {
namespace {

// Throws InvalidArgumentError unless exactly one of class_ids and class_probabilities is given,
// logits end in num_classes, and that target is shaped (and for class_ids, valued) to match.
void CheckXentInputs(const std::string& path, int64_t num_classes, const at::Tensor& logits,
                     const at::Tensor& class_ids, const at::Tensor& class_probabilities) {
  if (class_ids.defined() == class_probabilities.defined()) {
    throw InvalidArgumentError(
        StrCat("layer '", path, "': give exactly one of class_ids and class_probabilities"));
  }
  if (logits.dim() < 1 || logits.size(-1) != num_classes) {
    throw InvalidArgumentError(StrCat("layer '", path, "': logits must end in num_classes ",
                                      num_classes, ", got shape ", logits.sizes()));
  }
  const auto batch_shape = logits.sizes().slice(0, logits.dim() - 1).vec();
  if (class_ids.defined()) {
    if (class_ids.sizes().vec() != batch_shape || at::isFloatingType(class_ids.scalar_type())) {
      throw InvalidArgumentError(StrCat("layer '", path, "': class_ids must be integers shaped ",
                                        at::IntArrayRef(batch_shape), ", got ", class_ids.sizes()));
    }
    if (class_ids.numel() > 0 &&
        (class_ids.min().item<int64_t>() < 0 || class_ids.max().item<int64_t>() >= num_classes)) {
      throw InvalidArgumentError(
          StrCat("layer '", path, "': class_ids must be in [0, ", num_classes, ")"));
    }
  } else if (class_probabilities.sizes() != logits.sizes()) {
    throw InvalidArgumentError(StrCat("layer '", path, "': class_probabilities must be shaped ",
                                      logits.sizes(), ", got ", class_probabilities.sizes()));
  }
}

}  // namespace

glossa::Params SimpleFullSoftmax::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<SimpleFullSoftmax>());
  p.Define("input_dim", 0, "Dimension of the input.");
  p.Define("num_classes", 0, "Total number of target classes.");
  p.Define("label_smoothing", 0.0,
           "Uniform label smoothing: targets (1 - e)·one_hot + e / num_classes.");
  p.Define("logits_abs_max", nullptr, "If set, clip logits to [-logits_abs_max, logits_abs_max].");
  p.Define("compute_per_example_argmax", true,
           "Output per_example_argmax (an argmax over the classes, ~10x a max on CPU). Tasks that "
           "only need next-step accuracy can turn it off and use per_example_max_log_prob.");
  p.Define("fused_xent", true,
           "Cross-entropy against class_ids in one fused kernel (glossa/kernels/fused_xent.h; CPUs "
           "with AVX-512F, float32 or bfloat16 logits): one pass forward and one backward, and no "
           "[..., num_classes] log_probs tensor, so the output then has no log_probs. false, "
           "other CPUs, float64 logits and class_probabilities targets: ATen's log_softmax, and "
           "log_probs in the output.");
  return p;
}

SimpleFullSoftmax::SimpleFullSoftmax(const glossa::Params& p) : BaseLayer(p) {
  input_dim_ = params().GetInt("input_dim");
  num_classes_ = params().GetInt("num_classes");
  label_smoothing_ = params().GetFloat("label_smoothing");
  if (params().IsSet("logits_abs_max")) logits_abs_max_ = params().GetFloat("logits_abs_max");
  compute_per_example_argmax_ = params().GetBool("compute_per_example_argmax");
  fused_xent_ = params().GetBool("fused_xent");
  if (input_dim_ <= 0 || num_classes_ <= 0) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': input_dim and num_classes must be > 0"));
  }
  if (label_smoothing_ < 0 || label_smoothing_ >= 1) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': label_smoothing must be in [0, 1)"));
  }
  const DType dtype = params().Get("dtype").AsDType();
  CreateVariable("weight_0",
                 WeightParams({input_dim_, num_classes_},
                              WeightInit::FromParams(params().GetParams("params_init")), dtype));
  CreateVariable("bias_0", WeightParams({num_classes_}, WeightInit::Constant(0.0), dtype));
}

at::Tensor SimpleFullSoftmax::Logits(const NestedMap& theta, const at::Tensor& inputs) const {
  if (inputs.dim() < 1 || inputs.size(-1) != input_dim_) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': inputs must end in input_dim ",
                                      input_dim_, ", got shape ", inputs.sizes()));
  }
  const at::Tensor x = CastToFPropDtype(inputs);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = num_classes_;
  at::Tensor logits =
      Affine(x.reshape({-1, input_dim_}), theta.GetTensor("weight_0"), theta.GetTensor("bias_0"))
          .view(shape);
  if (logits_abs_max_) logits = at::clamp(logits, -*logits_abs_max_, *logits_abs_max_);
  return logits;
}

NestedMap SimpleFullSoftmax::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                   const at::Tensor& class_ids, const at::Tensor& class_weights,
                                   const at::Tensor& paddings,
                                   const at::Tensor& class_probabilities) const {
  if (class_ids.defined() && !class_probabilities.defined() && fused_xent_ && !logits_abs_max_ &&
      FusedSoftmaxXentApplies(inputs) &&
      inputs.scalar_type() != at::kDouble && inputs.dim() >= 1 && inputs.size(-1) == input_dim_) {
    // x·w alone; the kernel adds the bias as it reads the logits (addmm would first broadcast it
    // into its whole [N, C] output) and computes its gradient in its backward pass.
    const at::Tensor x = CastToFPropDtype(inputs);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = num_classes_;
    // In float32 (the kernel's dtype): bf16 products arrive rounded to bf16 as before, without
    // a bf16 copy of all N·C logits and its widening (and the same in the backward).
    const at::Tensor xw = Affine(x.reshape({-1, input_dim_}), theta.GetTensor("weight_0"),
                                 at::Tensor(), /*relu=*/false, /*float_out=*/true)
                              .view(shape);
    return Xent(xw, theta.GetTensor("bias_0"), class_ids, class_weights, paddings, {});
  }
  return XentFromLogits(Logits(theta, inputs), class_ids, class_weights, paddings,
                        class_probabilities);
}

NestedMap SimpleFullSoftmax::XentFromLogits(const at::Tensor& logits, const at::Tensor& class_ids,
                                            const at::Tensor& class_weights,
                                            const at::Tensor& paddings,
                                            const at::Tensor& class_probabilities) const {
  return Xent(logits, {}, class_ids, class_weights, paddings, class_probabilities);
}

NestedMap SimpleFullSoftmax::Xent(const at::Tensor& logits, const at::Tensor& bias,
                                  const at::Tensor& class_ids, const at::Tensor& class_weights,
                                  const at::Tensor& paddings,
                                  const at::Tensor& class_probabilities) const {
  CheckXentInputs(path(), num_classes_, logits, class_ids, class_probabilities);
  NestedMap out;
  // With a separate bias (FProp's fused path) the logits are never formed; Logits() gives them.
  if (!bias.defined()) out.Put("logits", logits);
  at::Tensor xent;
  if (class_ids.defined() && fused_xent_ && logits.scalar_type() != at::kDouble &&
      FusedSoftmaxXentApplies(logits)) {
    // -Σ_c t_c log p_c with t = (1 - ls)·one_hot + ls/C, in one pass.
    SoftmaxXent r = FusedSoftmaxXent(logits, class_ids, 1 - label_smoothing_,
                                     label_smoothing_ / num_classes_, compute_per_example_argmax_,
                                     bias);
    xent = r.xent;
    out.Put("per_example_label_log_prob", r.label_log_prob);
    out.Put("per_example_max_log_prob", r.max_log_prob);
    if (compute_per_example_argmax_) out.Put("per_example_argmax", r.argmax);
  } else {
    // The loss is computed in float32 at least, whatever the fprop dtype.
    at::Tensor logits32 = logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat);
    at::Tensor log_probs = at::log_softmax(logits32, -1);
    if (class_ids.defined()) {
      // -Σ_c t_c log p_c with t = (1 - ls)·one_hot + ls/C, without building the one-hot tensor:
      // -(1 - ls)·log p_label - (ls/C)·Σ_c log p_c.
      const at::Tensor label_lp =
          log_probs.gather(-1, class_ids.to(at::kLong).unsqueeze(-1)).squeeze(-1);
      xent = -label_lp;
      if (label_smoothing_ > 0) {
        xent =
            xent * (1 - label_smoothing_) - log_probs.sum(-1) * (label_smoothing_ / num_classes_);
      }
      out.Put("per_example_label_log_prob", label_lp.detach());
    } else {
      at::Tensor targets = class_probabilities.to(log_probs.scalar_type());
      if (label_smoothing_ > 0) {
        targets = targets * (1 - label_smoothing_) + label_smoothing_ / num_classes_;
      }
      xent = -(targets * log_probs).sum(-1);
    }
    out.Put("log_probs", log_probs);
    if (compute_per_example_argmax_) {
      out.Put("per_example_argmax", log_probs.detach().argmax(-1));  // float32: bf16 is slower
    }
    out.Put("per_example_max_log_prob", at::amax(log_probs.detach(), {-1}));
  }
  at::Tensor weights =
      class_weights.defined() ? class_weights.to(xent.scalar_type()) : at::ones_like(xent);
  if (paddings.defined()) weights = weights * (1 - paddings.to(xent.scalar_type()));
  at::Tensor total_xent = (xent * weights).sum();
  at::Tensor total_weight = weights.sum();
  out.Put("per_example_xent", xent);
  out.Put("per_example_weight", weights);
  out.Put("total_xent", total_xent);
  out.Put("total_weight", total_weight);
  out.Put("avg_xent", total_xent / at::clamp_min(total_weight, 1e-6));
  return out;
}

GLOSSA_REGISTER_CLASS(SimpleFullSoftmax, "glossa.layers.SimpleFullSoftmax");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature SimpleFullSoftmax::FPropMapSpec() const {
  return {{"inputs", "class_ids", "class_weights", "paddings", "class_probabilities"}, 1, {}, false, "dict (logits, per_example_xent, ...)"};
}

NestedMap SimpleFullSoftmax::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  return FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "class_ids"), OptionalInput(inputs, "class_weights"),
               OptionalInput(inputs, "paddings"), OptionalInput(inputs, "class_probabilities"));
}

// ---- TorchScript export ----

// The logits x·w + b (the task applies its log-softmax).
void SimpleFullSoftmax::EmitTorchScript(TorchScriptWriter& w, const std::string& in,
                                        const std::string& out, const std::string& prefix) const {
  if (!params().Get("logits_abs_max").is_none()) {
    TorchScriptWriter::Unsupported(*this, "logits_abs_max");
  }
  const at::Tensor wt = GetVariable("weight_0");
  const std::string bn = w.Param(prefix + "softmax_b", GetVariable("bias_0"));
  const std::string wn = w.Param(prefix + "softmax_w", wt);
  w.Line(StrCat(out, " = torch.addmm(", bn, ", ", in, ".reshape(-1, [", wt.size(0), "][0]), ", wn,
                ").view(b, t, ", wt.size(1), ")"));
}

std::string SimpleFullSoftmax::EmitOnnx(OnnxGraph& g, const std::string& in,
                                        const std::string& prefix) const {
  if (!params().Get("logits_abs_max").is_none()) OnnxGraph::Unsupported(*this, "logits_abs_max");
  return g.Affine(in, g.Weight(prefix + "softmax_w", GetVariable("weight_0")),
                  g.Weight(prefix + "softmax_b", GetVariable("bias_0")));
}

}  // namespace glossa
