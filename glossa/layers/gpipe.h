// GPipe pipelining (Lingvo's PipeliningLayer and GPipeTransformerStack). The cells (Blocks applied
// in order through FPropBlock) are split into stages; the batch is split into micro-batches
// along batch_dim; each stage runs on its own thread and passes micro-batch activations to the
// next stage over a Channel, so stages work on different micro-batches at the same time. The
// backward pass runs the same pipeline in reverse (gradients flow back over channels), recomputing
// each stage's forward from its saved input micro-batch (GPipe's re-materialization: only stage
// boundaries are kept between the passes).
//
// Randomness: micro-batch t runs with the overwrite global step global_step · num_micro_batches
// + t, and each cell starts from the step seed GenerateSeedFromName(cell path), so dropout masks
// differ per micro-batch and replay exactly in the backward pass. Accumulators count once per
// micro-batch (they are disabled while the backward recomputes).
//
//   auto p = GPipeTransformerStack::Params();
//   p.Set("name", "stack").Set("num_layers", 8).Set("mdl_dim", 64).Set("num_atten_heads", 4)
//    .Set("hidden_dim", 256).Set("splits", 4).Set("num_micro_batches", 4);
//   at::Tensor y = stack->FProp(stack->theta(), x /*[B, T, 64]*/, paddings /*[B, T]*/);
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

#include <vector>

#include "glossa/layers/base_layer.h"

namespace glossa {

// A Block itself: a pipeline can be a block of a SequentialLayer, say.
class PipeliningLayer : public BaseLayer, public Block {
 public:
  // + cell_tpl (list of cell Params), num_stages (0: one stage per cell; cells split evenly),
  // stage_ends (increasing cell end indices, the last = the cell count; overrides num_stages),
  // num_micro_batches (1), micro_batch_size (None: batch / num_micro_batches), batch_dim (0).
  static glossa::Params Params();
  explicit PipeliningLayer(const glossa::Params& p);

  // inputs: the batch along batch_dim; paddings ([B, T], or undefined) go to every cell, split
  // like the inputs. Cells must keep the activation's shape (the channels check it).
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs,
                   const at::Tensor& paddings = {}) const;
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor& paddings) const override {
    return FProp(theta, x, paddings);
  }

  int64_t num_stages() const { return static_cast<int64_t>(ends_.size()); }
  // Cell end index (exclusive) of each stage.
  const std::vector<int64_t>& stage_ends() const { return ends_; }

 private:
  std::vector<BaseLayer*> cells_;
  std::vector<const Block*> blocks_;
  std::vector<int64_t> cell_seeds_;
  std::vector<int64_t> ends_;
  int64_t num_micro_batches_, batch_dim_;
  std::optional<int64_t> micro_batch_size_;
};

// A stack of TransformerLayers pipelined over stages; its layers come from
// transformer_layer_params_tpl exactly as TransformerStack's do (TransformerStack::LayerParams).
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
