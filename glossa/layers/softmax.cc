#include "glossa/layers/flops.h"
#include "glossa/layers/softmax.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/kernels/fused_xent.h"
#include "glossa/kernels/gemm.h"
#include "glossa/layers/mesh.h"
#include "glossa/layers/weight_init.h"

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
  p.Define("weight_split_dims_mapping", nullptr,
           "Tensor parallelism: per dim of weight_0 [input_dim, num_classes], None or a mesh "
           "axis name; [None, \"model\"] splits the classes (and bias_0) over the 'model' axis: "
           "the cross-entropy against class_ids combines the ranks' logsumexp and label logits "
           "in one all-reduce and never gathers the logits. Built whole without that axis.");
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
  WeightParams w({input_dim_, num_classes_},
                 WeightInit::FromParams(params().GetParams("params_init")), dtype);
  WeightParams b({num_classes_}, WeightInit::Constant(0.0), dtype);
  const WeightSplit split = ParseWeightSplit(params().Get("weight_split_dims_mapping"), 2,
                                             StrCat("layer '", path(), "'"));
  if (split.dim == 0) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': weight_split_dims_mapping may split "
                                      "the classes (dim 1) only"));
  }
  axis_ = split.Resolve(build_context());
  if (axis_ != nullptr) {
    const int64_t m = axis_->size();
    if (num_classes_ % m != 0 || logits_abs_max_) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': ", logits_abs_max_ ?
                                        "logits_abs_max with the classes split" :
                                        StrCat("num_classes ", num_classes_, " does not split"),
                                        " over the ", m, " ranks of the '", split.axis,
                                        "' axis"));
    }
    for (WeightParams* wp : {&w, &b}) {
      wp->shape.back() = num_classes_ / m;
      wp->collections.push_back(kModelShardedCollection);
      wp->shard_dim = static_cast<int64_t>(wp->shape.size()) - 1;
      wp->shard_index = axis_->index();
      wp->shard_count = m;
    }
  }
  CreateVariable("weight_0", w);
  CreateVariable("bias_0", b);
}

at::Tensor SimpleFullSoftmax::LocalLogits(const NestedMap& theta, const at::Tensor& inputs) const {
  if (inputs.dim() < 1 || inputs.size(-1) != input_dim_) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': inputs must end in input_dim ",
                                      input_dim_, ", got shape ", inputs.sizes()));
  }
  const at::Tensor x = ReplicateOverAxis(*axis_, CastToFPropDtype(inputs).reshape({-1, input_dim_}));
  return Affine(x, theta.GetTensor("weight_0"), theta.GetTensor("bias_0")).to(at::kFloat);
}

NestedMap SimpleFullSoftmax::ShardedXent(const NestedMap& theta, const at::Tensor& inputs,
                                         const at::Tensor& class_ids,
                                         const at::Tensor& class_weights,
                                         const at::Tensor& paddings) const {
  const at::Tensor local = LocalLogits(theta, inputs);  // [N, n]
  const int64_t m = axis_->size(), k = axis_->index(), n = local.size(1);
  const std::vector<int64_t> batch_shape(inputs.sizes().begin(), inputs.sizes().end() - 1);
  if (class_ids.sizes().vec() != batch_shape || at::isFloatingType(class_ids.scalar_type()) ||
      (class_ids.numel() > 0 && (class_ids.min().item<int64_t>() < 0 ||
                                 class_ids.max().item<int64_t>() >= num_classes_))) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': class_ids must be integers in [0, ",
                                      num_classes_, ") shaped ", at::IntArrayRef(batch_shape),
                                      ", got ", class_ids.sizes()));
  }
  const at::Tensor ids = class_ids.reshape({-1}).to(at::kLong) - k * n;
  const at::Tensor mine = (ids >= 0) & (ids < n);
  const at::Tensor zero = at::zeros({local.size(0)}, local.options());
  // One all-reduce of rows: each rank's logsumexp at row k and max at row m + k (zeros in the
  // others' rows), the label logit (its owner's), and the sum of the logits (label smoothing).
  std::vector<at::Tensor> rows(2 * m + 2, zero);
  rows[k] = at::logsumexp(local, -1);
  rows[m + k] = std::get<0>(local.detach().max(-1));
  rows[2 * m] = local.gather(-1, at::where(mine, ids, at::zeros_like(ids)).unsqueeze(-1))
                    .squeeze(-1) * mine.to(local.scalar_type());
  if (label_smoothing_ > 0) rows[2 * m + 1] = local.sum(-1);
  const at::Tensor all = ReduceOverAxis(*axis_, at::stack(rows));
  const at::Tensor lse = at::logsumexp(all.slice(0, 0, m), 0);
  const at::Tensor label_lp = all[2 * m] - lse;
  at::Tensor xent = -label_lp;
  if (label_smoothing_ > 0) {
    const at::Tensor sum_log_probs = all[2 * m + 1] - lse * static_cast<double>(num_classes_);
    xent = xent * (1 - label_smoothing_) - sum_log_probs * (label_smoothing_ / num_classes_);
  }
  NestedMap out;
  out.Put("per_example_label_log_prob", label_lp.detach().view(batch_shape));
  out.Put("per_example_max_log_prob",
          (all.slice(0, m, 2 * m).amax(0) - lse).detach().view(batch_shape));
  AddTotals(out, xent.view(batch_shape), class_weights, paddings);
  return out;
}

at::Tensor SimpleFullSoftmax::Logits(const NestedMap& theta, const at::Tensor& inputs) const {
  if (axis_ != nullptr) {
    // Every class's logit: this rank's block in place, zeros elsewhere, summed over the axis.
    const at::Tensor local = LocalLogits(theta, inputs);
    const int64_t n = local.size(1), lo = axis_->index() * n;
    std::vector<int64_t> shape = inputs.sizes().vec();
    shape.back() = num_classes_;
    return ReduceOverAxis(*axis_, at::constant_pad_nd(local, {lo, num_classes_ - lo - n}))
        .view(shape)
        .to(fprop_dtype());
  }
  if (inputs.dim() < 1 || inputs.size(-1) != input_dim_) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': inputs must end in input_dim ",
                                      input_dim_, ", got shape ", inputs.sizes()));
  }
  const at::Tensor x = CastToFPropDtype(inputs);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = num_classes_;
  const at::Tensor& w = theta.GetTensor("weight_0");
  at::Tensor logits =
      PlannedAffine("weight_0", w, x.reshape({-1, input_dim_}), w, theta.GetTensor("bias_0"))
          .view(shape);
  if (logits_abs_max_) logits = at::clamp(logits, -*logits_abs_max_, *logits_abs_max_);
  return logits;
}

void SimpleFullSoftmax::PrepareWeights(const NestedMap& theta, ComputePlan& plan) const {
  if (axis_ != nullptr) return;  // a block of classes: the plan covers a model in one process
  const at::Tensor& w = theta.GetTensor("weight_0");
  plan.Prepare(PlanKey("weight_0"), w, {w});
}

NestedMap SimpleFullSoftmax::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                   const at::Tensor& class_ids, const at::Tensor& class_weights,
                                   const at::Tensor& paddings,
                                   const at::Tensor& class_probabilities) const {
  if (axis_ != nullptr) {
    if (!class_ids.defined() || class_probabilities.defined()) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': with the classes split over the '",
                                        "model' axis the cross-entropy takes class_ids only"));
    }
    return ShardedXent(theta, inputs, class_ids, class_weights, paddings);
  }
  if (class_ids.defined() && !class_probabilities.defined() && fused_xent_ && !logits_abs_max_ &&
      FusedSoftmaxXentApplies(inputs) &&
      inputs.scalar_type() != at::kDouble && inputs.dim() >= 1 && inputs.size(-1) == input_dim_) {
    // x·w alone; the kernel adds the bias as it reads the logits (addmm would first broadcast it
    // into its whole [N, C] output) and computes its gradient in its backward pass.
    const at::Tensor x = CastToFPropDtype(inputs);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = num_classes_;
    // In x's dtype: the kernel reads bf16 logits as they are and gives their gradient in bf16
    // (ATen's bf16 GEMM then needs no float32 copy of all N·C logits, nor its backward one of
    // the gradient); float32 ones as float32.
    const at::Tensor& w = theta.GetTensor("weight_0");
    const at::Tensor xw = PlannedAffine("weight_0", w, x.reshape({-1, input_dim_}), w,
                                        at::Tensor(), /*relu=*/false, /*float_out=*/false)
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
  AddTotals(out, xent, class_weights, paddings);
  return out;
}

void SimpleFullSoftmax::AddTotals(NestedMap& out, const at::Tensor& xent,
                                  const at::Tensor& class_weights, const at::Tensor& paddings) {
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
}

GLOSSA_REGISTER_CLASS(SimpleFullSoftmax, "glossa.layers.SimpleFullSoftmax");
// The logits' projection: 2 per weight a token meets (what a pipeline's last stage adds).
[[maybe_unused]] static const bool kDeclaredFlops = RegisterDeclaredFlops(
    "glossa.layers.SimpleFullSoftmax", [](const glossa::Params& p) -> std::optional<double> {
      return 2.0 * p.GetInt("input_dim") * p.GetInt("num_classes");
    });

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature SimpleFullSoftmax::FPropMapSpec() const {
  return {{"inputs", "class_ids", "class_weights", "paddings", "class_probabilities"}, 1, {}, false, "dict (logits, per_example_xent, ...)"};
}

NestedMap SimpleFullSoftmax::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  return FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "class_ids"), OptionalInput(inputs, "class_weights"),
               OptionalInput(inputs, "paddings"), OptionalInput(inputs, "class_probabilities"));
}

}  // namespace glossa
