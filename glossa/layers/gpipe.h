// GPipe pipelining (Lingvo's PipeliningLayer; GPipeTransformerStack is in gpipe_transformer.h). The cells (Blocks applied
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
//   auto p = PipeliningLayer::Params();
//   p.Set("name", "pipe").Set("cell_tpl", cells).Set("num_stages", 4).Set("num_micro_batches", 4);
//   at::Tensor y = pipe->FProp(pipe->theta(), x, paddings);
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

#include <vector>

#include "glossa/layers/base_layer.h"

namespace glossa {

// Cell end indices (exclusive) of `stages` stages over `cells` cells, split as evenly as they go
// (the first stages take one more when they do not divide).
std::vector<int64_t> EvenStageEnds(int64_t cells, int64_t stages);

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
  std::string ReplayHazard() const override {
    return "a pipeline's stage threads and recompute do not nest in a replaying container";
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

}  // namespace glossa
