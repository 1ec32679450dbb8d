// The MT encoder (Lingvo's TransformerBatchMajorEncoder), built by glossa/tasks/mt/mt.h's
// TransformerModel; its ONNX export is in mt_onnx.cc.
#pragma once

#include <string>

#include "glossa/layers/base_layer.h"

namespace glossa {

class EmbeddingLayer;
class OnnxGraph;  // glossa/layers/onnx_graph.h
class PositionalEmbeddingLayer;
class TransformerStack;

namespace mt {

// Lingvo's encoder.TransformerBatchMajorEncoder: token embedding · sqrt(model_dim) + sinusoidal
// positions, input dropout, a TransformerStack (with its optional final layer norm).
class TransformerEncoder : public BaseLayer {
 public:
  // + token_emb (EmbeddingLayer), position_emb (PositionalEmbeddingLayer), model_dim,
  // input_dropout_prob, transformer_stack (TransformerStack).
  static glossa::Params Params();
  explicit TransformerEncoder(const glossa::Params& p);
  // src {ids, paddings} [B, S] -> {encoded [B, S, D], paddings [B, S]}.
  NestedMap FProp(const NestedMap& theta, const NestedMap& src) const;
  int64_t model_dim() const { return model_dim_; }
  // ONNX (glossa/layers/onnx_graph.h): ids [B, S] int64, paddings [B, S] float32 -> encoded.
  std::string EmitOnnxEncode(OnnxGraph& g, const std::string& ids,
                             const std::string& paddings) const;

 private:
  int64_t model_dim_;
  Child<EmbeddingLayer> token_emb_;
  Child<PositionalEmbeddingLayer> position_emb_;
  Child<TransformerStack> stack_;
};

}  // namespace mt
}  // namespace glossa
