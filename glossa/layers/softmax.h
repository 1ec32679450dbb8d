// SimpleFullSoftmax: logits = x·w + b over all classes, with cross-entropy against class ids or
// class probabilities, label smoothing, per-example weights and paddings (Lingvo's
// SimpleFullSoftmax, plus the label smoothing Lingvo applies in its tasks).
//
//   NestedMap out = softmax->FProp(theta, x, labels, weights);   // x [B, T, D], labels [B, T]
//   at::Tensor loss = out.GetTensor("avg_xent");
#pragma once

#include <optional>

#include "glossa/layers/base_layer.h"

namespace glossa {

class SimpleFullSoftmax : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs, class_ids=None, class_weights=None, paddings=None, class_probabilities=None) -> dict (logits, per_example_xent, ...).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + input_dim, num_classes, label_smoothing (0), logits_abs_max (None: no clipping),
  // weight_split_dims_mapping (None; [None, "model"] splits the classes over a model axis: the
  // cross-entropy then never gathers the logits, Logits() sums them over the axis, and FProp
  // gives no per_example_argmax nor log_probs).
  static glossa::Params Params();
  explicit SimpleFullSoftmax(const glossa::Params& p);

  // Logits [..., num_classes] of inputs [..., input_dim].
  at::Tensor Logits(const NestedMap& theta, const at::Tensor& inputs) const;

  // Cross-entropy. Targets are `class_ids` [...] (integers) or `class_probabilities`
  // [..., num_classes] (exactly one defined). Weights `class_weights` [...] (default 1) are
  // multiplied by 1 - paddings when paddings are given. Returns a NestedMap with logits (not
  // on FProp's fused path: there the kernel adds the bias itself; Logits() gives them),
  // per_example_xent, per_example_max_log_prob, per_example_argmax (when
  // compute_per_example_argmax), per_example_weight, total_xent, total_weight and avg_xent =
  // total_xent / max(total_weight, 1e-6); with class_ids also per_example_label_log_prob (no
  // gradient); and log_probs unless the fused kernel ran (param fused_xent).
  NestedMap FProp(const NestedMap& theta, const at::Tensor& inputs, const at::Tensor& class_ids,
                  const at::Tensor& class_weights = {}, const at::Tensor& paddings = {},
                  const at::Tensor& class_probabilities = {}) const;

  // FProp's cross-entropy from logits computed elsewhere (a softmax tied to an embedding).
  NestedMap XentFromLogits(const at::Tensor& logits, const at::Tensor& class_ids,
                           const at::Tensor& class_weights = {}, const at::Tensor& paddings = {},
                           const at::Tensor& class_probabilities = {}) const;
  // The inference plan's form of weight_0 (glossa/kernels/compute_plan.h); not for a block of
  // classes.
  void PrepareWeights(const NestedMap& theta, ComputePlan& plan) const override;

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  // The cross-entropy of logits (+ bias, when defined: only on the fused kernel's path).
  NestedMap Xent(const at::Tensor& logits, const at::Tensor& bias, const at::Tensor& class_ids,
                 const at::Tensor& class_weights, const at::Tensor& paddings,
                 const at::Tensor& class_probabilities) const;

  // The cross-entropy against class_ids with the classes split over axis_: each rank's
  // logsumexp, max and label logit over its classes, combined by one all-reduce.
  NestedMap ShardedXent(const NestedMap& theta, const at::Tensor& inputs,
                        const at::Tensor& class_ids, const at::Tensor& class_weights,
                        const at::Tensor& paddings) const;
  // The per-example weights (class_weights · (1 - paddings)) and the totals, into `out`.
  static void AddTotals(NestedMap& out, const at::Tensor& xent, const at::Tensor& class_weights,
                        const at::Tensor& paddings);
  // This rank's logits [N, num_classes / axis size] (float32) of inputs [..., input_dim].
  at::Tensor LocalLogits(const NestedMap& theta, const at::Tensor& inputs) const;

  int64_t input_dim_, num_classes_;
  MeshAxis* axis_ = nullptr;  // the classes are split over it (weight_split_dims_mapping)
  double label_smoothing_;
  std::optional<double> logits_abs_max_;
  bool compute_per_example_argmax_;
  bool fused_xent_;
};

}  // namespace glossa
