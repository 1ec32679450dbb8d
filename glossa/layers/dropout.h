// Dropout. DeterministicDropout draws its mask from a step seed pair (Lingvo's formula
// floor(keep_prob + U) · x / keep_prob), so replaying the seed replays the mask; DropoutLayer is
// plain (stateful) dropout and DeterministicDropoutLayer the seeded one. Neither drops in eval
// (unless dropout_at_eval) or in inference.
//
//   auto p = DeterministicDropoutLayer::Params();
//   p.Set("name", "drop").Set("keep_prob", 0.9);
//   at::Tensor y = layer->FProp(layer->theta(), x);
#pragma once

#include <array>
#include <optional>
#include <vector>

#include "glossa/layers/base_layer.h"

namespace glossa {

// Counter-based uniforms in [0, 1) (24-bit resolution): element k (row-major) of a tensor of shape
// `whole` is a hash of (seeds, k), so any block can be drawn alone and equals that block of the
// whole draw. Returns block [row0, row0 + rows) × [col0, col0 + cols) of dims 0 and 1 (the whole of
// the later dims); a `whole` of rank 1 has no dim 1 (col0 0, cols 1). Float32.
at::Tensor StatelessUniform(std::array<int64_t, 2> seeds, const std::vector<int64_t>& whole,
                            int64_t row0, int64_t rows, int64_t col0, int64_t cols);
// The block of `sizes` at `offsets` (one per dim of `whole`) of the same draw.
at::Tensor StatelessUniformBlock(std::array<int64_t, 2> seeds, const std::vector<int64_t>& whole,
                                 const std::vector<int64_t>& offsets,
                                 const std::vector<int64_t>& sizes);

// x is block `index` of `count` along `dim` of a tensor split over ranks.
struct DimBlock {
  int64_t dim = 0, index = 0, count = 1;
};

// (x / keep_prob) · floor(keep_prob + U), U ~ Uniform[0, 1) of `noise_shape` (default x's shape,
// broadcast against x) drawn from `seeds` (StatelessUniform). keep_prob must be in (0, 1]; 1
// returns x. Inside a BatchShardScope(i, n) (core/step_seed.h: x is block i of n of a batch along
// dim 0, and j of m along dim 1 when set) U is block i of the whole batch's draw, drawn alone,
// unless noise_shape broadcasts that dim. With `block`, x is that block of a tensor split over
// ranks (a model axis's heads or hidden units), and U that block of the whole tensor's draw.
at::Tensor DeterministicDropout(const at::Tensor& x, double keep_prob, std::array<int64_t, 2> seeds,
                                const std::optional<std::vector<int64_t>>& noise_shape = {},
                                const std::optional<DimBlock>& block = {});

class DropoutLayer : public BaseLayer, public Block {
 public:
  // + keep_prob, noise_shape, noise_shape_broadcast_dims, dropout_at_eval,
  // activation_split_dims_mapping.
  static glossa::Params Params();
  explicit DropoutLayer(const glossa::Params& p);
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& x) const;
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor&) const override {
    return FProp(theta, x);
  }
  double keep_prob() const { return keep_prob_; }
  // Whether FProp returns its input now (eval mode without dropout_at_eval, inference, or
  // keep_prob 1).
  bool IsIdentity() const;
  // Whether running the layer again under the same step seed draws the same mask (what RevNet's
  // backward replay and pipelined re-runs need): false for plain dropout.
  virtual bool ReplaysMasks() const { return false; }
  std::string ReplayHazard() const override {
    return !ReplaysMasks() && keep_prob_ < 1.0
               ? "plain dropout draws new masks when replayed; use DeterministicDropoutLayer"
               : "";
  }

 protected:
  // The mask-and-scale step; DeterministicDropoutLayer draws from the step seed pair.
  // `block`: where x sits in the whole tensor when its activation_split_dims_mapping splits it.
  virtual at::Tensor Dropout(const at::Tensor& x, double keep_prob,
                             const std::optional<std::vector<int64_t>>& noise_shape,
                             const std::optional<DimBlock>& block) const;

 private:
  std::optional<DimBlock> SplitBlock(const at::Tensor& x) const;
  MeshAxis* split_axis_ = nullptr;
  int64_t split_from_end_ = 0;
  // The context's 'model' axis: its ranks hold activations alike, which a mask drawn from each
  // process's generator would tell apart (plain Dropout refuses to run there).
  MeshAxis* model_axis_ = nullptr;
  double keep_prob_;
  bool dropout_at_eval_;
  std::optional<std::vector<int64_t>> noise_shape_;
  std::vector<int64_t> noise_shape_broadcast_dims_;
};

class DeterministicDropoutLayer : public DropoutLayer {
 public:
  static glossa::Params Params();
  explicit DeterministicDropoutLayer(const glossa::Params& p);
  bool ReplaysMasks() const override { return true; }

 protected:
  at::Tensor Dropout(const at::Tensor& x, double keep_prob,
                     const std::optional<std::vector<int64_t>>& noise_shape,
                     const std::optional<DimBlock>& block) const override;

 private:
  std::optional<int64_t> random_seed_;
};

// The dropout template `p.dropout_tpl` with keep_prob = 1 − p.<prob_key> (the Transformer
// layers' and stacks' dropout children, as Lingvo builds them).
glossa::Params DropoutParams(const glossa::Params& p, const char* prob_key);

}  // namespace glossa
