// The TorchScript export room: each exportable layer class's forward as lines of a TorchScript
// forward (glossa/layers/torchscript.h), with the ATen calls its FProp makes, kept apart from the
// layers, which know no export format. As the ONNX room (glossa/layers/onnx_export.h), the
// emitters are keyed by a layer's exact class, read its typed children and members only (the
// FProp lint checks this file), and a class without one is refused naming it.
//
//   TorchScriptWriter w;
//   EmitTorchScript(*emb, w, "ids", "x", "");
//   EmitTorchScript(*stack, w, "x", "x", "");   // every layer in turn, each by its class
//
// Exported classes: ProjectionLayer, FCLayer, LayerNorm, EmbeddingLayer, PositionalEmbeddingLayer,
// SimpleFullSoftmax, MultiHeadedAttention, TransformerAttentionLayer, TransformerFeedForwardLayer,
// TransformerLayer, TransformerStack, TransformerEncoder, TransformerDecoder.
#pragma once

#include <string>

namespace glossa {

class BaseLayer;
class TorchScriptWriter;

// Writes `layer`'s forward: reads the variable `in`, assigns `out`, registers its weights with the
// name prefix `prefix`. A class without an emitter, or a setting it does not cover:
// UnimplementedError naming the layer and what.
void EmitTorchScript(const BaseLayer& layer, TorchScriptWriter& w, const std::string& in,
                     const std::string& out, const std::string& prefix);

}  // namespace glossa
