#include "glossa/layers/gpipe_transformer.h"

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/flops.h"
#include "glossa/layers/transformer_stack.h"

namespace glossa {

namespace {

glossa::Params ExpandTransformerStack(const glossa::Params& p) {
  glossa::Params out = p.Copy();
  const std::string where = StrCat("GPipeTransformerStack '", p.GetString("name"), "'");
  const int64_t n = p.GetInt("num_layers");
  if (n <= 0) throw InvalidArgumentError(StrCat(where, ": num_layers must be > 0"));
  if (p.GetBool("has_aux_atten")) {
    throw InvalidArgumentError(StrCat(where, ": pipeline cells take no cross-attention inputs "
                                             "(has_aux_atten must be False)"));
  }
  const std::vector<glossa::Params> layers = TransformerStack::LayerParams(p);
  out.Set("cell_tpl", ParamValue::List(layers.begin(), layers.end()));
  ParamValue::List ends;
  for (int64_t e : StageEndsOf(where, p.Get("splits"), layers)) ends.push_back(ParamValue(e));
  out.Set("stage_ends", ends);
  return out;
}

}  // namespace

glossa::Params GPipeTransformerStack::Params() {
  glossa::Params p = PipeliningLayer::Params();
  p.Set("cls", ClsOf<GPipeTransformerStack>());
  TransformerStack::DefineLayerFields(p);
  p.Define("splits", 1,
           "Stages: an int (that many, balanced by the layers' declared FLOPs per token, "
           "glossa/layers/flops.h) or a list of increasing layer end indices whose last is "
           "num_layers.");
  return p;
}

GPipeTransformerStack::GPipeTransformerStack(const glossa::Params& p)
    : PipeliningLayer(ExpandTransformerStack(p)) {}

GLOSSA_REGISTER_CLASS(GPipeTransformerStack, "glossa.layers.GPipeTransformerStack");

}  // namespace glossa
