// What the MT layers share (glossa/tasks/mt/mt_encoder.cc, mt_decoder.cc, mt.cc): dimension and
// input checks, embedding with positions, and Lingvo's MT param names (lingvo/tasks/mt).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "glossa/core/params.h"
#include "glossa/layers/base_layer.h"
#include "glossa/layers/embedding.h"

namespace glossa {
namespace mt {

// InvalidArgument naming `key` unless value == want.
void CheckDim(const BaseLayer& layer, const char* key, int64_t value, const char* what,
              int64_t want);
// x = emb(ids) (scaled by sqrt(dim) in the embedding) + positions[0..T), or with packed inputs
// the positions `segment_pos` [B, T] (each segment's restart at 0).
at::Tensor EmbedWithPositions(const Child<EmbeddingLayer>& emb,
                              const Child<PositionalEmbeddingLayer>& pos, const NestedMap& theta,
                              const at::Tensor& ids, const at::Tensor& segment_pos = {});
// InvalidArgument unless ids and paddings are both [B, T].
void CheckIdsPaddings(const BaseLayer& layer, const char* what, const at::Tensor& ids,
                      const at::Tensor& paddings);

// Lingvo's MT layers name some settings differently (layers.py TransformerStack:
// num_transformer_layers, transformer_tpl, ln_output, model_dim; decoder.py TransformerDecoder:
// trans_tpl, ln_output). Both names are accepted so that Lingvo override paths carry over.
void DefineLingvoAlias(glossa::Params& p, const char* lingvo, const char* glossa_key);
// The value under Lingvo's name when set (InvalidArgument when Glossa's is set too), else Glossa's.
ParamValue ResolveLingvoAlias(const glossa::Params& p, const glossa::Params& defaults,
                              const std::string& where, const char* lingvo,
                              const char* glossa_key);
// TransformerStack::Params() with Lingvo's MT names defined.
glossa::Params EncoderStackParams();

}  // namespace mt
}  // namespace glossa
