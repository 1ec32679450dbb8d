#include "glossa/tasks/mt/mt_common.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/transformer_stack.h"

namespace glossa {
namespace mt {

void CheckDim(const BaseLayer& layer, const char* key, int64_t value, const char* what,
              int64_t want) {
  if (value != want) {
    throw InvalidArgumentError(StrCat("layer '", layer.path(), "': ", key, " (", value,
                                      ") must equal ", what, " (", want, ")"));
  }
}

at::Tensor EmbedWithPositions(const Child<EmbeddingLayer>& emb,
                              const Child<PositionalEmbeddingLayer>& pos, const NestedMap& theta,
                              const at::Tensor& ids, const at::Tensor& segment_pos) {
  at::Tensor x = emb->FProp(emb.Theta(theta), ids);
  if (segment_pos.defined()) {
    if (segment_pos.sizes() != ids.sizes()) {
      throw InvalidArgumentError(StrCat("layer '", pos->path(), "': segment_pos must be shaped ",
                                        "like the ids ", ids.sizes(), ", got ",
                                        segment_pos.sizes()));
    }
    return x + pos->FPropWithPosition(pos.Theta(theta), segment_pos).to(x.scalar_type());
  }
  return x + pos->FProp(pos.Theta(theta), ids.size(1)).to(x.scalar_type());
}

void CheckIdsPaddings(const BaseLayer& layer, const char* what, const at::Tensor& ids,
                      const at::Tensor& paddings) {
  if (ids.dim() != 2 || !paddings.defined() || paddings.sizes() != ids.sizes()) {
    throw InvalidArgumentError(StrCat("layer '", layer.path(), "': ", what,
                                      ".ids and ", what, ".paddings must both be [B, T], got ",
                                      ids.sizes(), " and ",
                                      paddings.defined() ? StrCat(paddings.sizes()) : "none"));
  }
}

void DefineLingvoAlias(glossa::Params& p, const char* lingvo, const char* glossa_key) {
  p.Define(lingvo, nullptr, StrCat("Lingvo's name for ", glossa_key, " (None: use ", glossa_key,
                                   ")."));
}

ParamValue ResolveLingvoAlias(const glossa::Params& p, const glossa::Params& defaults,
                              const std::string& where, const char* lingvo,
                              const char* glossa_key) {
  const ParamValue& v = p.Get(lingvo);
  if (v.is_none()) return p.Get(glossa_key);
  if (!(p.Get(glossa_key) == defaults.Get(glossa_key))) {
    throw InvalidArgumentError(StrCat(where, ": both ", lingvo, " (Lingvo's name) and ", glossa_key,
                                      " are set; set one"));
  }
  return v;
}

glossa::Params EncoderStackParams() {
  glossa::Params p = TransformerStack::Params();
  DefineLingvoAlias(p, "num_transformer_layers", "num_layers");
  DefineLingvoAlias(p, "transformer_tpl", "transformer_layer_params_tpl");
  DefineLingvoAlias(p, "ln_output", "final_layer_norm");
  DefineLingvoAlias(p, "model_dim", "mdl_dim");
  return p;
}

}  // namespace mt
}  // namespace glossa
