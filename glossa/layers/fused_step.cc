// The layers' side of the fused decoding step (glossa/kernels/decoder_step.h): FusedStepBuilder,
// a friend of each block the step reads, fills the block's part of DecoderLayerStepArgs from its
// typed children and theta, or says why it cannot, and TransformerLayer runs the step as one
// DecoderLayerStep where every part can. The kernel's argument structs appear here and in the
// kernel only: no layer header names them.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/kernels/decoder_step.h"
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

// The plan's prepared forms of a projection's weight (int8, packed panels), and its batch
// invariance.
void AddPlanned(const PreparedWeight* p, bool batch_invariant, StepProjArgs* out) {
  if (p != nullptr) {
    out->w8 = p->int8.get();
    if (p->panels.defined()) out->panels = p->panels.data_ptr<float>();  // [nh, d] for a post
    if (p->panels_bf16.defined()) {
      out->panels_bf16 = reinterpret_cast<const uint16_t*>(p->panels_bf16.data_ptr());
    }
  }
  out->row_kernels = batch_invariant;
}

}  // namespace

// Each function fills one block's part of the step's arguments from that block's theta (the
// block's own, children under their names), or returns false with keep->declined saying why (the
// first reason met); keep->tensors holds what the arguments point into.
class FusedStepBuilder {
 public:
  // A projection (the output projection transposed); float32 contiguous weights only.
  static bool Projection(const MultiHeadedProjectionLayer& l, const NestedMap& theta,
                         StepProjArgs* out, FusedStepKeep* keep);
  // With *relu for a RELU activation; other activations decline.
  static bool Projection(const ProjectionLayer& l, const NestedMap& theta, StepProjArgs* out,
                         bool* relu, FusedStepKeep* keep);
  static bool Norm(const LayerNorm& l, const NestedMap& theta, StepNormArgs* out);
  // An attention's projections (key and value null: a cross-attention step reads the source
  // projected once) and the query scale [dim], kept alive in *keep.
  static bool Projections(const MultiHeadedAttention& l, const NestedMap& theta,
                          StepProjArgs* query, StepProjArgs* key, StepProjArgs* value,
                          StepProjArgs* post, const float** query_scale, FusedStepKeep* keep);
  static bool FeedForward(const TransformerFeedForwardLayer& l, const NestedMap& theta,
                          StepFeedForwardArgs* out, FusedStepKeep* keep);
  // The block's layer norm where the step can express the block (pre layer norm, no residual
  // dropout).
  static bool BlockNorm(const TransformerAttentionLayer& l, const NestedMap& theta,
                        StepNormArgs* ln, FusedStepKeep* keep);
  // The attention steps' parts that depend on the weights and the configuration only (what a
  // plan checks once at load).
  static bool SelfWeights(const TransformerAttentionLayer& l, const NestedMap& theta,
                          StepSelfAttentionArgs* out, FusedStepKeep* keep);
  static bool CrossWeights(const TransformerAttentionLayer& l, const NestedMap& theta,
                           StepCrossAttentionArgs* out, FusedStepKeep* keep);
  // The causal self-attention step: reads `states` and prepares its caches for the step
  // (*caches: the states after it are MultiHeadedAttention::StatesAfterStep(*caches)).
  static bool SelfStep(const TransformerAttentionLayer& l, const NestedMap& theta,
                       const NestedMap& states, int64_t rows, StepSelfAttentionArgs* out,
                       MultiHeadedAttention::StepCaches* caches, FusedStepKeep* keep);
  // The cross-attention step: reads `aux` (ProjectSource of the source); the bias is the
  // caller's.
  static bool CrossStep(const TransformerAttentionLayer& l, const NestedMap& theta,
                        const NestedMap& aux, int64_t rows, StepCrossAttentionArgs* out,
                        FusedStepKeep* keep);
  // Whether `plan` (null: none) and the mode (autograd, GLOSSA_KERNELS) allow the fused step, and
  // whether the layer's classes and dtype do.
  static bool Mode(const TransformerLayer& l, const ComputePlan* plan, FusedStepKeep* keep);
  static bool Layer(const TransformerLayer& l, FusedStepKeep* keep);
  static bool ExtendStep(const TransformerLayer& l, const NestedMap& theta,
                         const at::Tensor& inputs, const NestedMap& states, const NestedMap& aux,
                         const at::Tensor& aux_paddings, const at::Tensor& paddings,
                         at::Tensor* out, NestedMap* new_states, FusedStepKeep& keep);
  static std::string Declined(const TransformerLayer& l, const NestedMap& theta,
                              const ComputePlan* plan);
};

bool FusedStepBuilder::Projection(const MultiHeadedProjectionLayer& l, const NestedMap& theta,
                                  StepProjArgs* out, FusedStepKeep* keep) {
  if (l.axis_ != nullptr) {  // a block of heads: the step runs whole layers in one process
    return Decline(keep, l, "a block of heads on a model axis (the fused step runs whole layers)");
  }
  const at::Tensor& w = theta.GetTensor("w");  // [D, N, H]
  const float* wp = FusedStepData(w);
  const float* bp = l.use_bias_ ? FusedStepData(theta.GetTensor("b")) : nullptr;
  if (wp == nullptr || (l.use_bias_ && bp == nullptr)) {
    return Decline(keep, l, StrCat("its weights are not float32 contiguous CPU tensors (w: ",
                                   DtypeOf(w), ")"));
  }
  const bool post = l.is_output_projection_;
  const int64_t d = w.size(0), nh = w.size(1) * w.size(2);
  *out = StepProjArgs{wp, bp, post ? nh : d, post ? d : nh, post, nullptr};
  AddPlanned(l.PlannedWeight("w", {w}), l.PlannedBatchInvariant(), out);
  return true;
}

bool FusedStepBuilder::Projection(const ProjectionLayer& l, const NestedMap& theta,
                                  StepProjArgs* out, bool* relu, FusedStepKeep* keep) {
  if (l.activation_ != "RELU" && l.activation_ != "NONE") {
    return Decline(keep, l, StrCat("activation ", l.activation_,
                                   " (the fused step applies RELU or none)"));
  }
  if (l.axis_ != nullptr) {
    return Decline(keep, l, "a shard on a model axis (the fused step runs whole layers)");
  }
  *relu = l.activation_ == "RELU";
  const at::Tensor& w = theta.GetTensor("w");
  *out = StepProjArgs{FusedStepData(w),
                      l.has_bias_ ? FusedStepData(theta.GetTensor("b")) : nullptr, l.input_dim_,
                      l.output_dim_, false, nullptr};
  if (out->w == nullptr || (l.has_bias_ && out->b == nullptr)) {
    return Decline(keep, l, StrCat("its weights are not float32 contiguous CPU tensors (w: ",
                                   DtypeOf(w), ")"));
  }
  AddPlanned(l.PlannedWeight("w", {w}), l.PlannedBatchInvariant(), out);
  return true;
}

bool FusedStepBuilder::Projections(const MultiHeadedAttention& l, const NestedMap& theta,
                                   StepProjArgs* query, StepProjArgs* key, StepProjArgs* value,
                                   StepProjArgs* post, const float** query_scale,
                                   FusedStepKeep* keep) {
  if (!l.fuse_qkv_) {
    return Decline(keep, l, "its query, key and value are not all MultiHeadedProjectionLayers");
  }
  if (!Projection(*l.query_, l.query_.Theta(theta), query, keep) ||
      (key != nullptr && !Projection(*l.key_, l.key_.Theta(theta), key, keep)) ||
      (value != nullptr && !Projection(*l.value_, l.value_.Theta(theta), value, keep)) ||
      !Projection(*l.post_, l.post_.Theta(theta), post, keep)) {
    return false;
  }
  // The reference multiplies q by this vector (PerDimScaleLayer) or by the float 1/sqrt(dim).
  const int64_t dim = l.dim_per_head_;
  const at::Tensor scale =
      l.per_dim_scale_
          ? l.ScaleQuery(theta, at::ones({dim}, at::kFloat)).contiguous()
          : at::full({dim}, 1.0 / std::sqrt(static_cast<double>(dim)), at::kFloat);
  if (FusedStepData(scale) == nullptr) {
    return Decline(keep, l, StrCat("its query scale is ", DtypeOf(scale)));
  }
  *query_scale = scale.data_ptr<float>();
  keep->tensors.push_back(scale);
  return true;
}

bool FusedStepBuilder::Norm(const LayerNorm& l, const NestedMap& theta, StepNormArgs* out) {
  out->scale = FusedStepData(theta.GetTensor("scale"));
  out->bias = FusedStepData(theta.GetTensor("bias"));
  out->scale_offset = l.direct_scale_ ? 0.0f : 1.0f;
  out->epsilon = static_cast<float>(l.epsilon_);
  return out->scale != nullptr && out->bias != nullptr;
}

bool FusedStepBuilder::FeedForward(const TransformerFeedForwardLayer& l, const NestedMap& theta,
                                   StepFeedForwardArgs* out, FusedStepKeep* keep) {
  if (!l.pre_layer_norm_) {
    return Decline(keep, l, "post layer norm (pre_layer_norm False): the fused step normalizes "
                            "before the block");
  }
  if (!l.relu_dropout_->IsIdentity() || !l.residual_dropout_->IsIdentity()) {
    return Decline(keep, l, "a dropout that is not the identity");
  }
  bool relu0 = false, relu1 = false;
  if (!Norm(*l.ln_, l.ln_.Theta(theta), &out->ln)) {
    return Decline(keep, *l.ln_, "its scale and bias are not float32 contiguous CPU tensors");
  }
  if (!Projection(*l.fc0_, l.fc0_.Theta(theta), &out->fc0, &relu0, keep) ||
      !Projection(*l.fc1_, l.fc1_.Theta(theta), &out->fc1, &relu1, keep)) {
    return false;
  }
  if (relu1) return Decline(keep, *l.fc1_, "an activation on the block's output projection");
  out->relu = relu0;
  out->residual_weight = static_cast<float>(l.residual_weight_);
  return true;
}

bool FusedStepBuilder::BlockNorm(const TransformerAttentionLayer& l, const NestedMap& theta,
                                 StepNormArgs* ln, FusedStepKeep* keep) {
  if (!l.pre_layer_norm_) {
    return Decline(keep, l, "post layer norm (pre_layer_norm False): the fused step normalizes "
                            "before the block");
  }
  if (!l.residual_dropout_->IsIdentity()) {
    return Decline(keep, l, "a residual dropout that is not the identity");
  }
  if (!Norm(*l.ln_, l.ln_.Theta(theta), ln)) {
    return Decline(keep, *l.ln_, "its scale and bias are not float32 contiguous CPU tensors");
  }
  return true;
}

bool FusedStepBuilder::SelfWeights(const TransformerAttentionLayer& l, const NestedMap& theta,
                                   StepSelfAttentionArgs* out, FusedStepKeep* keep) {
  if (!l.is_masked_) return Decline(keep, l, "self-attention that is not causal (is_masked False)");
  if (!BlockNorm(l, theta, &out->ln, keep) ||
      !Projections(*l.atten_, l.atten_.Theta(theta), &out->query, &out->key, &out->value,
                   &out->post, &out->query_scale, keep)) {
    return false;
  }
  out->heads = l.atten_->num_heads();
  out->dim = l.atten_->dim_per_head();
  return true;
}

bool FusedStepBuilder::SelfStep(const TransformerAttentionLayer& l, const NestedMap& theta,
                                const NestedMap& states, int64_t rows, StepSelfAttentionArgs* out,
                                MultiHeadedAttention::StepCaches* caches, FusedStepKeep* keep) {
  if (!SelfWeights(l, theta, out, keep)) return false;
  // The caches must already be float32 and contiguous: PrepareStep would otherwise convert them.
  if (!states.contains("unordered") || !states.contains("rows")) {
    return Decline(keep, l, "its decoding states have no row-table caches");
  }
  const NestedMap& kv = states.GetItem("unordered").AsMap();
  if (FusedStepData(kv.GetTensor("key")) == nullptr ||
      FusedStepData(kv.GetTensor("value")) == nullptr || !states.GetTensor("rows").is_contiguous()) {
    return Decline(keep, l, StrCat("its key cache is ", DtypeOf(kv.GetTensor("key")),
                                   " (the fused step reads float32 caches in place)"));
  }
  *caches = l.atten_->PrepareStep(states, rows, at::kFloat);
  out->key_cache = caches->key.data_ptr<float>();
  out->value_cache = caches->value.data_ptr<float>();
  out->slots = caches->key.size(0);
  out->capacity = caches->key.size(1);
  out->rows = caches->rows.data_ptr<int64_t>();
  out->rows_stride = caches->rows.size(1);
  out->step = caches->step;
  return true;
}

bool FusedStepBuilder::CrossWeights(const TransformerAttentionLayer& l, const NestedMap& theta,
                                    StepCrossAttentionArgs* out, FusedStepKeep* keep) {
  // The source's keys and values were projected once (ProjectSource): no key/value here.
  if (!BlockNorm(l, theta, &out->ln, keep) ||
      !Projections(*l.atten_, l.atten_.Theta(theta), &out->query, nullptr, nullptr, &out->post,
                   &out->query_scale, keep)) {
    return false;
  }
  out->heads = l.atten_->num_heads();
  out->dim = l.atten_->dim_per_head();
  return true;
}

bool FusedStepBuilder::CrossStep(const TransformerAttentionLayer& l, const NestedMap& theta,
                                 const NestedMap& aux, int64_t rows, StepCrossAttentionArgs* out,
                                 FusedStepKeep* keep) {
  if (!CrossWeights(l, theta, out, keep)) return false;
  const at::Tensor& k = aux.GetTensor("key");  // [sources, S, heads, dim]: row i reads i % sources
  const at::Tensor& v = aux.GetTensor("value");
  if (k.dim() != 4 || k.sizes() != v.sizes() || k.size(0) == 0 || rows % k.size(0) != 0 ||
      k.size(2) != out->heads || k.size(3) != out->dim) {
    return Decline(keep, l, StrCat("source keys ", k.sizes(), " and values ", v.sizes(),
                                   " are not [sources, S, ", out->heads, ", ", out->dim, "] for ",
                                   rows, " rows"));
  }
  out->key = FusedStepData(k);
  out->value = FusedStepData(v);
  out->sources = k.size(0);
  out->source_length = k.size(1);
  if (out->key == nullptr || out->value == nullptr) {
    return Decline(keep, l, StrCat("its source keys are ", DtypeOf(k)));
  }
  return true;
}

namespace {

// A plan's note's topic for a reason "layer '<path>': <why>": one line per reason, whichever layers
// give it (the same reason in every layer is the layers' configuration).
std::string FusedStepTopic(const std::string& declined) {
  const size_t reason = declined.find("': ");
  return StrCat("fused decoder step declined: ",
                reason == std::string::npos ? declined : declined.substr(reason + 3));
}

// [rows, n] paddings (1: masked) as the step's additive bias (the lowest float where masked).
std::vector<float> PaddingBias(const at::Tensor& paddings) {
  const at::Tensor p = paddings.to(at::kFloat).contiguous();
  const float* pp = p.data_ptr<float>();
  std::vector<float> bias(static_cast<size_t>(p.numel()));
  for (size_t i = 0; i < bias.size(); ++i) {
    bias[i] = pp[i] > 0.5f ? std::numeric_limits<float>::lowest() : 0.0f;
  }
  return bias;
}

}  // namespace

bool FusedStepBuilder::ExtendStep(const TransformerLayer& l, const NestedMap& theta,
                                  const at::Tensor& inputs, const NestedMap& states,
                                  const NestedMap& aux, const at::Tensor& aux_paddings,
                                  const at::Tensor& paddings, at::Tensor* out,
                                  NestedMap* new_states, FusedStepKeep& keep) {
  if (!Mode(l, l.compute_plan(), &keep) || !Layer(l, &keep)) return false;
  if (inputs.dim() != 2 || FusedStepData(inputs) == nullptr) {
    return Decline(&keep, l, StrCat("the step's inputs are ", inputs.sizes(), " ", DtypeOf(inputs),
                                    ", not [rows, D] float32 contiguous"));
  }
  const auto& ff = dynamic_cast<const TransformerFeedForwardLayer&>(*l.fflayer_);
  DecoderLayerStepArgs a;
  a.rows = inputs.size(0);
  a.model_dim = inputs.size(1);
  if (!FeedForward(ff, l.fflayer_.Theta(theta), &a.ff, &keep)) return false;
  std::vector<float> bias;
  if (l.cross_atten_) {
    if (!CrossStep(*l.cross_atten_, l.cross_atten_.Theta(theta), aux, a.rows, &a.cross, &keep)) {
      return false;
    }
    if (aux_paddings.defined()) {
      const int64_t s = a.cross.source_length;
      if (aux_paddings.dim() != 2 || aux_paddings.size(0) != a.cross.sources ||
          aux_paddings.size(1) != s) {
        return Decline(&keep, l, StrCat("source paddings ", aux_paddings.sizes(), " are not [",
                                        a.cross.sources, ", ", s, "]"));
      }
      bias = PaddingBias(aux_paddings);
      a.cross.bias = bias.data();
    }
    a.has_cross = true;
  }
  MultiHeadedAttention::StepCaches caches;
  if (!SelfStep(*l.self_atten_, l.self_atten_.Theta(theta), states, a.rows, &a.self, &caches,
                &keep)) {
    return false;
  }
  std::vector<float> self_bias;
  if (paddings.defined()) {  // [rows, step + 1]: 1 masks a cached step
    const int64_t n = a.self.step + 1;
    if (paddings.dim() != 2 || paddings.size(0) != a.rows || paddings.size(1) != n) {
      throw InvalidArgumentError(StrCat("layer '", l.path(), "': ExtendStep paddings must be [",
                                        a.rows, ", ", n, "], got ", paddings.sizes()));
    }
    self_bias = PaddingBias(paddings);
    a.self.bias = self_bias.data();
  }
  *out = inputs.clone();
  DecoderLayerStep(a, out->data_ptr<float>());
  *new_states = MultiHeadedAttention::StatesAfterStep(caches);
  return true;
}

bool FusedStepBuilder::Mode(const TransformerLayer& l, const ComputePlan* plan,
                            FusedStepKeep* keep) {
  const std::string why = FusedDecoderStepDeclined(plan);
  return why.empty() || Decline(keep, l, why);
}

bool FusedStepBuilder::Layer(const TransformerLayer& l, FusedStepKeep* keep) {
  if (dynamic_cast<const TransformerFeedForwardLayer*>(l.fflayer_.get()) == nullptr) {
    return Decline(keep, *l.fflayer_, "a feed-forward block other than TransformerFeedForwardLayer");
  }
  if (l.fprop_dtype() != at::kFloat) {
    return Decline(keep, l, StrCat("it computes in ", c10::toString(l.fprop_dtype()),
                                   " (the fused step computes in float32)"));
  }
  return true;
}

std::string FusedStepBuilder::Declined(const TransformerLayer& l, const NestedMap& theta,
                                       const ComputePlan* plan) {
  FusedStepKeep keep;
  DecoderLayerStepArgs a;
  // The configuration's reasons first (they hold for every run), then the mode's.
  if (Layer(l, &keep) &&
      FeedForward(dynamic_cast<const TransformerFeedForwardLayer&>(*l.fflayer_),
                  l.fflayer_.Theta(theta), &a.ff, &keep) &&
      (!l.cross_atten_ ||
       CrossWeights(*l.cross_atten_, l.cross_atten_.Theta(theta), &a.cross, &keep)) &&
      SelfWeights(*l.self_atten_, l.self_atten_.Theta(theta), &a.self, &keep) &&
      Mode(l, plan, &keep)) {
    return "";
  }
  return keep.declined;
}

bool TransformerLayer::FusedExtendStep(const NestedMap& theta, const at::Tensor& inputs,
                                       const NestedMap& states, const NestedMap& aux,
                                       const at::Tensor& aux_paddings,
                                       const at::Tensor& paddings, at::Tensor* out,
                                       NestedMap* new_states) const {
  FusedStepKeep keep;  // what the arguments point into, for the step
  if (FusedStepBuilder::ExtendStep(*this, theta, inputs, states, aux, aux_paddings, paddings, out,
                                   new_states, keep)) {
    return true;
  }
  // A plan made for the fused step said at load what its weights and configuration decline; what
  // only a step meets (its states' or inputs' dtype and shape) the first step meeting it says.
  const ComputePlan* plan = compute_plan();
  if (plan != nullptr && plan->policy().fused_decoder_step && FusedDecoderStepApplies(plan) &&
      !keep.declined.empty()) {
    plan->NoteAtStep(FusedStepTopic(keep.declined),
                     StrCat("fused decoder step declined at a step: ", keep.declined));
  }
  return false;
}

std::string TransformerLayer::FusedStepDeclined(const NestedMap& theta,
                                                const ComputePlan* plan) const {
  return FusedStepBuilder::Declined(*this, theta, plan);
}

void TransformerLayer::PrepareWeights(const NestedMap& theta, ComputePlan& plan) const {
  // Only a causal layer steps (an encoder's never does), and only a plan for the fused step asks.
  if (!self_atten_->is_masked() || !plan.policy().fused_decoder_step) return;
  at::NoGradGuard no_grad;  // as the plan's steps run
  const std::string why = FusedStepDeclined(theta, &plan);
  if (why.empty()) return;
  plan.AddNote(FusedStepTopic(why), StrCat("fused decoder step declined: ", why));
}

}  // namespace glossa
