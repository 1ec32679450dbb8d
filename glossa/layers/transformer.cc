#include "glossa/layers/transformer.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/block.h"

namespace glossa {
namespace {

// The dropout template `p.dropout_tpl` with keep_prob = 1 - p.<prob_key>.
glossa::Params DropoutParams(const glossa::Params& p, const char* prob_key) {
  glossa::Params out = p.GetParams("dropout_tpl").Copy();
  out.Set("keep_prob", 1.0 - p.GetFloat(prob_key));
  return out;
}

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
  return p;
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
  glossa::Params fc = p.GetParams("fc_tpl").Copy();
  fc.Set("input_dim", d).Set("output_dim", h).Set("activation", p.GetString("activation"));
  fc0_ = CreateChild<FCLayer>("fc0", fc);
  fc.Set("input_dim", h).Set("output_dim", d).Set("activation", "NONE");
  fc1_ = CreateChild<FCLayer>("fc1", fc);
  relu_dropout_ = CreateChild<DropoutLayer>("relu_dropout", DropoutParams(p, "relu_dropout_prob"));
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
  at::Tensor out = at::add(x, h, residual_weight_);  // alpha: no mul when 1
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
  at::Tensor out = x + residual_dropout_->FProp(residual_dropout_.Theta(theta), y);
  return pre_layer_norm_ ? out : Norm(theta, out);
}

std::pair<at::Tensor, at::Tensor> TransformerAttentionLayer::FProp(
    const NestedMap& theta, const at::Tensor& query, const at::Tensor& source,
    const at::Tensor& paddings) const {
  at::Tensor x = CastToFPropDtype(query);
  at::Tensor q = pre_layer_norm_ ? Norm(theta, x) : x;
  // Cross-attention attends to the source as given; self-attention to the normalized query.
  at::Tensor kv = source.defined() ? CastToFPropDtype(source) : q;
  auto [encoded, probs] =
      atten_->FProp(atten_.Theta(theta), q, kv, kv, paddings, is_masked_ && !source.defined());
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
    const NestedMap& theta, const at::Tensor& query, const NestedMap& states) const {
  if (!is_masked_) {
    throw FailedPreconditionError(
        StrCat("layer '", path(), "': ExtendStep needs causal self-attention (is_masked)"));
  }
  at::Tensor x = CastToFPropDtype(query);
  at::Tensor q = pre_layer_norm_ ? Norm(theta, x) : x;
  auto [encoded, new_states] = atten_->ExtendStep(atten_.Theta(theta), q, states);
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
                                                          const at::Tensor& aux_paddings) const {
  auto [x, probs] = self_atten_->FProp(self_atten_.Theta(theta), inputs, {}, paddings);
  if (cross_atten_) {
    if (!aux_vecs.defined()) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': has_aux_atten needs aux_vecs"));
    }
    x = cross_atten_->FProp(cross_atten_.Theta(theta), x, aux_vecs, aux_paddings).first;
  }
  x = ff_block_->FPropBlock(fflayer_.Theta(theta), x, paddings);
  return {x, probs};
}

std::pair<at::Tensor, NestedMap> TransformerAttentionLayer::ExtendStep(
    const NestedMap& theta, const at::Tensor& query, const NestedMap& states,
    const NestedMap& /*context*/) const {
  return ExtendStep(theta, query, states);
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
                             OptionalInput(context, "aux_paddings"));
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
    const NestedMap& aux, const at::Tensor& aux_paddings) const {
  const StepLayer& self_atten = *self_atten_;
  auto [x, new_states] = self_atten.ExtendStep(self_atten_.Theta(theta), inputs, states, {});
  if (cross_atten_) {
    x = cross_atten_->FPropProjected(cross_atten_.Theta(theta), x.unsqueeze(1), aux, aux_paddings)
            .first.squeeze(1);
  }
  x = ff_block_->StepBlock(fflayer_.Theta(theta), x.unsqueeze(1));
  return {x.squeeze(1), new_states};
}

// ---- TransformerStack ----

glossa::Params TransformerStack::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerStack>());
  DefineLayerFields(p);
  p.Define("input_dropout_prob", 0.0, "Dropout probability on the stack's input.");
  p.Define("final_layer_norm", nullptr,
           "A layer norm after the last layer. None: when the first layer's self-attention is "
           "pre-layer-norm (Lingvo's default is False; post-norm layers end normalized already).");
  p.Define("ln_tpl", LayerNorm::Params(), "The final layer norm's params.");
  p.Define("dropout_tpl", DeterministicDropoutLayer::Params(),
           "Params of the input dropout (keep_prob is set from input_dropout_prob).");
  return p;
}

void TransformerStack::DefineLayerFields(glossa::Params& p) {
  p.Define("num_layers", 1, "Number of transformer layers.");
  p.Define("mdl_dim", 0, "Model dimension set into every layer's input_dim; 0 keeps theirs.");
  p.Define("hidden_dim", 0,
           "Feed-forward hidden dimension set into every layer's tr_fflayer_tpl; 0 keeps theirs.");
  p.Define("num_atten_heads", 0,
           "Attention heads set into every layer's attention templates; 0 keeps theirs.");
  p.Define("dropout_prob", nullptr,
           "When set, the attention, residual and relu dropout probability of every block.");
  p.Define("mask_self_atten", false, "Causal self-attention in every layer (decoder).");
  p.Define("has_aux_atten", false, "Cross-attention to the encoder output (decoder).");
  p.Define("transformer_layer_params_tpl", TransformerLayer::Params(),
           "TransformerLayer params: one template for every layer, or a list whose length "
           "divides num_layers (layer i uses entry i / (num_layers / len)): with [dense, moe] and 4 "
           "layers, layers 0-1 are dense and 2-3 MoE, as in Lingvo.");
}

std::vector<glossa::Params> TransformerStack::LayerParams(const glossa::Params& p) {
  const std::string where = StrCat("layer '", p.GetString("name"), "' (", p.ClsKey(), ")");
  const int64_t n = p.GetInt("num_layers");
  if (n <= 0) throw InvalidArgumentError(StrCat(where, ": num_layers must be > 0, got ", n));
  const ParamValue& tpl = p.Get("transformer_layer_params_tpl");
  std::vector<glossa::Params> templates;
  if (tpl.is_list()) {
    for (const auto& t : tpl.AsList()) {
      if (!t.is_params()) {
        throw InvalidArgumentError(
            StrCat(where, ": transformer_layer_params_tpl must hold Params, found a ", t.KindName()));
      }
      templates.push_back(t.AsParams());
    }
    if (templates.empty() || n % static_cast<int64_t>(templates.size()) != 0) {
      throw InvalidArgumentError(StrCat(where, ": transformer_layer_params_tpl has ",
                                        templates.size(), " templates, which must divide num_layers ",
                                        n));
    }
  } else if (tpl.is_params()) {
    templates.push_back(tpl.AsParams());
  } else {
    throw InvalidArgumentError(StrCat(where, ": transformer_layer_params_tpl must be Params or a "
                                             "list of Params, got ",
                                      tpl.KindName()));
  }
  const int64_t factor = n / static_cast<int64_t>(templates.size());
  const ParamValue& dropout = p.Get("dropout_prob");
  std::vector<glossa::Params> layers;
  for (int64_t i = 0; i < n; ++i) {
    const size_t t = static_cast<size_t>(i / factor);
    glossa::Params l = templates[t].Copy();
    const std::string which =
        tpl.is_list() ? StrCat("transformer_layer_params_tpl[", t, "]")
                      : std::string("transformer_layer_params_tpl");
    for (const char* field : {"mask_self_atten", "has_aux_atten", "tr_fflayer_tpl"}) {
      if (!l.Contains(field)) {
        throw InvalidArgumentError(StrCat(where, ": ", which, " (", l.ClsKey(), ") has no ", field,
                                          " field; use TransformerLayer Params"));
      }
    }
    if (p.GetInt("hidden_dim") > 0 &&
        !(l.Get("tr_fflayer_tpl").is_params() &&
          l.GetParams("tr_fflayer_tpl").Contains("hidden_dim"))) {
      throw InvalidArgumentError(StrCat(
          where, ": hidden_dim is set but ", which,
          ".tr_fflayer_tpl has no hidden_dim field; set hidden_dim to 0 to keep the template's"));
    }
    l.Set("name", "");  // children are named x_layers_<i>
    l.Set("mask_self_atten", p.GetBool("mask_self_atten"));
    l.Set("has_aux_atten", p.GetBool("has_aux_atten"));
    if (p.GetInt("mdl_dim") > 0) l.Set("input_dim", p.GetInt("mdl_dim"));
    if (p.GetInt("num_atten_heads") > 0) l.Set("num_heads", p.GetInt("num_atten_heads"));
    if (p.GetInt("hidden_dim") > 0) l.Set("tr_fflayer_tpl.hidden_dim", p.GetInt("hidden_dim"));
    if (!dropout.is_none()) {
      const double d = dropout.AsFloat();
      for (const char* a : {"tr_atten_tpl", "tr_self_atten_tpl", "tr_aux_atten_tpl"}) {
        if (!l.Get(a).is_params()) continue;
        l.Set(StrCat(a, ".atten_dropout_prob"), d).Set(StrCat(a, ".residual_dropout_prob"), d);
      }
      l.Set("tr_fflayer_tpl.residual_dropout_prob", d).Set("tr_fflayer_tpl.relu_dropout_prob", d);
    }
    layers.push_back(std::move(l));
  }
  return layers;
}

TransformerStack::TransformerStack(const glossa::Params& p) : BaseLayer(p) {
  ParamValue::List layers;
  for (auto& l : LayerParams(p)) layers.push_back(ParamValue(std::move(l)));
  input_dropout_ =
      CreateChild<DropoutLayer>("input_dropout", DropoutParams(p, "input_dropout_prob"));
  layers_ = CreateChildren<TransformerLayer>("x_layers", layers);
  model_dim_ = layers_.front()->params().GetInt("input_dim");
  for (size_t i = 1; i < layers_.size(); ++i) {
    const int64_t d = layers_[i]->params().GetInt("input_dim");
    if (d != model_dim_) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': layer ", i, " has input_dim ", d,
                                        " but layer 0 has ", model_dim_,
                                        "; set mdl_dim to give every layer one width"));
    }
  }
  const ParamValue& final_ln = p.Get("final_layer_norm");
  bool use_final_ln;
  if (final_ln.is_none()) {
    const glossa::Params& l0 = layers_.front()->params();
    const ParamValue& self = l0.Get("tr_self_atten_tpl");
    const glossa::Params& atten = self.is_params() ? self.AsParams() : l0.GetParams("tr_atten_tpl");
    use_final_ln = atten.Contains("pre_layer_norm") && atten.GetBool("pre_layer_norm");
  } else {
    use_final_ln = final_ln.AsBool();
  }
  if (use_final_ln) {
    final_ln_ =
        CreateChild<LayerNorm>("final_ln", p.GetParams("ln_tpl").Copy().Set("input_dim", model_dim_));
  }
}

at::Tensor TransformerStack::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                   const at::Tensor& paddings, const at::Tensor& aux_vecs,
                                   const at::Tensor& aux_paddings) const {
  at::Tensor x = input_dropout_->FProp(input_dropout_.Theta(theta), CastToFPropDtype(inputs));
  for (const auto& layer : layers_) {
    x = layer->FProp(layer.Theta(theta), x, paddings, aux_vecs, aux_paddings).first;
  }
  if (final_ln_) x = final_ln_->FProp(final_ln_.Theta(theta), x);
  return x;
}

NestedMap TransformerStack::InitStates(int64_t batch_size, at::ScalarType dtype) const {
  NestedMap states;
  NestedValue::List per_layer;
  for (const auto& layer : layers_) per_layer.push_back(layer->InitStates(batch_size, dtype));
  states.Put("x_layers", std::move(per_layer));
  return states;
}

std::pair<at::Tensor, NestedMap> TransformerStack::ExtendStep(
    const NestedMap& theta, const at::Tensor& inputs, const NestedMap& states,
    const at::Tensor& aux_vecs, const at::Tensor& aux_paddings) const {
  return ExtendStepProjected(theta, inputs, states, PrecomputeAux(theta, aux_vecs), aux_paddings);
}

NestedMap TransformerStack::PrecomputeContext(const NestedMap& theta, const at::Tensor& source,
                                              const at::Tensor& source_paddings) const {
  NestedMap context = StepLayer::PrecomputeContext(theta, source, source_paddings);
  context.Put("aux", PrecomputeAux(theta, source));
  return context;
}

std::pair<at::Tensor, NestedMap> TransformerStack::ExtendStep(const NestedMap& theta,
                                                              const at::Tensor& inputs,
                                                              const NestedMap& states,
                                                              const NestedMap& context) const {
  const NestedMap aux =
      context.contains("aux") ? context.at("aux").AsMap() : PrecomputeAux(theta, at::Tensor());
  return ExtendStepProjected(theta, inputs, states, aux, OptionalInput(context, "aux_paddings"));
}

NestedMap TransformerStack::PrecomputeAux(const NestedMap& theta,
                                          const at::Tensor& aux_vecs) const {
  NestedValue::List per_layer;
  for (const auto& layer : layers_) {
    per_layer.push_back(aux_vecs.defined() ? layer->PrecomputeAux(layer.Theta(theta), aux_vecs)
                                           : NestedMap());
  }
  NestedMap out;
  out.Put("x_layers", std::move(per_layer));
  return out;
}

std::pair<at::Tensor, NestedMap> TransformerStack::ExtendStepProjected(
    const NestedMap& theta, const at::Tensor& inputs, const NestedMap& states,
    const NestedMap& aux, const at::Tensor& aux_paddings) const {
  const auto& layer_aux = aux.at("x_layers").AsList();
  at::Tensor x = input_dropout_->FProp(input_dropout_.Theta(theta), CastToFPropDtype(inputs));
  const auto& layer_states = states.at("x_layers").AsList();
  NestedValue::List new_states;
  for (size_t i = 0; i < layers_.size(); ++i) {
    // Each layer through the one decoding interface, with its own projected source.
    NestedMap context;
    if (!layer_aux[i].AsMap().empty()) context.Put("aux", layer_aux[i].AsMap());
    if (aux_paddings.defined()) context.Put("aux_paddings", aux_paddings);
    const StepLayer& layer = *layers_[i];
    auto [y, s] = layer.ExtendStep(layers_[i].Theta(theta), x, layer_states[i].AsMap(), context);
    x = y;
    new_states.push_back(std::move(s));
  }
  if (final_ln_) x = final_ln_->FProp(final_ln_.Theta(theta), x);
  NestedMap out;
  out.Put("x_layers", std::move(new_states));
  return {x, out};
}

glossa::Params TransformerEncoder::Params() {
  glossa::Params p = TransformerStack::Params();
  p.Set("cls", ClsOf<TransformerEncoder>());
  return p;
}

glossa::Params TransformerDecoder::Params() {
  glossa::Params p = TransformerStack::Params();
  p.Set("cls", ClsOf<TransformerDecoder>());
  p.Set("mask_self_atten", true).Set("has_aux_atten", true);
  return p;
}

GLOSSA_REGISTER_CLASS(TransformerFeedForwardLayer, "glossa.layers.TransformerFeedForwardLayer");
GLOSSA_REGISTER_CLASS(TransformerAttentionLayer, "glossa.layers.TransformerAttentionLayer");
GLOSSA_REGISTER_CLASS(TransformerLayer, "glossa.layers.TransformerLayer");
GLOSSA_REGISTER_CLASS(TransformerStack, "glossa.layers.TransformerStack");
GLOSSA_REGISTER_CLASS(TransformerEncoder, "glossa.layers.TransformerEncoder");
GLOSSA_REGISTER_CLASS(TransformerDecoder, "glossa.layers.TransformerDecoder");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature TransformerAttentionLayer::FPropMapSpec() const {
  return {{"query", "source", "paddings"}, 1, {"outputs", "probs"}, true, "(outputs, probs)"};
}

NestedMap TransformerAttentionLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  auto [y, p] = FProp(theta, inputs.GetTensor("query"), OptionalInput(inputs, "source"), OptionalInput(inputs, "paddings"));
  NestedMap out;
  out.Put("outputs", y);
  out.Put("probs", p);
  return out;
}

BaseLayer::FPropMapSignature TransformerLayer::FPropMapSpec() const {
  return {{"inputs", "paddings", "aux_vecs", "aux_paddings"}, 1, {"outputs", "atten_probs"}, true, "(outputs, atten_probs)"};
}

NestedMap TransformerLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  auto [y, p] = FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "paddings"), OptionalInput(inputs, "aux_vecs"),
                      OptionalInput(inputs, "aux_paddings"));
  NestedMap out;
  out.Put("outputs", y);
  out.Put("atten_probs", p);
  return out;
}

BaseLayer::FPropMapSignature TransformerStack::FPropMapSpec() const {
  return {{"inputs", "paddings", "aux_vecs", "aux_paddings"}, 1, {"outputs"}, false, "Tensor"};
}

NestedMap TransformerStack::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap out;
  out.Put("outputs", FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "paddings"), OptionalInput(inputs, "aux_vecs"),
                           OptionalInput(inputs, "aux_paddings")));
  return out;
}

}  // namespace glossa
