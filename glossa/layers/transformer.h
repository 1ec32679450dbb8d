// Transformer building blocks (Lingvo's batch-major transformer): the feed-forward block, the
// attention block, the transformer layer (self-attention, optional cross-attention, feed-forward;
// pre- or post-layer-norm, residual dropout), and encoder/decoder stacks.
//
//   auto p = TransformerStack::Params();
//   p.Set("name", "enc").Set("num_layers", 6).Set("model_dim", 512).Set("num_heads", 8)
//    .Set("hidden_dim", 2048);
//   at::Tensor enc_out = enc->FProp(enc->theta(), x, paddings);
//   // decoder: mask_self_atten and has_aux_atten; FProp(theta, y, y_paddings, enc_out, paddings)
#pragma once

#include <utility>
#include <vector>

#include "glossa/layers/base_layer.h"

namespace glossa {

// out = x + residual_weight · dropout(fc1(relu_dropout(act(fc0(norm(x)))))) (pre-norm), or
// norm(x + ...) without norm inside (post-norm).
class TransformerFeedForwardLayer : public BaseLayer {
 public:
  // + input_dim, hidden_dim, activation ('RELU'), residual_dropout_prob, relu_dropout_prob,
  // pre_layer_norm (True), residual_weight (1.0).
  static glossa::Params Params();
  explicit TransformerFeedForwardLayer(const glossa::Params& p);
  // inputs [B, T, D]; paddings [B, T] zero the padded positions of the block's output.
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs,
                   const at::Tensor& paddings = {}) const;
};

// Self- or cross-attention with layer norm, residual dropout and the residual connection.
class TransformerAttentionLayer : public BaseLayer {
 public:
  // + input_dim, num_heads, hidden_dim (0: input_dim), is_masked (causal self-attention),
  // atten_dropout_prob, residual_dropout_prob, pre_layer_norm (True), enable_per_dim_scale.
  static glossa::Params Params();
  explicit TransformerAttentionLayer(const glossa::Params& p);
  // Self-attention when source is undefined; returns (output [B, T, D], probs [B, N, T, S]).
  std::pair<at::Tensor, at::Tensor> FProp(const NestedMap& theta, const at::Tensor& query,
                                          const at::Tensor& source = {},
                                          const at::Tensor& paddings = {}) const;
  NestedMap InitStates(int64_t batch_size, at::ScalarType dtype) const;
  // One step of masked self-attention: query [B, D] -> (output [B, D], new states).
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& query,
                                              const NestedMap& states) const;

 private:
  at::Tensor Norm(const NestedMap& theta, const at::Tensor& x) const;
  at::Tensor Residual(const NestedMap& theta, const at::Tensor& x, const at::Tensor& y) const;
  bool pre_layer_norm_, is_masked_;
};

class TransformerLayer : public BaseLayer {
 public:
  // + input_dim, num_heads, hidden_dim (feed-forward), mask_self_atten, has_aux_atten,
  // atten_dropout_prob, residual_dropout_prob, relu_dropout_prob, pre_layer_norm, activation,
  // tr_fflayer_tpl (None: dense; TransformerShardedMoeLayer params: MoE).
  static glossa::Params Params();
  explicit TransformerLayer(const glossa::Params& p);
  // inputs [B, T, D], paddings [B, T]; aux_vecs [B, S, D] and aux_paddings [B, S] for the
  // cross-attention. Returns (output [B, T, D], self-attention probs).
  std::pair<at::Tensor, at::Tensor> FProp(const NestedMap& theta, const at::Tensor& inputs,
                                          const at::Tensor& paddings = {},
                                          const at::Tensor& aux_vecs = {},
                                          const at::Tensor& aux_paddings = {}) const;
  NestedMap InitStates(int64_t batch_size, at::ScalarType dtype) const;
  // One decoding step: inputs [B, D] -> (output [B, D], new states).
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& inputs,
                                              const NestedMap& states,
                                              const at::Tensor& aux_vecs = {},
                                              const at::Tensor& aux_paddings = {}) const;

 private:
  // The dense or MoE feed-forward block; one_group routes a decoding step's tokens together.
  at::Tensor FeedForward(const NestedMap& theta, const at::Tensor& x, const at::Tensor& paddings,
                         bool one_group = false) const;
};

// The fields a stack of TransformerLayers forwards to each layer: num_layers, model_dim,
// num_heads, hidden_dim, mask_self_atten, atten_dropout_prob, residual_dropout_prob,
// relu_dropout_prob, pre_layer_norm, activation (TransformerStack, GPipeTransformerStack).
void DefineStackLayerParams(glossa::Params& p);
// TransformerLayer Params from a stack's fields (input_dim = model_dim).
glossa::Params StackLayerParams(const glossa::Params& stack);

// num_layers TransformerLayers, with a final layer norm when the layers are pre-norm.
// An encoder leaves mask_self_atten and has_aux_atten off; a decoder turns both on.
class TransformerStack : public BaseLayer {
 public:
  // + num_layers, model_dim, num_heads, hidden_dim, mask_self_atten, has_aux_atten,
  // atten_dropout_prob, residual_dropout_prob, relu_dropout_prob, input_dropout_prob,
  // pre_layer_norm (True), activation, moe_tpl (None), moe_layers_every (2).
  static glossa::Params Params();
  explicit TransformerStack(const glossa::Params& p);
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs,
                   const at::Tensor& paddings = {}, const at::Tensor& aux_vecs = {},
                   const at::Tensor& aux_paddings = {}) const;
  // Per-layer decoding caches.
  NestedMap InitStates(int64_t batch_size, at::ScalarType dtype) const;
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& inputs,
                                              const NestedMap& states,
                                              const at::Tensor& aux_vecs = {},
                                              const at::Tensor& aux_paddings = {}) const;

 private:
  std::vector<BaseLayer*> layers_;
};

class TransformerEncoder : public TransformerStack {
 public:
  static glossa::Params Params();
  explicit TransformerEncoder(const glossa::Params& p) : TransformerStack(p) {}
};

class TransformerDecoder : public TransformerStack {
 public:
  static glossa::Params Params();
  explicit TransformerDecoder(const glossa::Params& p) : TransformerStack(p) {}
};

}  // namespace glossa
