// Token embeddings and sinusoidal position embeddings (Lingvo's SimpleEmbeddingLayer and
// PositionalEmbeddingLayer).
//
//   at::Tensor e = emb->EmbLookup(emb->theta(), ids);            // ids [B, T] -> [B, T, dim]
//   at::Tensor pos = pe->FProp(pe->theta(), /*seq_length=*/T);   // [T, dim]
#pragma once

#include <mutex>

#include "glossa/layers/base_layer.h"

namespace glossa {

class EmbeddingLayer : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, ids) -> Tensor.
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + vocab_size, embedding_dim, scale_sqrt_depth (False: multiply by sqrt(embedding_dim)),
  // weight_split_dims_mapping (None).
  static glossa::Params Params();
  explicit EmbeddingLayer(const glossa::Params& p);
  // ids: an integer tensor of any shape -> [..., embedding_dim]. InvalidArgument for ids outside
  // [0, vocab_size).
  at::Tensor EmbLookup(const NestedMap& theta, const at::Tensor& ids) const;
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& ids) const {
    return EmbLookup(theta, ids);
  }

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  int64_t vocab_size_, embedding_dim_;
  bool scale_sqrt_depth_;
  MeshAxis* axis_ = nullptr;  // the vocabulary is split over it (weight_split_dims_mapping)
};

class PositionalEmbeddingLayer : public BaseLayer {
 public:
  // The ONNX export's table of positions (glossa/layers/onnx_export.cc): sequences up to this length.
  static constexpr int64_t kOnnxMaxPositions = 2048;
  // The uniform call (BaseLayer::FPropMap): FProp(theta, seq_length_or_position) -> Tensor.
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + min_timescale (1), max_timescale (10000), embedding_dim.
  static glossa::Params Params();
  explicit PositionalEmbeddingLayer(const glossa::Params& p);
  // Embeddings of positions 0..seq_length-1: [seq_length, embedding_dim]. Rows of a table the
  // layer keeps (computed by FPropWithPosition for positions 0..n-1, n grown by doubling): the
  // same bits, each row a function of its position alone, without the ten ops that compute them.
  at::Tensor FProp(const NestedMap& theta, int64_t seq_length) const;
  // Embeddings of explicit positions [B, T] (e.g. packed inputs): [B, T, embedding_dim].
  at::Tensor FPropWithPosition(const NestedMap& theta, const at::Tensor& position) const;

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  int64_t embedding_dim_;
  double min_timescale_, max_timescale_;
  // FProp's table (in the fprop dtype): replaced, never changed in place, under table_mu_.
  mutable std::mutex table_mu_;
  mutable at::Tensor table_;
};

}  // namespace glossa
