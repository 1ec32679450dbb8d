// GPipeTransformerStack (Lingvo's): a stack of TransformerLayers pipelined over stages
// (gpipe.h); its layers come from transformer_layer_params_tpl exactly as TransformerStack's do
// (TransformerStack::LayerParams).
//
//   auto p = GPipeTransformerStack::Params();
//   p.Set("name", "stack").Set("num_layers", 8).Set("mdl_dim", 64).Set("num_atten_heads", 4)
//    .Set("hidden_dim", 256).Set("splits", 4).Set("num_micro_batches", 4);
//   at::Tensor y = stack->FProp(stack->theta(), x /*[B, T, 64]*/, paddings /*[B, T]*/);
#pragma once

#include "glossa/layers/gpipe.h"

namespace glossa {

class GPipeTransformerStack : public PipeliningLayer {
 public:
  // + TransformerStack's layer fields (num_layers, mdl_dim, hidden_dim, num_atten_heads,
  // dropout_prob, mask_self_atten, transformer_layer_params_tpl), splits (an int: that many
  // stages with the layers split evenly; or a list of increasing end indices whose last is
  // num_layers), num_micro_batches, micro_batch_size, batch_dim.
  static glossa::Params Params();
  explicit GPipeTransformerStack(const glossa::Params& p);
};

}  // namespace glossa
