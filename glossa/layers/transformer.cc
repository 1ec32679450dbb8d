#include "glossa/layers/transformer.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/dropout.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/moe.h"
#include "glossa/layers/normalization.h"

namespace glossa {
namespace {

glossa::Params DropoutParams(double prob) {
  return DeterministicDropoutLayer::Params().Set("keep_prob", 1.0 - prob);
}

at::Tensor RunDropout(const BaseLayer& owner, const NestedMap& theta, const char* name,
                      const at::Tensor& x) {
  return owner.GetChildAs<DropoutLayer>(name).FProp(theta.at(name).AsMap(), x);
}

const NestedMap& Sub(const NestedMap& theta, const char* name) { return theta.at(name).AsMap(); }

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
  return p;
}

TransformerFeedForwardLayer::TransformerFeedForwardLayer(const glossa::Params& p) : BaseLayer(p) {
  const int64_t d = params().GetInt("input_dim"), h = params().GetInt("hidden_dim");
  CreateChild("ln", LayerNorm::Params().Set("input_dim", d));
  auto fc = FCLayer::Params();
  fc.Set("input_dim", d).Set("output_dim", h).Set("activation", params().GetString("activation"));
  CreateChild("fc0", fc);
  fc.Set("input_dim", h).Set("output_dim", d).Set("activation", "NONE");
  CreateChild("fc1", fc);
  CreateChild("relu_dropout", DropoutParams(params().GetFloat("relu_dropout_prob")));
  CreateChild("residual_dropout", DropoutParams(params().GetFloat("residual_dropout_prob")));
}

at::Tensor TransformerFeedForwardLayer::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                              const at::Tensor& paddings) const {
  const bool pre_ln = params().GetBool("pre_layer_norm");
  const auto& ln = GetChildAs<LayerNorm>("ln");
  at::Tensor x = CastToFPropDtype(inputs);
  at::Tensor h = pre_ln ? ln.FProp(Sub(theta, "ln"), x) : x;
  h = GetChildAs<FCLayer>("fc0").FProp(Sub(theta, "fc0"), h, paddings);
  h = RunDropout(*this, theta, "relu_dropout", h);
  h = GetChildAs<FCLayer>("fc1").FProp(Sub(theta, "fc1"), h, paddings);
  h = RunDropout(*this, theta, "residual_dropout", h);
  at::Tensor out = at::add(x, h, params().GetFloat("residual_weight"));  // alpha: no mul when 1
  return pre_ln ? out : ln.FProp(Sub(theta, "ln"), out);
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
  p.Define("enable_per_dim_scale", true, "Learned per-dim scaling of the queries.");
  return p;
}

TransformerAttentionLayer::TransformerAttentionLayer(const glossa::Params& p) : BaseLayer(p) {
  pre_layer_norm_ = params().GetBool("pre_layer_norm");
  is_masked_ = params().GetBool("is_masked");
  const int64_t d = params().GetInt("input_dim");
  CreateChild("ln", LayerNorm::Params().Set("input_dim", d));
  auto atten = MultiHeadedAttention::Params();
  atten.Set("input_dim", d).Set("hidden_dim", params().GetInt("hidden_dim"));
  atten.Set("num_heads", params().GetInt("num_heads"));
  atten.Set("atten_dropout_prob", params().GetFloat("atten_dropout_prob"));
  atten.Set("enable_per_dim_scale", params().GetBool("enable_per_dim_scale"));
  CreateChild("atten", atten);
  CreateChild("residual_dropout", DropoutParams(params().GetFloat("residual_dropout_prob")));
}

at::Tensor TransformerAttentionLayer::Norm(const NestedMap& theta, const at::Tensor& x) const {
  return GetChildAs<LayerNorm>("ln").FProp(Sub(theta, "ln"), x);
}

at::Tensor TransformerAttentionLayer::Residual(const NestedMap& theta, const at::Tensor& x,
                                               const at::Tensor& y) const {
  at::Tensor out = x + RunDropout(*this, theta, "residual_dropout", y);
  return pre_layer_norm_ ? out : Norm(theta, out);
}

std::pair<at::Tensor, at::Tensor> TransformerAttentionLayer::FProp(
    const NestedMap& theta, const at::Tensor& query, const at::Tensor& source,
    const at::Tensor& paddings) const {
  at::Tensor x = CastToFPropDtype(query);
  at::Tensor q = pre_layer_norm_ ? Norm(theta, x) : x;
  // Cross-attention attends to the source as given; self-attention to the normalized query.
  at::Tensor kv = source.defined() ? CastToFPropDtype(source) : q;
  auto [encoded, probs] = GetChildAs<MultiHeadedAttention>("atten").FProp(
      Sub(theta, "atten"), q, kv, kv, paddings, is_masked_ && !source.defined());
  return {Residual(theta, x, encoded), probs};
}

NestedMap TransformerAttentionLayer::InitStates(int64_t batch_size, at::ScalarType dtype) const {
  return GetChildAs<MultiHeadedAttention>("atten").InitStates(batch_size, dtype);
}

std::pair<at::Tensor, NestedMap> TransformerAttentionLayer::ExtendStep(
    const NestedMap& theta, const at::Tensor& query, const NestedMap& states) const {
  if (!is_masked_) {
    throw FailedPreconditionError(
        StrCat("layer '", path(), "': ExtendStep needs causal self-attention (is_masked)"));
  }
  at::Tensor x = CastToFPropDtype(query);
  at::Tensor q = pre_layer_norm_ ? Norm(theta, x) : x;
  auto [encoded, new_states] =
      GetChildAs<MultiHeadedAttention>("atten").ExtendStep(Sub(theta, "atten"), q, states);
  return {Residual(theta, x, encoded), new_states};
}

// ---- TransformerLayer ----

glossa::Params TransformerLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerLayer>());
  p.Define("input_dim", 0, "Dimension of the transformer block input.");
  p.Define("num_heads", 1, "Number of attention heads.");
  p.Define("hidden_dim", 0, "Hidden dimension of the feed-forward block.");
  p.Define("mask_self_atten", false, "If True, use causal self-attention (decoder).");
  p.Define("has_aux_atten", false, "If True, add cross-attention to aux_vecs (decoder).");
  p.Define("atten_dropout_prob", 0.0, "Dropout probability on the attention weights.");
  p.Define("residual_dropout_prob", 0.0, "Dropout probability on the residual branches.");
  p.Define("relu_dropout_prob", 0.0, "Dropout probability inside the feed-forward block.");
  p.Define("pre_layer_norm", true, "Pre-layer-norm (True) or post-layer-norm (False) blocks.");
  p.Define("activation", "RELU", "Feed-forward non-linearity.");
  p.Define("tr_fflayer_tpl", nullptr,
           "Feed-forward block params (None: TransformerFeedForwardLayer). A "
           "TransformerShardedMoeLayer here makes the layer a Mixture-of-Experts layer; its "
           "input_dim, dropouts, pre_layer_norm and activation are set from this layer's, and "
           "hidden_dim when 0.");
  return p;
}

TransformerLayer::TransformerLayer(const glossa::Params& p) : BaseLayer(p) {
  const int64_t d = params().GetInt("input_dim");
  auto atten = TransformerAttentionLayer::Params();
  atten.Set("input_dim", d).Set("num_heads", params().GetInt("num_heads"));
  atten.Set("atten_dropout_prob", params().GetFloat("atten_dropout_prob"));
  atten.Set("residual_dropout_prob", params().GetFloat("residual_dropout_prob"));
  atten.Set("pre_layer_norm", params().GetBool("pre_layer_norm"));
  CreateChild("self_atten", atten.Copy().Set("is_masked", params().GetBool("mask_self_atten")));
  if (params().GetBool("has_aux_atten")) CreateChild("cross_atten", atten);
  const ParamValue& tpl = params().Get("tr_fflayer_tpl");
  auto ff = tpl.is_none() ? TransformerFeedForwardLayer::Params() : tpl.AsParams().Copy();
  ff.Set("input_dim", d);
  if (tpl.is_none() || ff.GetInt("hidden_dim") == 0) {
    ff.Set("hidden_dim", params().GetInt("hidden_dim"));
  }
  ff.Set("activation", params().GetString("activation"));
  ff.Set("residual_dropout_prob", params().GetFloat("residual_dropout_prob"));
  ff.Set("relu_dropout_prob", params().GetFloat("relu_dropout_prob"));
  ff.Set("pre_layer_norm", params().GetBool("pre_layer_norm"));
  CreateChild("fflayer", ff);
}

std::pair<at::Tensor, at::Tensor> TransformerLayer::FProp(const NestedMap& theta,
                                                          const at::Tensor& inputs,
                                                          const at::Tensor& paddings,
                                                          const at::Tensor& aux_vecs,
                                                          const at::Tensor& aux_paddings) const {
  auto [x, probs] = GetChildAs<TransformerAttentionLayer>("self_atten")
                        .FProp(Sub(theta, "self_atten"), inputs, {}, paddings);
  if (HasChild("cross_atten")) {
    if (!aux_vecs.defined()) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': has_aux_atten needs aux_vecs"));
    }
    x = GetChildAs<TransformerAttentionLayer>("cross_atten")
            .FProp(Sub(theta, "cross_atten"), x, aux_vecs, aux_paddings)
            .first;
  }
  x = FeedForward(theta, x, paddings);
  return {x, probs};
}

at::Tensor TransformerLayer::FeedForward(const NestedMap& theta, const at::Tensor& x,
                                         const at::Tensor& paddings, bool one_group) const {
  const BaseLayer& ff = GetChild("fflayer");
  if (const auto* moe = dynamic_cast<const TransformerShardedMoeLayer*>(&ff)) {
    return moe->FProp(Sub(theta, "fflayer"), x, paddings, one_group ? 1 : 0);
  }
  return GetChildAs<TransformerFeedForwardLayer>("fflayer").FProp(Sub(theta, "fflayer"), x,
                                                                  paddings);
}

NestedMap TransformerLayer::InitStates(int64_t batch_size, at::ScalarType dtype) const {
  return GetChildAs<TransformerAttentionLayer>("self_atten").InitStates(batch_size, dtype);
}

std::pair<at::Tensor, NestedMap> TransformerLayer::ExtendStep(
    const NestedMap& theta, const at::Tensor& inputs, const NestedMap& states,
    const at::Tensor& aux_vecs, const at::Tensor& aux_paddings) const {
  auto [x, new_states] = GetChildAs<TransformerAttentionLayer>("self_atten")
                             .ExtendStep(Sub(theta, "self_atten"), inputs, states);
  if (HasChild("cross_atten")) {
    x = GetChildAs<TransformerAttentionLayer>("cross_atten")
            .FProp(Sub(theta, "cross_atten"), x.unsqueeze(1), aux_vecs, aux_paddings)
            .first.squeeze(1);
  }
  x = FeedForward(theta, x.unsqueeze(1), {}, /*one_group=*/true).squeeze(1);
  return {x, new_states};
}

// ---- TransformerStack ----

void DefineStackLayerParams(glossa::Params& p) {
  p.Define("num_layers", 1, "Number of transformer layers.");
  p.Define("model_dim", 0, "Model dimension (input and output of every layer).");
  p.Define("num_heads", 1, "Number of attention heads.");
  p.Define("hidden_dim", 0, "Hidden dimension of the feed-forward blocks.");
  p.Define("mask_self_atten", false, "Causal self-attention (decoder).");
  p.Define("atten_dropout_prob", 0.0, "Dropout probability on the attention weights.");
  p.Define("residual_dropout_prob", 0.0, "Dropout probability on the residual branches.");
  p.Define("relu_dropout_prob", 0.0, "Dropout probability inside the feed-forward blocks.");
  p.Define("pre_layer_norm", true,
           "Pre-layer-norm layers (a TransformerStack adds a final layer norm) or "
           "post-layer-norm layers.");
  p.Define("activation", "RELU", "Feed-forward non-linearity.");
}

glossa::Params StackLayerParams(const glossa::Params& stack) {
  auto layer = TransformerLayer::Params();
  layer.Set("input_dim", stack.GetInt("model_dim")).Set("num_heads", stack.GetInt("num_heads"));
  layer.Set("hidden_dim", stack.GetInt("hidden_dim"));
  for (const char* key : {"mask_self_atten", "atten_dropout_prob", "residual_dropout_prob",
                          "relu_dropout_prob", "pre_layer_norm", "activation"}) {
    layer.Set(key, stack.Get(key));
  }
  return layer;
}

glossa::Params TransformerStack::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerStack>());
  DefineStackLayerParams(p);
  p.Define("has_aux_atten", false, "Cross-attention to the encoder output (decoder).");
  p.Define("input_dropout_prob", 0.0, "Dropout probability on the stack's input.");
  p.Define("moe_tpl", nullptr,
           "TransformerShardedMoeLayer params for Mixture-of-Experts feed-forward blocks (None: "
           "all dense).");
  p.Define("moe_layers_every", 2,
           "With moe_tpl: layer i uses it when (i + 1) % moe_layers_every == 0 (GShard's every "
           "other layer with 2).");
  return p;
}

TransformerStack::TransformerStack(const glossa::Params& p) : BaseLayer(p) {
  const int64_t n = params().GetInt("num_layers");
  if (n <= 0) throw InvalidArgumentError(StrCat("layer '", path(), "': num_layers must be > 0"));
  auto layer = StackLayerParams(params());
  layer.Set("has_aux_atten", params().Get("has_aux_atten"));
  const ParamValue& moe = params().Get("moe_tpl");
  const int64_t every = params().GetInt("moe_layers_every");
  if (!moe.is_none() && every <= 0) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': moe_layers_every must be > 0"));
  }
  ParamValue::List layers;
  for (int64_t i = 0; i < n; ++i) {
    if (!moe.is_none() && (i + 1) % every == 0) {
      layers.push_back(layer.Copy().Set("tr_fflayer_tpl", moe.AsParams()));
    } else {
      layers.push_back(layer);
    }
  }
  CreateChild("input_dropout", DropoutParams(params().GetFloat("input_dropout_prob")));
  CreateChildren("x_layers", layers);
  layers_ = GetChildren("x_layers");
  if (params().GetBool("pre_layer_norm")) {
    CreateChild("final_ln", LayerNorm::Params().Set("input_dim", params().GetInt("model_dim")));
  }
}

at::Tensor TransformerStack::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                   const at::Tensor& paddings, const at::Tensor& aux_vecs,
                                   const at::Tensor& aux_paddings) const {
  at::Tensor x = RunDropout(*this, theta, "input_dropout", CastToFPropDtype(inputs));
  const auto& layer_thetas = theta.at("x_layers").AsList();
  for (size_t i = 0; i < layers_.size(); ++i) {
    x = static_cast<const TransformerLayer*>(layers_[i])
            ->FProp(layer_thetas[i].AsMap(), x, paddings, aux_vecs, aux_paddings)
            .first;
  }
  if (HasChild("final_ln")) x = GetChildAs<LayerNorm>("final_ln").FProp(Sub(theta, "final_ln"), x);
  return x;
}

NestedMap TransformerStack::InitStates(int64_t batch_size, at::ScalarType dtype) const {
  NestedMap states;
  NestedValue::List per_layer;
  for (const BaseLayer* l : layers_) {
    per_layer.push_back(static_cast<const TransformerLayer*>(l)->InitStates(batch_size, dtype));
  }
  states.Put("x_layers", std::move(per_layer));
  return states;
}

std::pair<at::Tensor, NestedMap> TransformerStack::ExtendStep(
    const NestedMap& theta, const at::Tensor& inputs, const NestedMap& states,
    const at::Tensor& aux_vecs, const at::Tensor& aux_paddings) const {
  at::Tensor x = RunDropout(*this, theta, "input_dropout", CastToFPropDtype(inputs));
  const auto& layer_thetas = theta.at("x_layers").AsList();
  const auto& layer_states = states.at("x_layers").AsList();
  NestedValue::List new_states;
  for (size_t i = 0; i < layers_.size(); ++i) {
    auto [y, s] = static_cast<const TransformerLayer*>(layers_[i])
                      ->ExtendStep(layer_thetas[i].AsMap(), x, layer_states[i].AsMap(), aux_vecs,
                                   aux_paddings);
    x = y;
    new_states.push_back(std::move(s));
  }
  if (HasChild("final_ln")) x = GetChildAs<LayerNorm>("final_ln").FProp(Sub(theta, "final_ln"), x);
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

}  // namespace glossa
