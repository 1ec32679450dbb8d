// GShard Mixture-of-Experts: Lingvo's Top-2 gating (Top2GatingOnLogits) and the sharded MoE
// feed-forward layer (TransformerShardedMoeLayer), with the aux-loss context that carries the
// load-balancing loss from the layer to the task.
//
//   Top2GatingOptions o;
//   o.expert_capacity_dim = 4;
//   Top2GatingOutput g = Top2GatingOnLogits(logits /*[G, S, E]*/, paddings /*[G, S] or {}*/, o);
//   // g.combine, g.dispatch: [G, S, E, C]; g.aux_loss: scalar
//
//   AuxLossContext aux;                        // collects every MoE layer's aux loss
//   at::Tensor y = moe->FProp(moe->theta(), x, paddings);
//   at::Tensor loss = task_loss + weight * aux.Sum();
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "glossa/layers/base_layer.h"

namespace glossa {

// Lingvo's AuxLossContext: while alive on this thread (innermost wins), layers add auxiliary
// losses with AuxLossContext::AddLoss; outside one, AddLoss does nothing.
class AuxLossContext {
 public:
  AuxLossContext();
  ~AuxLossContext();
  AuxLossContext(const AuxLossContext&) = delete;
  AuxLossContext& operator=(const AuxLossContext&) = delete;
  static AuxLossContext* Current();
  // Adds to the current context, if any.
  static void AddLoss(const at::Tensor& loss);
  const std::vector<at::Tensor>& losses() const { return losses_; }
  // Σ losses as a scalar: float64 when any loss is, else float32 (0 when none).
  at::Tensor Sum() const;

 private:
  std::vector<at::Tensor> losses_;
  AuxLossContext* previous_;
};

struct Top2GatingOptions {
  // Examples per group per expert (C). With capacity_factor > 0 it is raised to at least
  // int(S · capacity_factor / E) (4 when that is 0), rounded up to a multiple of 4.
  int64_t expert_capacity_dim = 0;
  std::optional<double> capacity_factor;
  // 'all' (greedy second expert), 'sampling' (Gumbel-max over the logits without the first
  // expert) or 'random' (keep the second expert when U < gate_2 / second_expert_threshold).
  std::string second_expert_policy = "all";
  double second_expert_threshold = 0.0;
  // True: gates normalized over the top 2 before capacity, density without importance (mtf);
  // False: renormalized after capacity, densities divided by the mean importance.
  bool legacy_mtf_behavior = true;
  // Output dtype of combine and dispatch.
  at::ScalarType fprop_dtype = at::kFloat;
  // [G, S] routing importance (1: route, 0 < w < 1: second expert only, 0: none); replaces the
  // paddings' role as in Lingvo.
  at::Tensor importance;
  // The uniform noise of 'sampling' ([G, S, E]) and 'random' ([G, S]). When undefined it is
  // drawn from the step seed pair (random_seed), so replaying the step replays the routing.
  at::Tensor sampling_uniform;
  at::Tensor random_uniform;
  std::optional<int64_t> random_seed;
};

struct Top2GatingOutput {
  at::Tensor aux_loss;  // scalar, computed before capacity is applied
  at::Tensor combine;   // [G, S, E, C] gate weights at (expert, position)
  at::Tensor dispatch;  // [G, S, E, C] combine != 0
  int64_t capacity = 0;
  // Fractions of first / second choices dropped for lack of capacity (also recorded in the
  // summary context as over_capacity_1_ratio / over_capacity_2_ratio).
  at::Tensor over_capacity_1_ratio, over_capacity_2_ratio;
};

// logits [G, S, E]; paddings [G, S] (1 = padded) or undefined. The computation runs in float64
// for float64 logits and in float32 otherwise; gradients flow to the logits through the gates and
// the aux loss. InvalidArgument for bad shapes, policies or a capacity of 0.
Top2GatingOutput Top2GatingOnLogits(const at::Tensor& logits, const at::Tensor& paddings,
                                    const Top2GatingOptions& options);

// Drop-in replacement of TransformerFeedForwardLayer (Lingvo's TransformerShardedMoeLayer):
// out = x + residual_weight · dropout(combine(experts(dispatch(norm(x))))), with tokens split into
// num_groups groups that route independently:
//   logits = GSM·ME, (aux, combine, dispatch) = Top2Gating(logits)
//   expert_in = einsum(GSEC,GSM->EGCM), h = act(einsum(EGCM,EMH->EGCH)) (GLU: act(f)·g),
//   expert_out = einsum(EGCH,EHM->EGCM), out = einsum(GSEC,GECM->GSM) · (1 - paddings).
// The aux loss goes to the current AuxLossContext.
class LayerNorm;
class DropoutLayer;
class MeshAxis;

class TransformerShardedMoeLayer : public BaseLayer, public Block {
 public:
  // + input_dim, output_dim (0: input_dim), hidden_dim, activation ('RELU'), use_glu,
  // residual_dropout_prob, relu_dropout_prob, pre_layer_norm (True), residual_weight (1.0),
  // num_experts, num_groups, expert_capacity_dim (0: from the factor), expert_capacity_factor
  // (1.5), second_expert_policy ('all'), ln_tpl (LayerNorm; input_dim set here), num_devices
  // (1; n > 1: GShard's expert parallelism, num_experts / n experts on each rank of the build
  // context's 'expert' axis, glossa/layers/mesh.h, tokens exchanged by all-to-all; built without
  // that axis, every expert in this process, each call routing num_groups / n groups as one rank
  // did in training: what eval, decode and export run from the same Params).
  static glossa::Params Params();
  explicit TransformerShardedMoeLayer(const glossa::Params& p);
  // inputs [B, T, M], paddings [B, T] (or undefined). B·T must be divisible by the group count
  // (`num_groups` > 0 overrides the params' value, e.g. 1 for one-token decoding steps).
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& inputs,
                   const at::Tensor& paddings = {}, int64_t num_groups = 0) const;
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor& paddings) const override {
    return FProp(theta, x, paddings);
  }
  // A decoding step's tokens route together, as one group.
  at::Tensor StepBlock(const NestedMap& theta, const at::Tensor& x) const override {
    return FProp(theta, x, {}, /*num_groups=*/1);
  }
  bool AddsAuxLoss() const override { return true; }

  // Built whole for a Params' num_devices > 1 without an 'expert' axis: that variable and axis.
  std::optional<UnmetMeshAxis> UnmetMesh() const override;

 private:
  at::Tensor Experts(const NestedMap& theta, const at::Tensor& x) const;
  at::Tensor LocalExperts(const NestedMap& theta, const at::Tensor& x) const;
  at::Tensor ShardedExperts(const NestedMap& theta, const at::Tensor& x) const;
  // The build context's 'expert' axis when num_devices > 1 and the mesh has one (this rank holds
  // its experts only), else null (every expert here).
  MeshAxis* expert_axis_ = nullptr;
  int64_t input_dim_, num_groups_, num_devices_ = 1;
  bool pre_layer_norm_, use_glu_;
  double residual_weight_;
  std::string activation_;
  Top2GatingOptions gating_options_;  // without the per-call fields
  Child<LayerNorm> ln_;
  Child<DropoutLayer> residual_dropout_, relu_dropout_;
};

}  // namespace glossa
