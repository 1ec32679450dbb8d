// The layers' side of the fused decoding step (glossa/kernels/decoder_step.h): each block fills
// its part of DecoderLayerStepArgs from its theta, or says it cannot, and TransformerLayer runs
// the step as one DecoderLayerStep where every part can.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/kernels/int8_gemm.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/transformer.h"

namespace glossa {

bool MultiHeadedProjectionLayer::FusedStepArgs(const NestedMap& theta, StepProjArgs* out,
                                               FusedStepKeep* /*keep*/) const {
  if (axis_ != nullptr) return false;  // a block of heads: the step runs in one process
  const at::Tensor& w = theta.GetTensor("w");  // [D, N, H]
  const float* wp = FusedStepData(w);
  const float* bp = use_bias_ ? FusedStepData(theta.GetTensor("b")) : nullptr;
  if (wp == nullptr || (use_bias_ && bp == nullptr)) return false;
  const int64_t d = w.size(0), nh = w.size(1) * w.size(2);
  *out = StepProjArgs{wp, bp, is_output_projection_ ? nh : d, is_output_projection_ ? d : nh,
                      is_output_projection_, nullptr};
  // The plan's int8 form of the weight FProp reads, and its batch invariance.
  if (const PreparedWeight* p = PlannedWeight("w", {w})) {
    out->w8 = p->int8.get();
    if (p->panels.defined()) out->panels = p->panels.data_ptr<float>();  // [nh, d] for a post
    if (p->panels_bf16.defined()) {
      out->panels_bf16 = reinterpret_cast<const uint16_t*>(p->panels_bf16.data_ptr());
    }
  }
  out->row_kernels = PlannedBatchInvariant();
  return true;
}

bool MultiHeadedAttention::FusedStepProjections(const NestedMap& theta, StepProjArgs* query,
                                                StepProjArgs* key, StepProjArgs* value,
                                                StepProjArgs* post, at::Tensor* query_scale,
                                                FusedStepKeep* keep) const {
  if (!fuse_qkv_ || !query_->FusedStepArgs(query_.Theta(theta), query, keep) ||
      (key != nullptr && !key_->FusedStepArgs(key_.Theta(theta), key, keep)) ||
      (value != nullptr && !value_->FusedStepArgs(value_.Theta(theta), value, keep)) ||
      !post_->FusedStepArgs(post_.Theta(theta), post, keep)) {
    return false;
  }
  // The reference multiplies q by this vector (PerDimScaleLayer) or by the float 1/sqrt(dim).
  *query_scale = per_dim_scale_
                     ? ScaleQuery(theta, at::ones({dim_per_head_}, at::kFloat)).contiguous()
                     : at::full({dim_per_head_}, 1.0 / std::sqrt(static_cast<double>(dim_per_head_)),
                                at::kFloat);
  return FusedStepData(*query_scale) != nullptr;
}

bool TransformerFeedForwardLayer::FusedStepArgs(const NestedMap& theta, StepFeedForwardArgs* out,
                                                FusedStepKeep* keep) const {
  if (!pre_layer_norm_ || !relu_dropout_->IsIdentity() || !residual_dropout_->IsIdentity()) {
    return false;
  }
  bool relu0 = false, relu1 = false;
  if (!ln_->FusedStepArgs(ln_.Theta(theta), &out->ln) ||
      !fc0_->FusedStepArgs(fc0_.Theta(theta), &out->fc0, &relu0, keep) ||
      !fc1_->FusedStepArgs(fc1_.Theta(theta), &out->fc1, &relu1, keep) || relu1) {
    return false;
  }
  out->relu = relu0;
  out->residual_weight = static_cast<float>(residual_weight_);
  return true;
}

bool TransformerAttentionLayer::FusedStepPossible() const {
  return pre_layer_norm_ && residual_dropout_->IsIdentity();
}

bool TransformerAttentionLayer::FusedSelfStep(const NestedMap& theta, const NestedMap& states,
                                              int64_t rows, StepSelfAttentionArgs* out,
                                              MultiHeadedAttention::StepCaches* caches,
                                              FusedStepKeep* keep) const {
  if (!FusedStepPossible() || !is_masked_) return false;
  at::Tensor scale;
  const NestedMap& at = atten_.Theta(theta);
  if (!ln_->FusedStepArgs(ln_.Theta(theta), &out->ln) ||
      !atten_->FusedStepProjections(at, &out->query, &out->key, &out->value, &out->post, &scale,
                                    keep)) {
    return false;
  }
  // The caches must already be float32 and contiguous: PrepareStep would otherwise convert them.
  if (!states.contains("unordered") || !states.contains("rows")) return false;
  const NestedMap& kv = states.GetItem("unordered").AsMap();
  if (FusedStepData(kv.GetTensor("key")) == nullptr ||
      FusedStepData(kv.GetTensor("value")) == nullptr || !states.GetTensor("rows").is_contiguous()) {
    return false;
  }
  *caches = atten_->PrepareStep(states, rows, at::kFloat);
  out->query_scale = scale.data_ptr<float>();
  keep->tensors.push_back(scale);
  out->heads = atten_->num_heads();
  out->dim = atten_->dim_per_head();
  out->key_cache = caches->key.data_ptr<float>();
  out->value_cache = caches->value.data_ptr<float>();
  out->slots = caches->key.size(0);
  out->capacity = caches->key.size(1);
  out->rows = caches->rows.data_ptr<int64_t>();
  out->rows_stride = caches->rows.size(1);
  out->step = caches->step;
  return true;
}

bool TransformerAttentionLayer::FusedCrossStep(const NestedMap& theta, const NestedMap& aux,
                                               int64_t rows, StepCrossAttentionArgs* out,
                                               FusedStepKeep* keep) const {
  if (!FusedStepPossible()) return false;
  at::Tensor scale;
  // The source's keys and values were projected once (ProjectSource): no key/value here.
  if (!ln_->FusedStepArgs(ln_.Theta(theta), &out->ln) ||
      !atten_->FusedStepProjections(atten_.Theta(theta), &out->query, nullptr, nullptr,
                                    &out->post, &scale, keep)) {
    return false;
  }
  const at::Tensor& k = aux.GetTensor("key");  // [sources, S, heads, dim]: row i reads i % sources
  const at::Tensor& v = aux.GetTensor("value");
  out->heads = atten_->num_heads();
  out->dim = atten_->dim_per_head();
  if (k.dim() != 4 || k.sizes() != v.sizes() || k.size(0) == 0 || rows % k.size(0) != 0 ||
      k.size(2) != out->heads || k.size(3) != out->dim) {
    return false;
  }
  out->key = FusedStepData(k);
  out->value = FusedStepData(v);
  out->sources = k.size(0);
  out->source_length = k.size(1);
  out->query_scale = scale.data_ptr<float>();
  keep->tensors.push_back(scale);
  return out->key != nullptr && out->value != nullptr;
}

bool TransformerLayer::FusedExtendStep(const NestedMap& theta, const at::Tensor& inputs,
                                       const NestedMap& states, const NestedMap& aux,
                                       const at::Tensor& aux_paddings,
                                       const at::Tensor& paddings, at::Tensor* out,
                                       NestedMap* new_states) const {
  const auto* ff = dynamic_cast<const TransformerFeedForwardLayer*>(fflayer_.get());
  if (!FusedDecoderStepApplies(compute_plan()) || ff == nullptr || inputs.dim() != 2 ||
      FusedStepData(inputs) == nullptr || fprop_dtype() != at::kFloat) {
    return false;
  }
  DecoderLayerStepArgs a;
  a.rows = inputs.size(0);
  a.model_dim = inputs.size(1);
  FusedStepKeep keep;
  if (!ff->FusedStepArgs(fflayer_.Theta(theta), &a.ff, &keep)) return false;
  std::vector<float> bias;
  if (cross_atten_) {
    if (!cross_atten_->FusedCrossStep(cross_atten_.Theta(theta), aux, a.rows, &a.cross, &keep)) {
      return false;
    }
    const int64_t s = a.cross.source_length;
    if (aux_paddings.defined()) {
      const at::Tensor p = aux_paddings.to(at::kFloat).contiguous();
      if (p.dim() != 2 || p.size(0) != a.cross.sources || p.size(1) != s) return false;
      const float* pp = p.data_ptr<float>();
      bias.resize(static_cast<size_t>(p.numel()));
      for (int64_t i = 0; i < p.numel(); ++i) {
        bias[static_cast<size_t>(i)] = pp[i] > 0.5f ? std::numeric_limits<float>::lowest() : 0.0f;
      }
      a.cross.bias = bias.data();
    }
    a.has_cross = true;
  }
  MultiHeadedAttention::StepCaches caches;
  if (!self_atten_->FusedSelfStep(self_atten_.Theta(theta), states, a.rows, &a.self, &caches,
                                  &keep)) {
    return false;
  }
  std::vector<float> self_bias;
  if (paddings.defined()) {  // [rows, step + 1]: 1 masks a cached step
    const at::Tensor p = paddings.to(at::kFloat).contiguous();
    const int64_t l = a.self.step + 1;
    if (p.dim() != 2 || p.size(0) != a.rows || p.size(1) != l) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': ExtendStep paddings must be [",
                                        a.rows, ", ", l, "], got ", p.sizes()));
    }
    const float* pp = p.data_ptr<float>();
    self_bias.resize(static_cast<size_t>(a.rows * l));
    for (int64_t i = 0; i < a.rows * l; ++i) {
      self_bias[static_cast<size_t>(i)] = pp[i] > 0.5f ? std::numeric_limits<float>::lowest() : 0.0f;
    }
    a.self.bias = self_bias.data();
  }
  *out = inputs.clone();
  DecoderLayerStep(a, out->data_ptr<float>());
  *new_states = MultiHeadedAttention::StatesAfterStep(caches);
  return true;
}

}  // namespace glossa
