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
// Stages on ranks (GPipe across processes and hosts): built for a BuildContext whose 'pipe' axis
// has one rank per stage (glossa train --mesh=pipe:S), the pipeline builds only the
// cells of stage axis->index() (the others' variables live on their ranks: RemoteScopes) and runs
// that stage alone: micro-batch activations arrive from the previous rank and go to the next by
// the axis's send/recv (the cross-process form of Lingvo's Channel), their gradients travel back
// the same way, the last stage's output is broadcast to every rank and the first stage's input
// gradient likewise, so the layers around the pipeline run replicated on every rank. The same
// model in one process (no axis) builds every cell and runs the stages on threads: export,
// eval and decode read the ranks' checkpoint as one model.
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

class MeshAxis;

// Cell end indices (exclusive) of `stages` stages over `cells` cells, split as evenly as they go
// (the first stages take one more when they do not divide).
std::vector<int64_t> EvenStageEnds(int64_t cells, int64_t stages);
// Stage end indices from GPipe's `splits`: an int (that many stages, cells split evenly) or a
// list of increasing end indices whose last is `cells`; InvalidArgument naming `where` otherwise.
std::vector<int64_t> StageEndsFromSplits(const std::string& where, const ParamValue& splits,
                                         int64_t cells);

// Which cells of a pipeline with stage ends `ends` this process builds: every one (`axis`, the
// layer's build context's 'pipe' axis, null or of size 1), or on a pipe axis of one rank per
// stage, the cells of stage axis->index(). FailedPrecondition naming `where` when the axis has another size.
struct StagePlacement {
  MeshAxis* axis = nullptr;  // null: every stage in this process
  int64_t stage = 0, first = 0, end = 0;  // this rank's stage and its cells [first, end)
};
// `context`: the layer's build context (its 'pipe' axis). FailedPrecondition too for stages on
// threads of a process on a 'model' axis (their collectives would interleave).
StagePlacement PlaceStages(const std::string& where, const std::vector<int64_t>& ends,
                           const BuildContext& context);

// Lingvo's placement of what surrounds a pipeline over ranks (TransformerStack's
// place_ends_on_stages, on a 'pipe' axis): the axis, this rank's stage and the stage count. A null
// axis: every rank has the pipeline's input and output (one process, no pipeline, or the ends
// replicated).
struct PipelineEnds {
  MeshAxis* axis = nullptr;
  int64_t stage = 0, stages = 1;
  bool first() const { return stage == 0; }
  bool last() const { return stage + 1 == stages; }
};

// `cells` (a list of layer Params) with every unnamed entry named as CreateChildren would name it
// (<prefix>_<uid>), so that a stage's sublist builds its cells under their whole-pipeline names.
ParamValue::List NameCells(const ParamValue::List& cells, const std::string& prefix);


// The pipeline engine (PipeliningLayer and TransformerStack's splits): the cells this process
// holds, their blocks and seeds, the stages and the micro-batching.
struct PipelineCells {
  const BaseLayer* owner = nullptr;  // for its path in errors and channel names
  std::vector<BaseLayer*> cells;     // cells [placement.first, placement.end)
  std::vector<const Block*> blocks;
  std::vector<int64_t> seeds;        // GenerateSeedFromName(cell path)
  std::vector<int64_t> ends;         // every stage's cell end index
  StagePlacement placement;
  int64_t num_micro_batches = 1, batch_dim = 0;
  std::optional<int64_t> micro_batch_size;
  // Randomness of micro-batch t of m: false, Lingvo's GPipe (the overwrite global step
  // global_step · m + t); true, its rows of the masks the whole batch would draw
  // (BatchShardScope), so that pipelining leaves a stack's math as it was; a batch that
  // num_micro_batches does not divide then runs as the most micro-batches below it that do.
  bool masks_follow_rows = false;
  // On a pipe axis: false, the last stage's output and the first stage's input gradient are
  // broadcast to every rank (what feeds and reads the pipeline is replicated); true, Lingvo's
  // placement: they stay on those stages (where the embedding and the softmax live) and the
  // other ranks get zeros of their shapes (their input is not read).
  bool ends_on_stages = false;
};
// Runs x (and paddings, [B, T] or undefined) through the cells as a pipeline, with GPipe's
// backward (recompute from the stage inputs). `cells_theta`: the held cells' thetas, in order.
at::Tensor PipelineFProp(const PipelineCells& cells, const NestedValue& cells_theta,
                         const at::Tensor& x, const at::Tensor& paddings);

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

  int64_t num_stages() const { return static_cast<int64_t>(pipe_.ends.size()); }
  // Cell end index (exclusive) of each stage.
  const std::vector<int64_t>& stage_ends() const { return pipe_.ends; }
  // The cells this process holds (all, or on a pipe axis its stage's).
  const StagePlacement& placement() const { return pipe_.placement; }

 private:
  PipelineCells pipe_;
};

}  // namespace glossa
