// Transformer building blocks (Lingvo's batch-major transformer), composed from templates as in
// Lingvo: a TransformerLayer is built from tr_atten_tpl (self- and cross-attention) and
// tr_fflayer_tpl (a dense TransformerFeedForwardLayer, a TransformerShardedMoeLayer, or any
// Block). Stacks of them are glossa/layers/transformer_stack.h. Every field of every block stays
// reachable by its path, e.g. `stack.transformer_layer_params_tpl.tr_fflayer_tpl.activation`.
//
//   auto p = TransformerStack::Params();  // glossa/layers/transformer_stack.h
//   p.Set("name", "enc").Set("num_layers", 6).Set("mdl_dim", 512).Set("num_atten_heads", 8)
//    .Set("hidden_dim", 2048);
//   p.GetParams("transformer_layer_params_tpl.tr_fflayer_tpl").Set("activation", "GELU");
//   at::Tensor enc_out = enc->FProp(enc->theta(), x, paddings);
//   // decoder: mask_self_atten and has_aux_atten; FProp(theta, y, y_paddings, enc_out, paddings)
#pragma once

#include <utility>
#include <vector>

#include "glossa/layers/attention.h"
#include "glossa/layers/base_layer.h"
#include "glossa/layers/gpipe.h"
#include "glossa/layers/step_layer.h"
#include "glossa/layers/dropout.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"

namespace glossa {


// out = x + residual_weight · dropout(fc1(relu_dropout(act(fc0(norm(x)))))) (pre-norm), or
// norm(x + ...) without norm inside (post-norm).
class TransformerFeedForwardLayer : public BaseLayer, public Block {
 public:
  // + input_dim, hidden_dim, activation ('RELU'), residual_dropout_prob, relu_dropout_prob,
  // pre_layer_norm (True), residual_weight (1.0), ln_tpl (LayerNorm; input_dim set here).
  static glossa::Params Params();
  explicit TransformerFeedForwardLayer(const glossa::Params& p);
  // inputs [B, T, D]; paddings [B, T] zero the padded positions of the block's output.
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs,
                   const at::Tensor& paddings = {}) const;
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor& paddings) const override {
    return FProp(theta, x, paddings);
  }

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  friend class FusedStepBuilder;  // the fused decoding step (glossa/layers/fused_step.cc)
  bool pre_layer_norm_;
  double residual_weight_;
  Child<LayerNorm> ln_;
  Child<FCLayer> fc0_, fc1_;
  Child<DropoutLayer> relu_dropout_, residual_dropout_;
};

// Self- or cross-attention with layer norm, residual dropout and the residual connection.
class TransformerAttentionLayer : public BaseLayer, public Block, public StepLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, query, source=None, paddings=None,
  // segment_ids=None, source_segment_ids=None) -> (outputs, probs).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + input_dim, num_heads, hidden_dim (0: input_dim), is_masked (causal self-attention),
  // atten_dropout_prob, residual_dropout_prob, pre_layer_norm (True), atten_tpl
  // (MultiHeadedAttention; input_dim, hidden_dim, num_heads and atten_dropout_prob set here),
  // ln_tpl (LayerNorm; input_dim set here).
  static glossa::Params Params();
  explicit TransformerAttentionLayer(const glossa::Params& p);
  // Self-attention when source is undefined; returns (output [B, T, D], probs [B, N, T, S]).
  // Packed inputs: segment_ids [B, T] of the queries, source_segment_ids [B, S] of the source
  // (MultiHeadedAttention::FProp).
  std::pair<at::Tensor, at::Tensor> FProp(const NestedMap& theta, const at::Tensor& query,
                                          const at::Tensor& source = {},
                                          const at::Tensor& paddings = {},
                                          const at::Tensor& segment_ids = {},
                                          const at::Tensor& source_segment_ids = {}) const;
  // Self-attention as a block (paddings mask the keys).
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor& paddings) const override {
    return FProp(theta, x, {}, paddings).first;
  }
  // Cross-attention against a source projected once (MultiHeadedAttention::ProjectSource).
  NestedMap ProjectSource(const NestedMap& theta, const at::Tensor& source) const;
  std::pair<at::Tensor, at::Tensor> FPropProjected(const NestedMap& theta, const at::Tensor& query,
                                                   const NestedMap& source,
                                                   const at::Tensor& paddings = {}) const;
  NestedMap InitStates(int64_t batch_size, at::ScalarType dtype) const override;
  // StepLayer: the step below, with context.paddings (optional).
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& query,
                                              const NestedMap& states,
                                              const NestedMap& context) const override;
  // One step of masked self-attention: query [B, D] -> (output [B, D], new states). paddings
  // [B, S+1] (optional): 1 masks a cached step (MultiHeadedAttention::ExtendStep).
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& query,
                                              const NestedMap& states,
                                              const at::Tensor& paddings = {}) const;
  bool is_masked() const { return is_masked_; }

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  friend class FusedStepBuilder;  // the fused decoding step (glossa/layers/fused_step.cc)
  at::Tensor Norm(const NestedMap& theta, const at::Tensor& x) const;
  at::Tensor Residual(const NestedMap& theta, const at::Tensor& x, const at::Tensor& y) const;
  bool pre_layer_norm_, is_masked_;
  Child<LayerNorm> ln_;
  Child<MultiHeadedAttention> atten_;
  Child<DropoutLayer> residual_dropout_;
};

// Self-attention, optional cross-attention, then the feed-forward block (Lingvo's batch-major
// TransformerLayer).
class TransformerLayer : public BaseLayer, public Block, public StepLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs, paddings=None, aux_vecs=None,
  // aux_paddings=None, segment_ids=None, aux_segment_ids=None) -> (outputs, atten_probs).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + input_dim, num_heads (0: the templates' own), mask_self_atten, has_aux_atten,
  // tr_atten_tpl (TransformerAttentionLayer), tr_self_atten_tpl (None: tr_atten_tpl),
  // tr_aux_atten_tpl (None: tr_atten_tpl), tr_fflayer_tpl (TransformerFeedForwardLayer,
  // TransformerShardedMoeLayer or any Block with an input_dim), ln_tpl (None: each block's own).
  // Tensor parallelism over mesh axis `axis` in TransformerLayer Params `p`: the attention's
  // heads (tr_atten_tpl.atten_tpl.weight_split_dims_mapping [None, axis, None]) and the
  // feed-forward hidden units (tr_fflayer_tpl.weight_split_dims_mapping_list [[None, axis],
  // [axis, None]]). Returns p.
  static glossa::Params& SetTensorParallel(glossa::Params& p, const std::string& axis);
  static glossa::Params Params();
  // Lingvo's SetCanonicalShapeParams: input_dim, num_heads and the feed-forward hidden_dim.
  static glossa::Params& SetCanonicalShapeParams(glossa::Params& p, int64_t input_dim,
                                                 int64_t hidden_dim, int64_t num_heads);
  explicit TransformerLayer(const glossa::Params& p);
  // inputs [B, T, D], paddings [B, T]; aux_vecs [B, S, D] and aux_paddings [B, S] for the
  // cross-attention. Packed inputs: segment_ids [B, T] and aux_segment_ids [B, S] (Lingvo's
  // source_segment_id and aux_segment_id). Returns (output [B, T, D], self-attention probs).
  std::pair<at::Tensor, at::Tensor> FProp(const NestedMap& theta, const at::Tensor& inputs,
                                          const at::Tensor& paddings = {},
                                          const at::Tensor& aux_vecs = {},
                                          const at::Tensor& aux_paddings = {},
                                          const at::Tensor& segment_ids = {},
                                          const at::Tensor& aux_segment_ids = {}) const;
  // A layer without cross-attention as a block.
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor& paddings) const override {
    return FProp(theta, x, paddings).first;
  }
  NestedMap InitStates(int64_t batch_size, at::ScalarType dtype) const override;
  // StepLayer: context {aux: PrecomputeAux(source), aux_paddings} (needed with has_aux_atten), and
  // paddings [B, S+1] (optional: 1 masks a cached step of the self-attention).
  NestedMap PrecomputeContext(const NestedMap& theta, const at::Tensor& source,
                              const at::Tensor& source_paddings) const override;
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& inputs,
                                              const NestedMap& states,
                                              const NestedMap& context) const override;
  // One decoding step: inputs [B, D] -> (output [B, D], new states).
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& inputs,
                                              const NestedMap& states,
                                              const at::Tensor& aux_vecs = {},
                                              const at::Tensor& aux_paddings = {}) const;
  // The cross-attention's keys and values of aux_vecs, computed once for every decoding step
  // (empty without has_aux_atten), and the step that uses them.
  NestedMap PrecomputeAux(const NestedMap& theta, const at::Tensor& aux_vecs) const;
  // Why this layer's decoding steps cannot run as one fused step under `plan` (null: none), from
  // its classes, Params and weights: "layer '<path>': <reason>", or "" when they can.
  std::string FusedStepDeclined(const NestedMap& theta, const ComputePlan* plan) const;
  // A plan made for decoding (its policy asks for the fused step) notes once why a causal
  // layer's steps cannot take it (ComputePlan::notes, printed when a bundle loads).
  void PrepareWeights(const NestedMap& theta, ComputePlan& plan) const override;
  std::pair<at::Tensor, NestedMap> ExtendStepProjected(const NestedMap& theta,
                                                       const at::Tensor& inputs,
                                                       const NestedMap& states,
                                                       const NestedMap& aux,
                                                       const at::Tensor& aux_paddings,
                                                       const at::Tensor& paddings = {}) const;

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  friend class FusedStepBuilder;  // builds the fused step from the typed children below
  // ExtendStepProjected as one fused decoding step (glossa/layers/fused_step.cc builds it from the
  // children) where it applies (inference, a dense feed-forward block, float32 theta and states);
  // false otherwise.
  bool FusedExtendStep(const NestedMap& theta, const at::Tensor& inputs, const NestedMap& states,
                       const NestedMap& aux, const at::Tensor& aux_paddings,
                       const at::Tensor& paddings, at::Tensor* out, NestedMap* new_states) const;
  Child<TransformerAttentionLayer> self_atten_, cross_atten_;
  Child<BaseLayer> fflayer_;
  const Block* ff_block_ = nullptr;
  // Set when the feed-forward block is MoE: a decoding step routes its tokens as one group.
};

}  // namespace glossa
