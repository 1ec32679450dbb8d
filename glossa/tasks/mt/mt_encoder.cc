// The MT Transformer encoder (Lingvo's mt.encoder.TransformerEncoder).
#include "glossa/tasks/mt/mt_encoder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <cmath>

#include "glossa/base/errors.h"
#include "glossa/tasks/mt/mt_common.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/input/tokenizers.h"
#include "glossa/layers/embedding.h"
#include "glossa/kernels/fused_xent.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/metrics/bleu.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/search/beam_search.h"
#include "glossa/search/ctc_prefix_score.h"
#include "glossa/search/lexicon.h"

namespace glossa {
namespace mt {

// ---- TransformerEncoder ----

glossa::Params TransformerEncoder::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerEncoder>());
  p.Define("token_emb", EmbeddingLayer::Params().Set("scale_sqrt_depth", true),
           "Source token embedding (vocab_size, embedding_dim; scaled by sqrt(embedding_dim)).");
  p.Define("position_emb", PositionalEmbeddingLayer::Params(), "Sinusoidal position embedding.");
  p.Define("model_dim", 512, "Model dimension: the embeddings' and the stack's.");
  p.Define("input_dropout_prob", 0.0, "Dropout on the embedded input.");
  p.Define("transformer_stack", EncoderStackParams(),
           "The encoder's TransformerStack (num_layers, mdl_dim, hidden_dim, num_atten_heads, "
           "transformer_layer_params_tpl, final_layer_norm; or Lingvo's MT names "
           "num_transformer_layers, transformer_tpl, ln_output, model_dim).");
  return p;
}

TransformerEncoder::TransformerEncoder(const glossa::Params& p) : BaseLayer(p) {
  model_dim_ = p.GetInt("model_dim");
  glossa::Params emb = p.GetParams("token_emb").Copy();
  if (emb.GetInt("embedding_dim") == 0) emb.Set("embedding_dim", model_dim_);
  glossa::Params pos = p.GetParams("position_emb").Copy();
  if (pos.GetInt("embedding_dim") == 0) pos.Set("embedding_dim", model_dim_);
  glossa::Params stack = p.GetParams("transformer_stack").Copy();
  const glossa::Params defaults = TransformerStack::Params();
  for (const auto& [lingvo, key] : {std::pair{"num_transformer_layers", "num_layers"},
                                    {"transformer_tpl", "transformer_layer_params_tpl"},
                                    {"ln_output", "final_layer_norm"},
                                    {"model_dim", "mdl_dim"}}) {
    if (stack.Contains(lingvo)) {
      const ParamValue v =
          ResolveLingvoAlias(stack, defaults, path() + ".transformer_stack", lingvo, key);
      stack.Delete(lingvo);
      stack.Set(key, v);
    }
  }
  stack.Set("input_dropout_prob", p.GetFloat("input_dropout_prob"));
  if (stack.GetInt("mdl_dim") == 0) stack.Set("mdl_dim", model_dim_);
  token_emb_ = CreateChild<EmbeddingLayer>("token_emb", emb);
  position_emb_ = CreateChild<PositionalEmbeddingLayer>("position_emb", pos);
  stack_ = CreateChild<TransformerStack>("transformer_stack", stack);
  CheckDim(*this, "token_emb.embedding_dim", emb.GetInt("embedding_dim"), "model_dim", model_dim_);
  CheckDim(*this, "position_emb.embedding_dim", pos.GetInt("embedding_dim"), "model_dim",
           model_dim_);
  CheckDim(*this, "transformer_stack's model dim", stack_->model_dim(), "model_dim", model_dim_);
}

NestedMap TransformerEncoder::FProp(const NestedMap& theta, const NestedMap& src) const {
  const at::Tensor& ids = src.GetTensor("ids");
  const at::Tensor paddings = src.GetTensor("paddings").to(at::kFloat);
  CheckIdsPaddings(*this, "src", ids, paddings);
  // Packed sources (src.segment_ids, src.segment_pos): positions restart per segment and
  // attention stays within a segment; the decoder's cross-attention reads the segment ids.
  const at::Tensor segment_ids = OptionalInput(src, "segment_ids");
  at::Tensor x =
      EmbedWithPositions(token_emb_, position_emb_, theta, ids, OptionalInput(src, "segment_pos"));
  x = stack_->FProp(stack_.Theta(theta), x, paddings, {}, {}, segment_ids);
  NestedMap out{{"encoded", x}, {"paddings", paddings}};
  if (segment_ids.defined()) out.Put("segment_ids", segment_ids);
  return out;
}

GLOSSA_REGISTER_CLASS(TransformerEncoder, "glossa.mt.encoder.TransformerEncoder");

}  // namespace mt
}  // namespace glossa
