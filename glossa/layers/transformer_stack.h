// TransformerStack (Lingvo's StackedTransformerLayers) and its encoder and decoder names: a stack
// of glossa/layers/transformer.h's TransformerLayers from transformer_layer_params_tpl, one
// template or a list of them, pipelined over stages when splits > 1.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "glossa/layers/transformer.h"

namespace glossa {

// Lingvo's StackedTransformerLayers: num_layers TransformerLayers from
// transformer_layer_params_tpl (one template, or a list whose length divides num_layers: layer i
// uses template i / (num_layers / len)), then an optional final layer norm. The stack's fields
// set the corresponding template fields of every layer when given (mdl_dim > 0, hidden_dim > 0,
// num_atten_heads > 0, dropout_prob not None); mask_self_atten and has_aux_atten always do.
//
// splits > 1 pipelines the layers as GPipe does (gpipe.h: that many stages, num_micro_batches
// micro-batches, recomputation in the backward), on threads in one process or, on a mesh's
// 'pipe' axis, one stage per rank (glossa train --mesh=pipe:S): a rank then builds and trains
// only its stage's layers. Pipelining leaves the math as it was: every layer draws its dropout
// masks from its own seed, and a micro-batch draws its rows of the whole batch's masks, so any
// splits and micro-batching give the same outputs and gradients as splits 1 (up to float
// rounding) and the same checkpoint names; decoding and export take the whole stack (one
// process).
struct PipelineCells;
class TransformerStack : public BaseLayer, public Block, public StepLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs, paddings=None, aux_vecs=None,
  // aux_paddings=None, segment_ids=None, aux_segment_ids=None) -> Tensor.
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + num_layers, mdl_dim, hidden_dim, num_atten_heads, dropout_prob, mask_self_atten,
  // has_aux_atten, input_dropout_prob, final_layer_norm (True), ln_tpl,
  // transformer_layer_params_tpl, splits (1), num_micro_batches (1).
  static glossa::Params Params();
  // Defines the fields LayerParams reads (every field above but input_dropout_prob,
  // final_layer_norm and ln_tpl), for other stacks of TransformerLayers (GPipeTransformerStack).
  static void DefineLayerFields(glossa::Params& p);
  explicit TransformerStack(const glossa::Params& p);
  // The TransformerLayer Params of every layer, after the stack's fields are applied
  // (InvalidArgument naming the field for a bad num_layers or template list).
  static std::vector<glossa::Params> LayerParams(const glossa::Params& stack);

  // Packed inputs: segment_ids [B, T], aux_segment_ids [B, S] (TransformerLayer::FProp); not in a
  // pipeline (FailedPrecondition).
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs,
                   const at::Tensor& paddings = {}, const at::Tensor& aux_vecs = {},
                   const at::Tensor& aux_paddings = {}, const at::Tensor& segment_ids = {},
                   const at::Tensor& aux_segment_ids = {}) const;
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor& paddings) const override {
    return FProp(theta, x, paddings);
  }
  // Per-layer decoding caches.
  NestedMap InitStates(int64_t batch_size, at::ScalarType dtype) const override;
  // StepLayer: context {aux: PrecomputeAux(source), aux_paddings}; without one, no source. And
  // paddings [B, S+1] (optional), as ExtendStepProjected's.
  NestedMap PrecomputeContext(const NestedMap& theta, const at::Tensor& source,
                              const at::Tensor& source_paddings) const override;
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& inputs,
                                              const NestedMap& states,
                                              const NestedMap& context) const override;
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& inputs,
                                              const NestedMap& states,
                                              const at::Tensor& aux_vecs = {},
                                              const at::Tensor& aux_paddings = {}) const;
  // Every layer's projected cross-attention source ({x_layers: [...]}), computed once per
  // source, and the decoding step that uses it (what beam search and sampling call).
  NestedMap PrecomputeAux(const NestedMap& theta, const at::Tensor& aux_vecs) const;
  // paddings [B, S+1] (optional): 1 masks a cached step in every layer's self-attention (a row
  // that joined a running decoding batch after step 0 masks the steps before it).
  std::pair<at::Tensor, NestedMap> ExtendStepProjected(const NestedMap& theta,
                                                       const at::Tensor& inputs,
                                                       const NestedMap& states,
                                                       const NestedMap& aux,
                                                       const at::Tensor& aux_paddings,
                                                       const at::Tensor& paddings = {}) const;
  // Where the ends of a stack of Params `stack` built in `context` go (what a task that feeds and
  // reads the stack asks before building its layers around it).
  static PipelineEnds PlaceEnds(const glossa::Params& stack, const BuildContext& context);
  const PipelineEnds& pipeline_ends() const { return ends_; }
  // The layers this process holds (all of them, or on a pipe rank its stage's).
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t model_dim() const { return model_dim_; }
  ~TransformerStack() override;

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  // FailedPrecondition naming `what` on a pipe rank, which holds only its stage's layers.
  void CheckWhole(const char* what) const;
  int64_t model_dim_;
  std::unique_ptr<PipelineCells> pipe_;  // splits > 1
  PipelineEnds ends_;
  std::vector<int64_t> layer_seeds_;     // GenerateSeedFromName(layer path)
  Child<DropoutLayer> input_dropout_;
  std::vector<Child<TransformerLayer>> layers_;
  Child<LayerNorm> final_ln_;
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
