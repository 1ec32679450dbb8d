// Batch-major multi-headed attention (Lingvo's batch_major_attention.MultiHeadedAttention):
// projections to [B, T, N, H], per-dim-scaled dot products, key paddings and causal masking,
// attention dropout, and incremental decoding with cached keys and values.
//
//   auto [out, probs] = atten->FProp(theta, x, x, x, paddings, /*causal=*/true);   // self
//   auto [out2, probs2] = atten->FProp(theta, q, enc, enc, enc_paddings);          // cross
//   NestedMap cache = atten->InitStates(batch, dtype);
//   auto [y, cache2] = atten->ExtendStep(theta, x_t, cache);  // one decoding step
#pragma once

#include <tuple>
#include <utility>

#include "glossa/layers/attention_projection.h"
#include "glossa/layers/base_layer.h"
#include "glossa/layers/step_layer.h"
#include "glossa/layers/dropout.h"

namespace glossa {

class MultiHeadedAttention : public BaseLayer, public StepLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, query, key, value, paddings=None,
  // causal=None, segment_ids=None, source_segment_ids=None) -> (context, probs).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + input_dim, hidden_dim (0: input_dim), num_heads, atten_dropout_prob, enable_per_dim_scale
  // (True; otherwise queries scale by 1/sqrt(dim_per_head)), use_bias (True).
  static glossa::Params Params();
  explicit MultiHeadedAttention(const glossa::Params& p);

  // query [B, T, D], key/value [B, S, D], paddings [B, S] (1 = padded key). With `causal`, query t
  // attends only to keys s <= t (T == S). Packed inputs (Lingvo's segment mask): segment_ids
  // [B, T] of the queries and source_segment_ids [B, S] of the keys (default: segment_ids, for
  // self-attention), integers; a query attends only to keys of its own segment, and a query in
  // segment 0 (the padding) is not masked by the key paddings (it sees its row's padding).
  // Returns (encoded [B, T, D], probs [B, N, T, S]).
  std::pair<at::Tensor, at::Tensor> FProp(const NestedMap& theta, const at::Tensor& query,
                                          const at::Tensor& key, const at::Tensor& value,
                                          const at::Tensor& paddings = {}, bool causal = false,
                                          const at::Tensor& segment_ids = {},
                                          const at::Tensor& source_segment_ids = {}) const;

  // Cross-attention against a fixed source (decoding): the source's keys and values projected
  // once, {key, value} [B, S, N, H], then queries [B, T, D] attend to them (paddings [B, S]).
  NestedMap ProjectSource(const NestedMap& theta, const at::Tensor& source) const;
  std::pair<at::Tensor, at::Tensor> FPropProjected(const NestedMap& theta, const at::Tensor& query,
                                                   const NestedMap& source,
                                                   const at::Tensor& paddings = {}) const;

  // An empty cache of B hypotheses: {unordered: {key, value} [B, C, N, H] (preallocated, written
  // in place one step column at a time; C grows by doubling), rows [B, C] int64 (the slot of each
  // step's key and value, as a beam search reorders it), length [B] int64 (the steps so far)}.
  // Beam search reorders rows and length, never the caches (GatherStates skips "unordered"), and
  // the step's attention reads through rows (glossa/kernels/step_attention.h). For decoding: no
  // gradient flows through the cached keys and values, and the states a step returns are valid
  // until ExtendStep is called again on the states they came from.
  NestedMap InitStates(int64_t batch_size, at::ScalarType dtype) const override;
  static constexpr int64_t kInitialCacheSteps = 16;
  // StepLayer: ExtendStep below with context.paddings (optional).
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& query,
                                              const NestedMap& cached_states,
                                              const NestedMap& context) const override;
  // One decoding step of causal self-attention: query [B, D] attends to every cached step and
  // itself. `paddings` (optional) [B, S+1] covers the cached steps and this one. Returns
  // (encoded [B, D], cache with this step's key and value appended).
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& query,
                                              const NestedMap& cached_states,
                                              const at::Tensor& paddings = {}) const;

  int64_t num_heads() const { return num_heads_; }
  int64_t dim_per_head() const { return dim_per_head_; }

  // The caches of a step of n hypotheses (validated, grown to hold column `step`, the row table's
  // column `step` set to each row's own slot) and the states after it.
  struct StepCaches {
    at::Tensor key, value, rows, length;
    int64_t step = 0;
  };
  StepCaches PrepareStep(const NestedMap& cached_states, int64_t n, at::ScalarType dtype) const;
  static NestedMap StatesAfterStep(const StepCaches& c);
  // The decoding states' layout ({unordered: {key, value}, rows, length}) of these tensors: what
  // InitStates and a step give, and what glossa/layers/step_states.h rebuilds.
  static NestedMap MakeStates(const at::Tensor& key, const at::Tensor& value,
                              const at::Tensor& rows, const at::Tensor& length);
  // The inference plan's Q, K and V in one matrix [D, 3·N·H] (glossa/kernels/compute_plan.h),
  // under "qkv", for self-attention's one GEMM; the projections prepare their own weights.
  void PrepareWeights(const NestedMap& theta, ComputePlan& plan) const override;

 private:
  friend class OnnxExport;         // the ONNX export (glossa/layers/onnx_export.cc)
  friend class TorchScriptExport;  // the TorchScript export (glossa/layers/torchscript_export.cc)
  friend class FusedStepBuilder;  // the fused decoding step (glossa/layers/fused_step.cc)
  // InvalidArgument naming the shapes unless both are undefined or integer [b, t] and [b, s].
  void CheckSegmentIds(const at::Tensor& query_segments, const at::Tensor& key_segments,
                       int64_t b, int64_t t, int64_t s) const;
  // q [..., H] times the per-dim scale (or 1/sqrt(H)).
  at::Tensor ScaleQuery(const NestedMap& theta, const at::Tensor& q) const;
  // The scale ScaleQuery multiplies float32 q [B, T, N, H] by, as a float32 [H] vector for the
  // attention core to apply as it reads q (AttentionCore's query_scale); undefined where q is
  // not float32 or the heads are split over a mesh axis (then ScaleQuery).
  at::Tensor QueryScaleVector(const NestedMap& theta, const at::Tensor& q) const;
  // qkv: where q, k and v are its slices (self-attention's fused projection), for the core to
  // take whole (AttentionCoreQkv).
  std::pair<at::Tensor, at::Tensor> Attend(const NestedMap& theta, at::Tensor q,
                                           const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& key_mask, bool causal = false,
                                           const at::Tensor& qkv = {}) const;

  // Self-attention's query, key and value projections as one GEMM: [x·Wq | x·Wk | x·Wv] with the
  // weights (and biases) concatenated, [B, T, 3, N, H] (q, k and v: its slices along dim 2).
  at::Tensor ProjectQkv(const NestedMap& theta, const at::Tensor& x) const;

  int64_t input_dim_, hidden_dim_, num_heads_, dim_per_head_;
  bool per_dim_scale_;
  bool use_bias_;
  bool causal_blocks_;  // params: causal_blocks
  bool fuse_qkv_;  // the projections are MultiHeadedProjectionLayers (not a subclass)
  bool atten_dropout_active_;  // else the strided attention core may run (attention.cc)
  Child<MultiHeadedProjectionLayer> query_, key_, value_, post_;
  Child<PerDimScaleLayer> per_dim_scale_layer_;
  Child<DropoutLayer> atten_dropout_;
  // The axis the heads are split over (weight_split_dims_mapping); num_heads_ is then this
  // rank's.
  MeshAxis* axis_ = nullptr;
};

}  // namespace glossa
