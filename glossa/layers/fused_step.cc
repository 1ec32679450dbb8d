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
#include "glossa/layers/linear.h"
#include "glossa/layers/transformer.h"

namespace glossa {
namespace {

// Records why `layer` cannot take its part of the fused step (the first reason met) and returns
// false.
bool Decline(FusedStepKeep* keep, const BaseLayer& layer, const std::string& why) {
  if (keep != nullptr && keep->declined.empty()) {
    keep->declined = StrCat("layer '", layer.path(), "': ", why);
  }
  return false;
}

std::string DtypeOf(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return StrCat(c10::toString(t.scalar_type()), t.is_contiguous() ? "" : ", not contiguous",
                t.device().is_cpu() ? "" : ", not on the CPU");
}

// An attention's projections for the fused step (key and value null: a cross-attention's) and
// its query scale, kept alive in *keep.
bool ProjectionsAndScale(const MultiHeadedAttention& atten, const NestedMap& theta,
                         StepProjArgs* query, StepProjArgs* key, StepProjArgs* value,
                         StepProjArgs* post, const float** query_scale, FusedStepKeep* keep) {
  at::Tensor scale;
  if (!atten.FusedStepProjections(theta, query, key, value, post, &scale, keep)) return false;
  *query_scale = scale.data_ptr<float>();
  keep->tensors.push_back(scale);
  return true;
}

}  // namespace

bool MultiHeadedProjectionLayer::FusedStepArgs(const NestedMap& theta, StepProjArgs* out,
                                               FusedStepKeep* keep) const {
  if (axis_ != nullptr) {  // a block of heads: the step runs whole layers in one process
    return Decline(keep, *this, "a block of heads on a model axis (the fused step runs whole layers)");
  }
  const at::Tensor& w = theta.GetTensor("w");  // [D, N, H]
  const float* wp = FusedStepData(w);
  const float* bp = use_bias_ ? FusedStepData(theta.GetTensor("b")) : nullptr;
  if (wp == nullptr || (use_bias_ && bp == nullptr)) {
    return Decline(keep, *this, StrCat("its weights are not float32 contiguous CPU tensors (w: ",
                                       DtypeOf(w), ")"));
  }
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

bool ProjectionLayer::FusedStepArgs(const NestedMap& theta, StepProjArgs* out, bool* relu,
                                    FusedStepKeep* keep) const {
  if (activation_ != "RELU" && activation_ != "NONE") {
    return Decline(keep, *this, StrCat("activation ", activation_,
                                       " (the fused step applies RELU or none)"));
  }
  if (axis_ != nullptr) {
    return Decline(keep, *this, "a shard on a model axis (the fused step runs whole layers)");
  }
  *relu = activation_ == "RELU";
  const at::Tensor& w = theta.GetTensor("w");
  *out = StepProjArgs{FusedStepData(w), has_bias_ ? FusedStepData(theta.GetTensor("b")) : nullptr,
                      input_dim_, output_dim_, false, nullptr};
  if (out->w == nullptr || (has_bias_ && out->b == nullptr)) {
    return Decline(keep, *this, StrCat("its weights are not float32 contiguous CPU tensors (w: ",
                                       DtypeOf(w), ")"));
  }
  // The plan's int8 form of the weight FProp reads, and its batch invariance.
  if (const PreparedWeight* p = PlannedWeight("w", {w})) {
    out->w8 = p->int8.get();
    if (p->panels.defined()) out->panels = p->panels.data_ptr<float>();
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
  if (!fuse_qkv_) {
    return Decline(keep, *this, "its query, key and value are not all MultiHeadedProjectionLayers");
  }
  if (!query_->FusedStepArgs(query_.Theta(theta), query, keep) ||
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
  if (FusedStepData(*query_scale) == nullptr) {
    return Decline(keep, *this, StrCat("its query scale is ", DtypeOf(*query_scale)));
  }
  return true;
}

bool TransformerFeedForwardLayer::FusedStepArgs(const NestedMap& theta, StepFeedForwardArgs* out,
                                                FusedStepKeep* keep) const {
  if (!pre_layer_norm_) {
    return Decline(keep, *this, "post layer norm (pre_layer_norm False): the fused step normalizes "
                                "before the block");
  }
  if (!relu_dropout_->IsIdentity() || !residual_dropout_->IsIdentity()) {
    return Decline(keep, *this, "a dropout that is not the identity");
  }
  bool relu0 = false, relu1 = false;
  if (!ln_->FusedStepArgs(ln_.Theta(theta), &out->ln)) {
    return Decline(keep, *ln_, "its scale and bias are not float32 contiguous CPU tensors");
  }
  if (!fc0_->FusedStepArgs(fc0_.Theta(theta), &out->fc0, &relu0, keep) ||
      !fc1_->FusedStepArgs(fc1_.Theta(theta), &out->fc1, &relu1, keep)) {
    return false;
  }
  if (relu1) return Decline(keep, *fc1_, "an activation on the block's output projection");
  out->relu = relu0;
  out->residual_weight = static_cast<float>(residual_weight_);
  return true;
}

bool TransformerAttentionLayer::FusedStepNorm(const NestedMap& theta, StepNormArgs* ln,
                                              FusedStepKeep* keep) const {
  if (!pre_layer_norm_) {
    return Decline(keep, *this, "post layer norm (pre_layer_norm False): the fused step normalizes "
                                "before the block");
  }
  if (!residual_dropout_->IsIdentity()) {
    return Decline(keep, *this, "a residual dropout that is not the identity");
  }
  if (!ln_->FusedStepArgs(ln_.Theta(theta), ln)) {
    return Decline(keep, *ln_, "its scale and bias are not float32 contiguous CPU tensors");
  }
  return true;
}

bool TransformerAttentionLayer::FusedSelfStepWeights(const NestedMap& theta,
                                                     StepSelfAttentionArgs* out,
                                                     FusedStepKeep* keep) const {
  if (!is_masked_) return Decline(keep, *this, "self-attention that is not causal (is_masked False)");
  if (!FusedStepNorm(theta, &out->ln, keep) ||
      !ProjectionsAndScale(*atten_, atten_.Theta(theta), &out->query, &out->key, &out->value,
                           &out->post, &out->query_scale, keep)) {
    return false;
  }
  out->heads = atten_->num_heads();
  out->dim = atten_->dim_per_head();
  return true;
}

bool TransformerAttentionLayer::FusedSelfStep(const NestedMap& theta, const NestedMap& states,
                                              int64_t rows, StepSelfAttentionArgs* out,
                                              MultiHeadedAttention::StepCaches* caches,
                                              FusedStepKeep* keep) const {
  if (!FusedSelfStepWeights(theta, out, keep)) return false;
  // The caches must already be float32 and contiguous: PrepareStep would otherwise convert them.
  if (!states.contains("unordered") || !states.contains("rows")) {
    return Decline(keep, *this, "its decoding states have no row-table caches");
  }
  const NestedMap& kv = states.GetItem("unordered").AsMap();
  if (FusedStepData(kv.GetTensor("key")) == nullptr ||
      FusedStepData(kv.GetTensor("value")) == nullptr || !states.GetTensor("rows").is_contiguous()) {
    return Decline(keep, *this, StrCat("its key cache is ", DtypeOf(kv.GetTensor("key")),
                                       " (the fused step reads float32 caches in place)"));
  }
  *caches = atten_->PrepareStep(states, rows, at::kFloat);
  out->key_cache = caches->key.data_ptr<float>();
  out->value_cache = caches->value.data_ptr<float>();
  out->slots = caches->key.size(0);
  out->capacity = caches->key.size(1);
  out->rows = caches->rows.data_ptr<int64_t>();
  out->rows_stride = caches->rows.size(1);
  out->step = caches->step;
  return true;
}

bool TransformerAttentionLayer::FusedCrossStepWeights(const NestedMap& theta,
                                                      StepCrossAttentionArgs* out,
                                                      FusedStepKeep* keep) const {
  // The source's keys and values were projected once (ProjectSource): no key/value here.
  if (!FusedStepNorm(theta, &out->ln, keep) ||
      !ProjectionsAndScale(*atten_, atten_.Theta(theta), &out->query, nullptr, nullptr,
                           &out->post, &out->query_scale, keep)) {
    return false;
  }
  out->heads = atten_->num_heads();
  out->dim = atten_->dim_per_head();
  return true;
}

bool TransformerAttentionLayer::FusedCrossStep(const NestedMap& theta, const NestedMap& aux,
                                               int64_t rows, StepCrossAttentionArgs* out,
                                               FusedStepKeep* keep) const {
  if (!FusedCrossStepWeights(theta, out, keep)) return false;
  const at::Tensor& k = aux.GetTensor("key");  // [sources, S, heads, dim]: row i reads i % sources
  const at::Tensor& v = aux.GetTensor("value");
  if (k.dim() != 4 || k.sizes() != v.sizes() || k.size(0) == 0 || rows % k.size(0) != 0 ||
      k.size(2) != out->heads || k.size(3) != out->dim) {
    return Decline(keep, *this, StrCat("source keys ", k.sizes(), " and values ", v.sizes(),
                                       " are not [sources, S, ", out->heads, ", ", out->dim,
                                       "] for ", rows, " rows"));
  }
  out->key = FusedStepData(k);
  out->value = FusedStepData(v);
  out->sources = k.size(0);
  out->source_length = k.size(1);
  if (out->key == nullptr || out->value == nullptr) {
    return Decline(keep, *this, StrCat("its source keys are ", DtypeOf(k)));
  }
  return true;
}

bool TransformerLayer::FusedExtendStep(const NestedMap& theta, const at::Tensor& inputs,
                                       const NestedMap& states, const NestedMap& aux,
                                       const at::Tensor& aux_paddings,
                                       const at::Tensor& paddings, at::Tensor* out,
                                       NestedMap* new_states, FusedStepKeep& keep) const {
  if (!FusedStepMode(compute_plan(), &keep) || !FusedStepLayer(&keep)) return false;
  if (inputs.dim() != 2 || FusedStepData(inputs) == nullptr) {
    return Decline(&keep, *this, StrCat("the step's inputs are ", inputs.sizes(), " ",
                                        DtypeOf(inputs), ", not [rows, D] float32 contiguous"));
  }
  const auto& ff = dynamic_cast<const TransformerFeedForwardLayer&>(*fflayer_);
  DecoderLayerStepArgs a;
  a.rows = inputs.size(0);
  a.model_dim = inputs.size(1);
  if (!ff.FusedStepArgs(fflayer_.Theta(theta), &a.ff, &keep)) return false;
  std::vector<float> bias;
  if (cross_atten_) {
    if (!cross_atten_->FusedCrossStep(cross_atten_.Theta(theta), aux, a.rows, &a.cross, &keep)) {
      return false;
    }
    const int64_t s = a.cross.source_length;
    if (aux_paddings.defined()) {
      const at::Tensor p = aux_paddings.to(at::kFloat).contiguous();
      if (p.dim() != 2 || p.size(0) != a.cross.sources || p.size(1) != s) {
        return Decline(&keep, *this, StrCat("source paddings ", p.sizes(), " are not [",
                                            a.cross.sources, ", ", s, "]"));
      }
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

bool TransformerLayer::FusedStepMode(const ComputePlan* plan, FusedStepKeep* keep) const {
  const std::string why = FusedDecoderStepDeclined(plan);
  return why.empty() || Decline(keep, *this, why);
}

bool TransformerLayer::FusedStepLayer(FusedStepKeep* keep) const {
  if (dynamic_cast<const TransformerFeedForwardLayer*>(fflayer_.get()) == nullptr) {
    return Decline(keep, *fflayer_, "a feed-forward block other than TransformerFeedForwardLayer");
  }
  if (fprop_dtype() != at::kFloat) {
    return Decline(keep, *this, StrCat("it computes in ", c10::toString(fprop_dtype()),
                                       " (the fused step computes in float32)"));
  }
  return true;
}

std::string TransformerLayer::FusedStepDeclined(const NestedMap& theta,
                                                const ComputePlan* plan) const {
  FusedStepKeep keep;
  DecoderLayerStepArgs a;
  // The configuration's reasons first (they hold for every run), then the mode's.
  if (FusedStepLayer(&keep) &&
      dynamic_cast<const TransformerFeedForwardLayer&>(*fflayer_)
          .FusedStepArgs(fflayer_.Theta(theta), &a.ff, &keep) &&
      (!cross_atten_ ||
       cross_atten_->FusedCrossStepWeights(cross_atten_.Theta(theta), &a.cross, &keep)) &&
      self_atten_->FusedSelfStepWeights(self_atten_.Theta(theta), &a.self, &keep) &&
      FusedStepMode(plan, &keep)) {
    return "";
  }
  return keep.declined;
}

void TransformerLayer::PrepareWeights(const NestedMap& theta, ComputePlan& plan) const {
  // Only a causal layer steps (an encoder's never does), and only a plan for the fused step asks.
  if (!self_atten_->is_masked() || !plan.policy().fused_decoder_step) return;
  at::NoGradGuard no_grad;  // as the plan's steps run
  const std::string why = FusedStepDeclined(theta, &plan);
  if (why.empty()) return;
  // One line per reason: the same reason in every layer is the layers' configuration.
  const size_t reason = why.find("': ");
  plan.AddNote(StrCat("fused decoder step declined: ",
                      reason == std::string::npos ? why : why.substr(reason + 3)),
               StrCat("fused decoder step declined: ", why));
}

}  // namespace glossa
