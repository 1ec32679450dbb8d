#include "glossa/layers/transformer.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/block.h"
#include "glossa/layers/dropout.h"
#include "glossa/layers/flops.h"
#include "glossa/kernels/residual_add.h"

namespace glossa {
namespace {

// The template `p.<key>` as a mutable copy with input_dim set.
glossa::Params BlockParams(const glossa::Params& p, const char* key, int64_t input_dim) {
  const ParamValue& v = p.Get(key);
  if (!v.is_params()) {
    throw InvalidArgumentError(
        StrCat("layer '", p.GetString("name"), "': ", key, " must be layer Params, got ",
               v.KindName()));
  }
  glossa::Params out = v.AsParams().Copy();
  if (!out.Contains("input_dim")) {
    throw InvalidArgumentError(StrCat("layer '", p.GetString("name"), "': ", key, " (",
                                      out.ClsKey(), ") has no input_dim field"));
  }
  out.Set("input_dim", input_dim);
  return out;
}

}  // namespace

// ---- TransformerFeedForwardLayer ----

glossa::Params TransformerFeedForwardLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerFeedForwardLayer>());
  p.Define("input_dim", 0, "Dimension of the layer input.");
  p.Define("hidden_dim", 0, "Dimension of the hidden layer.");
  p.Define("activation", "RELU", "Non-linearity of the hidden layer.");
  p.Define("residual_dropout_prob", 0.0, "Dropout probability on the residual branch.");
  p.Define("relu_dropout_prob", 0.0, "Dropout probability after the hidden activation.");
  p.Define("pre_layer_norm", true, "Layer norm before the block (else after the residual sum).");
  p.Define("residual_weight", 1.0, "Weight of the residual branch.");
  p.Define("ln_tpl", LayerNorm::Params(), "Layer norm params (input_dim is set by this layer).");
  p.Define("fc_tpl", FCLayer::Params(),
           "Params of the two projections fc0 and fc1 (input_dim, output_dim and activation are "
           "set by this layer).");
  p.Define("dropout_tpl", DeterministicDropoutLayer::Params(),
           "Params of the relu and residual dropouts (keep_prob is set from the *_prob fields).");
  p.Define("weight_split_dims_mapping_list", nullptr,
           "Tensor parallelism (Lingvo's FeedForwardNet): the weight_split_dims_mapping of fc0 "
           "and of fc1, e.g. [[None, \"model\"], [\"model\", None]]: the hidden units split "
           "over the 'model' axis (fc0 column-, fc1 row-parallel: one all-reduce per layer). "
           "None: replicated.");
  return p;
}

// fc0's and fc1's weight_split_dims_mapping from the FFN's list (None: neither split), checked to
// split the hidden units over one axis (fc0's columns and fc1's rows) or nothing; the axis name.
static std::pair<ParamValue, ParamValue> HiddenSplit(const glossa::Params& p, const std::string& layer,
                                              std::string* axis) {
  const ParamValue& list = p.Get("weight_split_dims_mapping_list");
  if (list.is_none()) return {ParamValue(), ParamValue()};
  const std::string what = StrCat("layer '", layer, "': weight_split_dims_mapping_list");
  if (!list.is_list() || list.AsList().size() != 2) {
    throw InvalidArgumentError(StrCat(what, " must list 2 mappings (fc0's and fc1's)"));
  }
  const WeightSplit a = ParseWeightSplit(list.AsList()[0], 2, what + "[0]");
  const WeightSplit b = ParseWeightSplit(list.AsList()[1], 2, what + "[1]");
  if ((a.dim >= 0 || b.dim >= 0) && (a.dim != 1 || b.dim != 0 || a.axis != b.axis)) {
    throw InvalidArgumentError(StrCat(what, ": fc0 must split its output columns and fc1 its "
                                      "input rows over the same axis ([[None, A], [A, None]]), "
                                      "or neither split"));
  }
  *axis = a.axis;
  return {list.AsList()[0], list.AsList()[1]};
}

TransformerFeedForwardLayer::TransformerFeedForwardLayer(const glossa::Params& p) : BaseLayer(p) {
  const int64_t d = p.GetInt("input_dim"), h = p.GetInt("hidden_dim");
  if (d <= 0 || h <= 0) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': input_dim and hidden_dim must be > 0, got ",
                                      d, " and ", h));
  }
  pre_layer_norm_ = p.GetBool("pre_layer_norm");
  residual_weight_ = p.GetFloat("residual_weight");
  ln_ = CreateChild<LayerNorm>("ln", p.GetParams("ln_tpl").Copy().Set("input_dim", d));
  std::string axis;
  const auto [split0, split1] = HiddenSplit(p, path(), &axis);
  glossa::Params fc = p.GetParams("fc_tpl").Copy();
  fc.Set("input_dim", d).Set("output_dim", h).Set("activation", p.GetString("activation"));
  fc0_ = CreateChild<FCLayer>("fc0", fc.Set("weight_split_dims_mapping", split0));
  fc.Set("input_dim", h).Set("output_dim", d).Set("activation", "NONE");
  fc1_ = CreateChild<FCLayer>("fc1", fc.Set("weight_split_dims_mapping", split1));
  glossa::Params relu = DropoutParams(p, "relu_dropout_prob");
  // The hidden units' mask: this rank's block of the whole layer's.
  if (!axis.empty()) relu.Set("activation_split_dims_mapping", WeightSplitMapping(1, 0, axis));
  relu_dropout_ = CreateChild<DropoutLayer>("relu_dropout", relu);
  residual_dropout_ =
      CreateChild<DropoutLayer>("residual_dropout", DropoutParams(p, "residual_dropout_prob"));
}

at::Tensor TransformerFeedForwardLayer::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                              const at::Tensor& paddings) const {
  at::Tensor x = CastToFPropDtype(inputs);
  at::Tensor h = pre_layer_norm_ ? ln_->FProp(ln_.Theta(theta), x) : x;
  h = fc0_->FProp(fc0_.Theta(theta), h, paddings);
  h = relu_dropout_->FProp(relu_dropout_.Theta(theta), h);
  h = fc1_->FProp(fc1_.Theta(theta), h, paddings);
  h = residual_dropout_->FProp(residual_dropout_.Theta(theta), h);
  // alpha: no mul when 1; then the sum on the kernel threads (kernels/residual_add.h).
  at::Tensor out = residual_weight_ == 1.0 ? ResidualAdd(x, h) : at::add(x, h, residual_weight_);
  return pre_layer_norm_ ? out : ln_->FProp(ln_.Theta(theta), out);
}

// ---- TransformerAttentionLayer ----

glossa::Params TransformerAttentionLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerAttentionLayer>());
  p.Define("input_dim", 0, "Dimension of the transformer block input.");
  p.Define("num_heads", 1, "Number of attention heads.");
  p.Define("hidden_dim", 0, "Dimension of the attention hidden layer; 0 means input_dim.");
  p.Define("is_masked", false, "If True, causal self-attention (query t sees keys <= t).");
  p.Define("atten_dropout_prob", 0.0, "Dropout probability on the attention weights.");
  p.Define("residual_dropout_prob", 0.0, "Dropout probability on the residual branch.");
  p.Define("pre_layer_norm", true, "Layer norm before attention (else after the residual sum).");
  p.Define("atten_tpl", MultiHeadedAttention::Params(),
           "Multi-headed attention params (input_dim, hidden_dim, num_heads and "
           "atten_dropout_prob are set by this layer).");
  p.Define("ln_tpl", LayerNorm::Params(), "Layer norm params (input_dim is set by this layer).");
  p.Define("dropout_tpl", DeterministicDropoutLayer::Params(),
           "Params of the residual dropout (keep_prob is set from residual_dropout_prob).");
  return p;
}

TransformerAttentionLayer::TransformerAttentionLayer(const glossa::Params& p) : BaseLayer(p) {
  pre_layer_norm_ = p.GetBool("pre_layer_norm");
  is_masked_ = p.GetBool("is_masked");
  const int64_t d = p.GetInt("input_dim");
  ln_ = CreateChild<LayerNorm>("ln", p.GetParams("ln_tpl").Copy().Set("input_dim", d));
  auto atten = p.GetParams("atten_tpl").Copy();
  atten.Set("input_dim", d).Set("hidden_dim", p.GetInt("hidden_dim"));
  atten.Set("num_heads", p.GetInt("num_heads"));
  atten.Set("atten_dropout_prob", p.GetFloat("atten_dropout_prob"));
  atten_ = CreateChild<MultiHeadedAttention>("atten", atten);
  residual_dropout_ =
      CreateChild<DropoutLayer>("residual_dropout", DropoutParams(p, "residual_dropout_prob"));
}

at::Tensor TransformerAttentionLayer::Norm(const NestedMap& theta, const at::Tensor& x) const {
  return ln_->FProp(ln_.Theta(theta), x);
}

at::Tensor TransformerAttentionLayer::Residual(const NestedMap& theta, const at::Tensor& x,
                                               const at::Tensor& y) const {
  at::Tensor out = ResidualAdd(x, residual_dropout_->FProp(residual_dropout_.Theta(theta), y));
  return pre_layer_norm_ ? out : Norm(theta, out);
}

std::pair<at::Tensor, at::Tensor> TransformerAttentionLayer::FProp(
    const NestedMap& theta, const at::Tensor& query, const at::Tensor& source,
    const at::Tensor& paddings, const at::Tensor& segment_ids,
    const at::Tensor& source_segment_ids) const {
  at::Tensor x = CastToFPropDtype(query);
  at::Tensor q = pre_layer_norm_ ? Norm(theta, x) : x;
  // Cross-attention attends to the source as given; self-attention to the normalized query.
  at::Tensor kv = source.defined() ? CastToFPropDtype(source) : q;
  auto [encoded, probs] =
      atten_->FProp(atten_.Theta(theta), q, kv, kv, paddings, is_masked_ && !source.defined(),
                    segment_ids, source_segment_ids);
  return {Residual(theta, x, encoded), probs};
}

NestedMap TransformerAttentionLayer::ProjectSource(const NestedMap& theta,
                                                  const at::Tensor& source) const {
  return atten_->ProjectSource(atten_.Theta(theta), CastToFPropDtype(source));
}

std::pair<at::Tensor, at::Tensor> TransformerAttentionLayer::FPropProjected(
    const NestedMap& theta, const at::Tensor& query, const NestedMap& source,
    const at::Tensor& paddings) const {
  at::Tensor x = CastToFPropDtype(query);
  at::Tensor q = pre_layer_norm_ ? Norm(theta, x) : x;
  auto [encoded, probs] = atten_->FPropProjected(atten_.Theta(theta), q, source, paddings);
  return {Residual(theta, x, encoded), probs};
}

NestedMap TransformerAttentionLayer::InitStates(int64_t batch_size, at::ScalarType dtype) const {
  return atten_->InitStates(batch_size, dtype);
}

std::pair<at::Tensor, NestedMap> TransformerAttentionLayer::ExtendStep(
    const NestedMap& theta, const at::Tensor& query, const NestedMap& states,
    const at::Tensor& paddings) const {
  if (!is_masked_) {
    throw FailedPreconditionError(
        StrCat("layer '", path(), "': ExtendStep needs causal self-attention (is_masked)"));
  }
  at::Tensor x = CastToFPropDtype(query);
  at::Tensor q = pre_layer_norm_ ? Norm(theta, x) : x;
  auto [encoded, new_states] = atten_->ExtendStep(atten_.Theta(theta), q, states, paddings);
  return {Residual(theta, x, encoded), new_states};
}

// ---- TransformerLayer ----

glossa::Params TransformerLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerLayer>());
  p.Define("input_dim", 0, "Dimension of the transformer block input (set into every block).");
  p.Define("num_heads", 0,
           "Number of attention heads set into the attention templates; 0 keeps theirs.");
  p.Define("mask_self_atten", false, "If True, use causal self-attention (decoder).");
  p.Define("has_aux_atten", false, "If True, add cross-attention to aux_vecs (decoder).");
  p.Define("tr_atten_tpl", TransformerAttentionLayer::Params(),
           "Attention block params (TransformerAttentionLayer), for self- and cross-attention.");
  p.Define("tr_self_atten_tpl", nullptr,
           "Self-attention block params; None: tr_atten_tpl.");
  p.Define("tr_aux_atten_tpl", nullptr,
           "Cross-attention block params (with has_aux_atten); None: tr_atten_tpl.");
  p.Define("tr_fflayer_tpl", TransformerFeedForwardLayer::Params(),
           "Feed-forward block params: TransformerFeedForwardLayer (dense), "
           "TransformerShardedMoeLayer (Mixture-of-Experts) or any Block with an input_dim.");
  p.Define("ln_tpl", nullptr,
           "Layer norm params for every block (LayerNorm); None: each block's own ln_tpl.");
  return p;
}

glossa::Params& TransformerLayer::SetTensorParallel(glossa::Params& p, const std::string& axis) {
  p.Set("tr_atten_tpl.atten_tpl.weight_split_dims_mapping", WeightSplitMapping(3, 1, axis));
  p.Set("tr_fflayer_tpl.weight_split_dims_mapping_list",
        ParamValue::List{WeightSplitMapping(2, 1, axis), WeightSplitMapping(2, 0, axis)});
  return p;
}

glossa::Params& TransformerLayer::SetCanonicalShapeParams(glossa::Params& p, int64_t input_dim,
                                                          int64_t hidden_dim,
                                                          int64_t num_heads) {
  p.Set("input_dim", input_dim);
  p.Set("tr_atten_tpl.num_heads", num_heads);
  p.Set("tr_fflayer_tpl.hidden_dim", hidden_dim);
  return p;
}

TransformerLayer::TransformerLayer(const glossa::Params& p) : BaseLayer(p) {
  const int64_t d = p.GetInt("input_dim");
  if (d <= 0) throw InvalidArgumentError(StrCat("layer '", path(), "': input_dim must be > 0"));
  const ParamValue& ln = p.Get("ln_tpl");
  auto atten_params = [&](const char* key, bool masked) {
    glossa::Params a = BlockParams(p, key, d);
    for (const char* field : {"is_masked", "num_heads"}) {
      if (!a.Contains(field)) {
        throw InvalidArgumentError(StrCat("layer '", path(), "': ", key, " (", a.ClsKey(),
                                          ") has no ", field,
                                          " field; use TransformerAttentionLayer Params"));
      }
    }
    if (p.GetInt("num_heads") > 0) a.Set("num_heads", p.GetInt("num_heads"));
    a.Set("is_masked", masked);
    if (!ln.is_none()) a.Set("ln_tpl", ln);
    return a;
  };
  const bool own_self = !p.Get("tr_self_atten_tpl").is_none();
  self_atten_ = CreateChild<TransformerAttentionLayer>(
      "self_atten",
      atten_params(own_self ? "tr_self_atten_tpl" : "tr_atten_tpl", p.GetBool("mask_self_atten")));
  if (p.GetBool("has_aux_atten")) {
    const bool own_aux = !p.Get("tr_aux_atten_tpl").is_none();
    cross_atten_ = CreateChild<TransformerAttentionLayer>(
        "cross_atten", atten_params(own_aux ? "tr_aux_atten_tpl" : "tr_atten_tpl", false));
  }
  glossa::Params ff = BlockParams(p, "tr_fflayer_tpl", d);
  if (!ln.is_none() && ff.Contains("ln_tpl")) ff.Set("ln_tpl", ln);
  fflayer_ = CreateChild<BaseLayer>("fflayer", ff);
  ff_block_ = &AsBlock(*fflayer_, StrCat("TransformerLayer '", path(), "' (tr_fflayer_tpl)"));
}

std::pair<at::Tensor, at::Tensor> TransformerLayer::FProp(const NestedMap& theta,
                                                          const at::Tensor& inputs,
                                                          const at::Tensor& paddings,
                                                          const at::Tensor& aux_vecs,
                                                          const at::Tensor& aux_paddings,
                                                          const at::Tensor& segment_ids,
                                                          const at::Tensor& aux_segment_ids) const {
  auto [x, probs] =
      self_atten_->FProp(self_atten_.Theta(theta), inputs, {}, paddings, segment_ids);
  if (cross_atten_) {
    if (!aux_vecs.defined()) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': has_aux_atten needs aux_vecs"));
    }
    if (segment_ids.defined() != aux_segment_ids.defined()) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': packed cross-attention needs both ",
                                        "segment_ids and aux_segment_ids"));
    }
    x = cross_atten_
            ->FProp(cross_atten_.Theta(theta), x, aux_vecs, aux_paddings, segment_ids,
                    aux_segment_ids)
            .first;
  }
  x = ff_block_->FPropBlock(fflayer_.Theta(theta), x, paddings);
  return {x, probs};
}

std::pair<at::Tensor, NestedMap> TransformerAttentionLayer::ExtendStep(
    const NestedMap& theta, const at::Tensor& query, const NestedMap& states,
    const NestedMap& context) const {
  return ExtendStep(theta, query, states, OptionalInput(context, "paddings"));
}

NestedMap TransformerLayer::PrecomputeContext(const NestedMap& theta, const at::Tensor& source,
                                              const at::Tensor& source_paddings) const {
  NestedMap context = StepLayer::PrecomputeContext(theta, source, source_paddings);
  if (source.defined()) context.Put("aux", PrecomputeAux(theta, source));
  return context;
}

std::pair<at::Tensor, NestedMap> TransformerLayer::ExtendStep(const NestedMap& theta,
                                                              const at::Tensor& inputs,
                                                              const NestedMap& states,
                                                              const NestedMap& context) const {
  if (cross_atten_ && !context.contains("aux")) {
    throw InvalidArgumentError(StrCat("layer '", path(),
                                      "': has_aux_atten needs a context with aux "
                                      "(PrecomputeContext of the source)"));
  }
  return ExtendStepProjected(theta, inputs, states,
                             context.contains("aux") ? context.at("aux").AsMap() : NestedMap(),
                             OptionalInput(context, "aux_paddings"),
                             OptionalInput(context, "paddings"));
}

NestedMap TransformerLayer::InitStates(int64_t batch_size, at::ScalarType dtype) const {
  return self_atten_->InitStates(batch_size, dtype);
}

std::pair<at::Tensor, NestedMap> TransformerLayer::ExtendStep(
    const NestedMap& theta, const at::Tensor& inputs, const NestedMap& states,
    const at::Tensor& aux_vecs, const at::Tensor& aux_paddings) const {
  if (cross_atten_ && !aux_vecs.defined()) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': has_aux_atten needs aux_vecs"));
  }
  return ExtendStepProjected(theta, inputs, states, PrecomputeAux(theta, aux_vecs), aux_paddings);
}

NestedMap TransformerLayer::PrecomputeAux(const NestedMap& theta,
                                          const at::Tensor& aux_vecs) const {
  if (!cross_atten_) return NestedMap();
  return cross_atten_->ProjectSource(cross_atten_.Theta(theta), aux_vecs);
}

std::pair<at::Tensor, NestedMap> TransformerLayer::ExtendStepProjected(
    const NestedMap& theta, const at::Tensor& inputs, const NestedMap& states,
    const NestedMap& aux, const at::Tensor& aux_paddings, const at::Tensor& paddings) const {
  at::Tensor fused;
  NestedMap fused_states;
  if (FusedExtendStep(theta, inputs, states, aux, aux_paddings, paddings, &fused, &fused_states)) {
    return {fused, fused_states};
  }
  auto [x, new_states] = self_atten_->ExtendStep(self_atten_.Theta(theta), inputs, states, paddings);
  if (cross_atten_) {
    // One copy of each source's keys and values (B of them) for the N = K·B rows, row j·B + q
    // reading source q: the K beams of a source are its K query rows ([B, K, D]).
    const int64_t n = x.size(0), d = x.size(1), b = aux.GetTensor("key").size(0);
    if (b == 0 || n % b != 0) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': ", n, " decoding rows do not read ",
                                        b, " sources (rows must be a multiple)"));
    }
    const at::Tensor q = x.view({n / b, b, d}).transpose(0, 1).contiguous();
    x = cross_atten_->FPropProjected(cross_atten_.Theta(theta), q, aux, aux_paddings)
            .first.transpose(0, 1)
            .reshape({n, d});
  }
  x = ff_block_->StepBlock(fflayer_.Theta(theta), x.unsqueeze(1));
  return {x.squeeze(1), new_states};
}

GLOSSA_REGISTER_CLASS(TransformerFeedForwardLayer, "glossa.layers.TransformerFeedForwardLayer");
GLOSSA_REGISTER_CLASS(TransformerAttentionLayer, "glossa.layers.TransformerAttentionLayer");
GLOSSA_REGISTER_CLASS(TransformerLayer, "glossa.layers.TransformerLayer");

// Declared FLOPs per token (flops.h): 2 per weight a token meets.
[[maybe_unused]] static const bool kDeclaredFlops =
    RegisterDeclaredFlops("glossa.layers.TransformerFeedForwardLayer",
                          [](const glossa::Params& p) -> std::optional<double> {
                            return 4.0 * p.GetInt("input_dim") * p.GetInt("hidden_dim");
                          }) &&
    RegisterDeclaredFlops("glossa.layers.TransformerAttentionLayer",
                          [](const glossa::Params& p) -> std::optional<double> {
                            const double d = p.GetInt("input_dim"), h = p.GetInt("hidden_dim");
                            return 8.0 * d * (h > 0 ? h : d);  // q, k, v, output projections
                          }) &&
    RegisterDeclaredFlops("glossa.layers.TransformerLayer",
                          [](const glossa::Params& p) -> std::optional<double> {
                            const int64_t d = p.GetInt("input_dim");
                            const char* self = p.Get("tr_self_atten_tpl").is_params()
                                                   ? "tr_self_atten_tpl" : "tr_atten_tpl";
                            const auto a = DeclaredFlopsPerToken(BlockParams(p, self, d));
                            const auto f = DeclaredFlopsPerToken(BlockParams(p, "tr_fflayer_tpl", d));
                            if (!a || !f) return std::nullopt;
                            return *a * (p.GetBool("has_aux_atten") ? 2 : 1) + *f;
                          });

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature TransformerAttentionLayer::FPropMapSpec() const {
  return {{"query", "source", "paddings", "segment_ids", "source_segment_ids"},
          1, {"outputs", "probs"}, true, "(outputs, probs)"};
}

NestedMap TransformerAttentionLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  auto [y, p] = FProp(theta, inputs.GetTensor("query"), OptionalInput(inputs, "source"),
                      OptionalInput(inputs, "paddings"), OptionalInput(inputs, "segment_ids"),
                      OptionalInput(inputs, "source_segment_ids"));
  NestedMap out;
  out.Put("outputs", y);
  out.Put("probs", p);
  return out;
}

BaseLayer::FPropMapSignature TransformerLayer::FPropMapSpec() const {
  return {{"inputs", "paddings", "aux_vecs", "aux_paddings", "segment_ids", "aux_segment_ids"},
          1, {"outputs", "atten_probs"}, true, "(outputs, atten_probs)"};
}

NestedMap TransformerLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  auto [y, p] = FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "paddings"),
                      OptionalInput(inputs, "aux_vecs"), OptionalInput(inputs, "aux_paddings"),
                      OptionalInput(inputs, "segment_ids"), OptionalInput(inputs, "aux_segment_ids"));
  NestedMap out;
  out.Put("outputs", y);
  out.Put("atten_probs", p);
  return out;
}

}  // namespace glossa
