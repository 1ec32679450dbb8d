// The ONNX export room: each exportable layer class's forward as ONNX nodes (glossa/layers/
// onnx_graph.h), kept apart from the layers, which know no export format. The emitters are keyed
// by a layer's exact class and read its typed children and members (never its Params, nor
// children by name: tests/lint/check_fprop_params.py checks this file as it checks FProp), with
// the same arithmetic as FProp. A layer whose class has no emitter is refused naming its class,
// also when it derives from one that has (its FProp may differ).
//
//   OnnxGraph g("lm_score");
//   std::string x = EmitOnnx(*emb, g, g.Input("ids", at::kLong, {"B", "T"}), "emb.");
//   x = EmitOnnx(*stack, g, x, "stack.");   // every layer in turn, each by its class
//
// Exported classes: ProjectionLayer, FCLayer, LayerNorm, EmbeddingLayer, PositionalEmbeddingLayer,
// SimpleFullSoftmax, MultiHeadedAttention, TransformerAttentionLayer, TransformerFeedForwardLayer,
// TransformerLayer, TransformerStack, TransformerEncoder, TransformerDecoder.
#pragma once

#include <string>
#include <vector>

namespace glossa {

class BaseLayer;
class OnnxGraph;
class TransformerStack;

// Appends `layer`'s forward of the value `in` to `g`, its weights as initializers named with
// `prefix`; returns the value it computes. The values a layer reads (g.Get: "self_bias",
// "causal_bias", "nonpad") are set by the task. A class without an emitter, or a setting the
// emitter does not cover: UnimplementedError naming the layer and what.
std::string EmitOnnx(const BaseLayer& layer, OnnxGraph& g, const std::string& in,
                     const std::string& prefix);

// The pieces of a decoding graph (glossa/tasks/mt/mt_onnx.cc) from a decoder stack:
// - every layer's cross-attention keys and values of `source` [B, S, D], [k0, v0, k1, v1, ...]
//   ([B, S, N, H] each), once per source;
std::vector<std::string> EmitOnnxStackSource(const TransformerStack& stack, OnnxGraph& g,
                                             const std::string& source, const std::string& prefix);
// - one decoding step of x [N, 1, D]: `caches` the self-attention keys and values of the earlier
//   steps ([k0, v0, ...], [N, t, N, H]), `sources` what EmitOnnxStackSource gave, g.Get
//   ("source_bias") masking the source; the caches with this step appended go to `new_caches`.
std::string EmitOnnxStackStep(const TransformerStack& stack, OnnxGraph& g, const std::string& x,
                              const std::string& prefix, const std::vector<std::string>& caches,
                              const std::vector<std::string>& sources,
                              std::vector<std::string>* new_caches);

}  // namespace glossa
