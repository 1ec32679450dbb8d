#include "glossa/layers/moe.h"
#include "glossa/base/thread_state.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/activations.h"
#include "glossa/layers/dropout.h"
#include "glossa/layers/flops.h"
#include "glossa/layers/mesh.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/weight_init.h"
#include "glossa/summary/summary.h"

namespace glossa {

// ---- AuxLossContext ----

namespace {
thread_local AuxLossContext* current_aux_loss_context = nullptr;  // ThreadState: "aux_losses"
GLOSSA_THREAD_STATE_SLOT("aux_losses", current_aux_loss_context);
}  // namespace

AuxLossContext::AuxLossContext() : previous_(current_aux_loss_context) {
  current_aux_loss_context = this;
}

AuxLossContext::~AuxLossContext() { current_aux_loss_context = previous_; }

AuxLossContext* AuxLossContext::Current() { return current_aux_loss_context; }

void AuxLossContext::AddLoss(const at::Tensor& loss) {
  if (current_aux_loss_context != nullptr) current_aux_loss_context->losses_.push_back(loss);
}

at::Tensor AuxLossContext::Sum() const {
  at::ScalarType dtype = at::kFloat;
  for (const auto& l : losses_) {
    if (l.scalar_type() == at::kDouble) dtype = at::kDouble;
  }
  at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(dtype));
  for (const auto& l : losses_) sum = sum + l.to(dtype);
  return sum;
}

// ---- Top2GatingOnLogits ----

namespace {

at::Tensor OneHot(const at::Tensor& index, int64_t n, at::ScalarType dtype) {
  return at::one_hot(index, n).to(dtype);
}

// Exclusive cumulative sum over the group dim (1) of [G, S, E].
at::Tensor ExclusiveCumsum(const at::Tensor& x) { return at::cumsum(x, 1) - x; }

// Lingvo's over-capacity summary: choices at or past the capacity over max(1, choices).
at::Tensor OverCapacityRatio(const at::Tensor& mask, const at::Tensor& position, int64_t capacity) {
  at::Tensor over = (mask * position >= static_cast<double>(capacity)).to(at::kFloat).sum();
  return over / at::clamp_min(mask.sum().to(at::kFloat), 1.0);
}

at::Tensor Uniform(std::vector<int64_t> shape, at::ScalarType dtype,
                   const std::optional<int64_t>& random_seed) {
  at::Generator gen = MakeSeededGenerator(GenerateStepSeedPair(random_seed));
  return at::empty(shape, at::TensorOptions().dtype(dtype)).uniform_(0.0, 1.0, gen);
}

// Throws unless the logits are [G, S, E] with E >= 2, the optional [G, S] inputs and the
// sampling noise fit them, and the second expert policy is known.
void CheckTop2GatingInputs(const at::Tensor& logits_in, const at::Tensor& paddings,
                           const Top2GatingOptions& o) {
  if (logits_in.dim() != 3) {
    throw InvalidArgumentError(
        StrCat("Top2GatingOnLogits: logits must be [G, S, E], got rank ", logits_in.dim()));
  }
  const int64_t G = logits_in.size(0), S = logits_in.size(1), E = logits_in.size(2);
  if (E < 2) {
    throw InvalidArgumentError(StrCat("Top2GatingOnLogits: need at least 2 experts, got ", E));
  }
  auto check_gs = [&](const at::Tensor& t, const char* what) {
    if (t.defined() && (t.dim() != 2 || t.size(0) != G || t.size(1) != S)) {
      throw InvalidArgumentError(StrCat("Top2GatingOnLogits: ", what, " must be [", G, ", ", S,
                                        "], got ", ShapeString(t.sizes().vec())));
    }
  };
  check_gs(paddings, "paddings");
  check_gs(o.importance, "importance");
  check_gs(o.random_uniform, "random_uniform");
  if (o.sampling_uniform.defined() && o.sampling_uniform.sizes() != logits_in.sizes()) {
    throw InvalidArgumentError("Top2GatingOnLogits: sampling_uniform must have the logits' shape");
  }
  const std::string& policy = o.second_expert_policy;
  if (policy != "all" && policy != "sampling" && policy != "random") {
    throw InvalidArgumentError(StrCat("Top2GatingOnLogits: second_expert_policy must be all, ",
                                      "sampling or random, got '", policy, "'"));
  }
}

// The expert capacity C (expert_capacity_dim, raised by capacity_factor), recorded as the
// expert_capacity summary; throws when it is not positive.
int64_t CapacityOf(int64_t S, int64_t E, const Top2GatingOptions& o) {
  int64_t C = o.expert_capacity_dim;
  if (o.capacity_factor && *o.capacity_factor > 0) {
    int64_t auto_capacity = static_cast<int64_t>((S * *o.capacity_factor) / E);
    if (auto_capacity == 0) auto_capacity = 4;
    if (C < auto_capacity) {
      C = auto_capacity;
      while (C % 4 != 0) ++C;
    }
  }
  return C;
}

int64_t ExpertCapacity(int64_t S, int64_t E, const Top2GatingOptions& o) {
  const int64_t C = CapacityOf(S, E, o);
  if (C <= 0) {
    throw InvalidArgumentError(
        "Top2GatingOnLogits: expert_capacity_dim must be > 0 (or set capacity_factor)");
  }
  summary::Scalar("expert_capacity", static_cast<double>(C));
  return C;
}

// The routing of one Top2GatingOnLogits call, filled in step by step.
struct Top2Routing {
  at::ScalarType dt = at::kFloat;  // the gating dtype (float32 or float64)
  int64_t G = 0, S = 0, E = 0, C = 0;
  at::Tensor logits, raw_gates;
  at::Tensor index_1, mask_1, density_1_proxy, importance, gate_1, gates_without_top_1;
  at::Tensor index_2, mask_2, gate_2;
  at::Tensor position_in_expert_1, position_in_expert_2;  // [G, S, E], then [G, S] after capacity
  at::Tensor mask_1_flat, mask_2_flat;                     // [G, S]
};

// The first choice: each token's top expert masked by the importance (or the paddings), its
// gate, and the gates without it.
void ChooseFirstExpert(Top2Routing& r, const at::Tensor& paddings, const Top2GatingOptions& o) {
  r.raw_gates = at::softmax(r.logits, -1);
  r.index_1 = r.raw_gates.argmax(-1);
  r.mask_1 = OneHot(r.index_1, r.E, r.dt);
  r.density_1_proxy = r.raw_gates;
  if (o.importance.defined()) {
    const at::Tensor is_one = (o.importance == 1.0).to(r.dt).unsqueeze(-1);
    r.mask_1 = r.mask_1 * is_one;
    r.density_1_proxy = r.density_1_proxy * is_one;
    r.importance = o.importance.to(r.dt);
  } else {
    r.importance = at::ones({r.G, r.S}, r.logits.options());
    if (paddings.defined()) {
      const at::Tensor nonpaddings = 1.0 - paddings.to(r.dt);
      r.mask_1 = r.mask_1 * nonpaddings.unsqueeze(-1);
      r.density_1_proxy = r.density_1_proxy * nonpaddings.unsqueeze(-1);
      r.importance = nonpaddings;
    }
  }
  r.gate_1 = (r.raw_gates * r.mask_1).sum(-1);
  r.gates_without_top_1 = r.raw_gates * (1.0 - r.mask_1);
}

// The second choice: the best remaining expert ('sampling': Gumbel-max over the logits without
// the first), masked by the importance when paddings are given, and its gate.
void ChooseSecondExpert(Top2Routing& r, const at::Tensor& paddings, const Top2GatingOptions& o) {
  const at::ScalarType dt = r.dt;
  if (o.second_expert_policy == "sampling") {
    const at::Tensor u = o.sampling_uniform.defined() ? o.sampling_uniform.to(dt)
                                                      : Uniform({r.G, r.S, r.E}, dt, o.random_seed);
    const at::Tensor noise = -at::log(-at::log(u));
    const double very_negative = (dt == at::kDouble ? std::numeric_limits<double>::max()
                                                    : std::numeric_limits<float>::max()) *
                                 -0.7;
    const at::Tensor updated =
        at::where(r.mask_1 > 0.0, at::full({}, very_negative, dt), r.logits);
    r.index_2 = (updated + noise).argmax(-1);
  } else {
    r.index_2 = r.gates_without_top_1.argmax(-1);
  }
  r.mask_2 = OneHot(r.index_2, r.E, dt);
  // As in Lingvo, importance gates the second expert only when paddings are given.
  if (paddings.defined()) r.mask_2 = r.mask_2 * (r.importance > 0.0).to(dt).unsqueeze(-1);
  r.gate_2 = (r.gates_without_top_1 * r.mask_2).sum(-1);
}

// The load-balancing aux loss, before capacity: mean over experts of (fraction routed first) x
// (mean gate).
at::Tensor Top2AuxLoss(const Top2Routing& r, const Top2GatingOptions& o) {
  at::Tensor density_1 = r.mask_1.mean(1);
  at::Tensor proxy = r.density_1_proxy.mean(1);
  if (!o.legacy_mtf_behavior) {
    const at::Tensor denom = r.importance.mean(1).unsqueeze(1) + 1e-6;
    density_1 = density_1 / denom;
    proxy = proxy / denom;
  }
  return (proxy * density_1).mean() * static_cast<double>(r.E * r.E);
}

// Drops the choices at or past capacity C from mask and turns position into each token's slot
// ([G, S]); returns the over-capacity ratio.
at::Tensor DropOverCapacity(at::Tensor& mask, at::Tensor& position, int64_t C,
                            at::ScalarType dt) {
  const at::Tensor over = OverCapacityRatio(mask, position, C);
  mask = mask * (position < static_cast<double>(C)).to(dt);
  position = (position * mask).sum(-1);
  return over;
}

// 'random': keeps each second choice with probability gate_2 / second_expert_threshold.
void SampleSecondExpert(Top2Routing& r, const Top2GatingOptions& o) {
  const at::Tensor u = o.random_uniform.defined() ? o.random_uniform.to(r.dt)
                                                  : Uniform({r.G, r.S}, r.dt, o.random_seed);
  const at::Tensor sampled =
      (u < r.gate_2 / std::max(o.second_expert_threshold, 1e-9)).to(r.dt).detach();
  r.gate_2 = r.gate_2 * sampled;
  r.mask_2 = r.mask_2 * sampled.unsqueeze(-1);
}

// The [G, S, E, C] combine tensor: each choice's gate at its (expert, position).
at::Tensor CombineTensor(const Top2Routing& r) {
  auto part = [&](const at::Tensor& gate, const at::Tensor& flat, const at::Tensor& index,
                  const at::Tensor& position) {
    const at::Tensor a = (gate * flat).unsqueeze(-1) * OneHot(index, r.E, r.dt);  // [G, S, E]
    const at::Tensor b = OneHot(position.to(at::kLong), r.C, r.dt);              // [G, S, C]
    return a.unsqueeze(-1) * b.unsqueeze(2);                                     // [G, S, E, C]
  };
  return part(r.gate_1, r.mask_1_flat, r.index_1, r.position_in_expert_1) +
         part(r.gate_2, r.mask_2_flat, r.index_2, r.position_in_expert_2);
}

}  // namespace

Top2GatingOutput Top2GatingOnLogits(const at::Tensor& logits_in, const at::Tensor& paddings,
                                    const Top2GatingOptions& o) {
  CheckTop2GatingInputs(logits_in, paddings, o);
  Top2Routing r;
  r.G = logits_in.size(0);
  r.S = logits_in.size(1);
  r.E = logits_in.size(2);
  r.dt = logits_in.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  r.logits = logits_in.to(r.dt);
  r.C = ExpertCapacity(r.S, r.E, o);

  ChooseFirstExpert(r, paddings, o);
  ChooseSecondExpert(r, paddings, o);
  if (o.legacy_mtf_behavior) {
    const at::Tensor denom = r.gate_1 + r.gate_2 + 1e-9;
    r.gate_1 = r.gate_1 / denom;
    r.gate_2 = r.gate_2 / denom;
  }

  r.position_in_expert_1 = ExclusiveCumsum(r.mask_1);
  const at::Tensor aux_loss = Top2AuxLoss(r, o);
  const at::Tensor over_1 = DropOverCapacity(r.mask_1, r.position_in_expert_1, r.C, r.dt);
  const at::Tensor mask_1_count = r.mask_1.sum(1);  // [G, E]
  r.mask_1_flat = r.mask_1.sum(-1);                 // [G, S]

  if (o.second_expert_policy == "random") SampleSecondExpert(r, o);
  // Second choices queue behind every first choice of the same expert.
  r.position_in_expert_2 = ExclusiveCumsum(r.mask_2) + mask_1_count.unsqueeze(1);
  const at::Tensor over_2 = DropOverCapacity(r.mask_2, r.position_in_expert_2, r.C, r.dt);
  r.mask_2_flat = r.mask_2.sum(-1);

  r.gate_1 = r.gate_1 * r.mask_1_flat;
  r.gate_2 = r.gate_2 * r.mask_2_flat;
  if (!o.legacy_mtf_behavior) {
    at::Tensor denom = r.gate_1 + r.gate_2;
    denom = at::where(denom > 0.0, denom, at::ones_like(denom));
    r.gate_1 = r.gate_1 / denom;
    r.gate_2 = r.gate_2 / denom;
  }
  const at::Tensor combine = CombineTensor(r);

  summary::Scalar("over_capacity_1_ratio", over_1);
  summary::Scalar("over_capacity_2_ratio", over_2);
  Top2GatingOutput out;
  out.aux_loss = aux_loss;
  out.combine = combine.to(o.fprop_dtype);
  out.dispatch = (combine != 0.0).to(o.fprop_dtype);
  out.capacity = r.C;
  out.over_capacity_1_ratio = over_1;
  out.over_capacity_2_ratio = over_2;
  return out;
}

// ---- TransformerShardedMoeLayer ----

glossa::Params TransformerShardedMoeLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerShardedMoeLayer>());
  p.Define("input_dim", 0, "Dimension of the layer input.");
  p.Define("output_dim", 0, "Dimension of the layer output (0: input_dim).");
  p.Define("hidden_dim", 0, "Hidden dimension of each expert.");
  p.Define("activation", "RELU", "Non-linearity.");
  p.Define("use_glu", false, "Gated linear unit: wi is [E, M, 2H], h = act(f) * g.");
  p.Define("residual_dropout_prob", 0.0, "Dropout on the layer's output before the residual.");
  p.Define("relu_dropout_prob", 0.0, "Dropout on the experts' hidden activations.");
  p.Define("pre_layer_norm", true, "Layer norm before routing (else after the residual sum).");
  p.Define("residual_weight", 1.0, "out = x + residual_weight * moe(x).");
  p.Define("num_experts", 0, "Number of experts.");
  p.Define("num_groups", 1,
           "Groups the B*T tokens are split into; each group routes independently. With "
           "num_devices > 1, the groups of all ranks together (each rank routes num_groups / "
           "num_devices of its own tokens), as in Lingvo.");
  p.Define("expert_capacity_dim", 0, "Examples per group per expert; 0: from the factor.");
  p.Define("expert_capacity_factor", 1.5,
           "Capacity over the uniform share (x2 for the two choices) when expert_capacity_dim "
           "is 0.");
  p.Define("second_expert_policy", "all", "How to pick the second expert: all, sampling, random.");
  p.Define("num_devices", 1,
           "GShard's expert sharding: > 1 spreads the experts over this many ranks of the mesh's "
           "'expert' axis (glossa/layers/mesh.h), num_experts / num_devices on each, and tokens "
           "travel to their experts' ranks and back by all-to-all. 1: every expert here.");
  p.Define("ln_tpl", LayerNorm::Params(), "Layer norm params (input_dim is set by this layer).");
  p.Define("dropout_tpl", DeterministicDropoutLayer::Params(),
           "Params of the relu and residual dropouts (keep_prob is set from the *_prob fields).");
  return p;
}

TransformerShardedMoeLayer::TransformerShardedMoeLayer(const glossa::Params& p) : BaseLayer(p) {
  const int64_t m = params().GetInt("input_dim"), h = params().GetInt("hidden_dim");
  const int64_t out = params().GetInt("output_dim") > 0 ? params().GetInt("output_dim") : m;
  const int64_t e = params().GetInt("num_experts");
  auto fail = [&](const std::string& what) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': ", what));
  };
  if (m <= 0 || h <= 0) fail("input_dim and hidden_dim must be > 0");
  if (e < 2) fail(StrCat("num_experts must be >= 2, got ", e));
  if (params().GetInt("num_groups") <= 0) fail("num_groups must be > 0");
  if (params().GetInt("expert_capacity_dim") <= 0 &&
      params().GetFloat("expert_capacity_factor") < 1.0) {
    fail("set expert_capacity_dim > 0 or expert_capacity_factor >= 1");
  }
  if (out != m) fail("output_dim must equal input_dim (the residual connection)");
  const int64_t devices = params().GetInt("num_devices");
  if (devices < 1 || e % devices != 0 || params().GetInt("num_groups") % devices != 0) {
    fail(StrCat("num_devices must be >= 1 and divide num_experts (", e, ") and num_groups (",
                params().GetInt("num_groups"), "), got ", devices));
  }
  const std::string policy = params().GetString("second_expert_policy");
  if (policy != "all" && policy != "sampling" && policy != "random") {
    fail(StrCat("second_expert_policy must be all, sampling or random, got '", policy, "'"));
  }
  CheckActivation(params().GetString("activation"), path());
  // Lingvo's initialization: uniform with scale sqrt(3 / fan_in).
  const double gate_scale = std::sqrt(3.0 / static_cast<double>(m));
  const DType dtype = params().Get("dtype").AsDType();
  CreateVariable("gate", WeightParams({m, e}, WeightInit::Uniform(gate_scale), dtype));
  const int64_t wi_out = params().GetBool("use_glu") ? 2 * h : h;
  // With the build context's 'expert' axis, this rank's experts: block `index` of the whole
  // initialization. Without it (one process: eval, decode, export), every expert.
  num_devices_ = devices;
  expert_axis_ = devices > 1 ? build_context().axis("expert") : nullptr;
  if (expert_axis_ != nullptr && expert_axis_->size() != devices) {
    throw FailedPreconditionError(StrCat(
        "layer '", path(), "': num_devices = ", devices, " needs a mesh with an 'expert' axis of ",
        devices, " ranks, but the axis has ", expert_axis_->size(), ": train it on ", devices,
        " ranks (glossa train --nproc_per_node=", devices, "), or set num_devices to ",
        expert_axis_->size()));
  }
  const int64_t local = expert_axis_ != nullptr ? e / devices : e;
  for (const auto& [name, shape, scale] :
       {std::tuple<const char*, std::vector<int64_t>, double>{"wi", {local, m, wi_out}, gate_scale},
        {"wo", {local, h, out}, std::sqrt(3.0 / static_cast<double>(h))}}) {
    WeightParams wp(shape, WeightInit::Uniform(scale), dtype);
    if (expert_axis_ != nullptr) {
      wp.collections.push_back(kExpertShardedCollection);
      wp.shard_index = expert_axis_->index();
      wp.shard_count = devices;
    }
    CreateVariable(name, wp);
  }
  ln_ = CreateChild<LayerNorm>("layer_norm", params().GetParams("ln_tpl").Copy().Set("input_dim", m));
  residual_dropout_ = CreateChild<DropoutLayer>(
      "residual_dropout", params().GetParams("dropout_tpl").Copy().Set(
                              "keep_prob", 1.0 - params().GetFloat("residual_dropout_prob")));
  relu_dropout_ = CreateChild<DropoutLayer>(
      "relu_dropout", params().GetParams("dropout_tpl").Copy().Set(
                          "keep_prob", 1.0 - params().GetFloat("relu_dropout_prob")));
  input_dim_ = m;
  num_groups_ = params().GetInt("num_groups");
  pre_layer_norm_ = params().GetBool("pre_layer_norm");
  use_glu_ = params().GetBool("use_glu");
  residual_weight_ = params().GetFloat("residual_weight");
  activation_ = params().GetString("activation");
  gating_options_.expert_capacity_dim = params().GetInt("expert_capacity_dim");
  if (gating_options_.expert_capacity_dim <= 0) {
    gating_options_.capacity_factor = 2.0 * params().GetFloat("expert_capacity_factor");
  }
  gating_options_.second_expert_policy = policy;
  gating_options_.legacy_mtf_behavior = true;
  const ParamValue& seed = params().Get("random_seed");
  if (!seed.is_none()) gating_options_.random_seed = seed.AsInt();
}

at::Tensor TransformerShardedMoeLayer::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                             const at::Tensor& paddings, int64_t num_groups) const {
  const int64_t m = input_dim_;
  if (inputs.dim() != 3 || inputs.size(2) != m) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': inputs must be [B, T, ", m, "], got ",
                                      ShapeString(inputs.sizes().vec())));
  }
  const int64_t b = inputs.size(0), t = inputs.size(1);
  if (paddings.defined() &&
      (paddings.dim() != 2 || paddings.size(0) != b || paddings.size(1) != t)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': paddings must be [", b, ", ", t, "]"));
  }
  // num_groups is global, as in Lingvo: each of num_devices ranks routes its share of them.
  const int64_t g = num_groups > 0 ? num_groups : num_groups_ / num_devices_;
  if ((b * t) % g != 0) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': ", b * t, " tokens do not split into ", g, " groups"));
  }
  const int64_t s = b * t / g;
  const at::Tensor x = CastToFPropDtype(inputs);
  const at::Tensor normalized = pre_layer_norm_ ? ln_->FProp(ln_.Theta(theta), x) : x;
  const at::Tensor gsm = normalized.reshape({g, s, m});
  // Gating in float32 for float32/bfloat16/half activations (Lingvo's ComputeGating with
  // fprop_dtype float32), float64 for float64.
  const at::ScalarType gating_dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor gs_paddings =
      paddings.defined() ? paddings.reshape({g, s}).to(gating_dtype) : at::Tensor();

  const at::Tensor logits =
      at::einsum("gsm,me->gse", {gsm.to(gating_dtype), theta.GetTensor("gate").to(gating_dtype)});
  Top2GatingOptions o = gating_options_;
  o.fprop_dtype = x.scalar_type();
  if (expert_axis_ != nullptr && o.capacity_factor) {
    // The all-to-all needs one capacity on every rank, but each rank's batch has its own padded
    // length: the capacity of the longest group over the ranks (each rank sends its length to all).
    MeshAxis& axis = *expert_axis_;
    const at::Tensor lengths = axis.ExchangeBlocks(at::full({axis.size()}, s, at::kLong));
    o.expert_capacity_dim = std::max(
        o.expert_capacity_dim,
        CapacityOf(lengths.max().item<int64_t>(), theta.GetTensor("gate").size(1), o));
  }
  Top2GatingOutput gating;
  {
    SummaryNameScope scope(path());
    gating = Top2GatingOnLogits(logits, gs_paddings, o);
  }

  const at::Tensor expert_inputs = at::einsum("gsec,gsm->egcm", {gating.dispatch, gsm});
  const at::Tensor expert_outputs = expert_axis_ != nullptr
                                        ? ShardedExperts(theta, expert_inputs)
                                        : LocalExperts(theta, expert_inputs).permute({1, 0, 2, 3});
  at::Tensor combined =
      at::einsum("gsec,gecm->gsm", {gating.combine, expert_outputs}).reshape({b, t, m});
  if (paddings.defined())
    combined = combined * (1.0 - paddings.to(combined.scalar_type())).unsqueeze(-1);
  combined = residual_dropout_->FProp(residual_dropout_.Theta(theta), combined);
  at::Tensor out = x + combined * residual_weight_;
  if (!pre_layer_norm_) out = ln_->FProp(ln_.Theta(theta), out);
  AuxLossContext::AddLoss(gating.aux_loss);
  return out;
}

// [E, G, C, M] → [E, G, C, M] through this rank's experts.
at::Tensor TransformerShardedMoeLayer::Experts(const NestedMap& theta, const at::Tensor& x) const {
  at::Tensor hidden = at::einsum("egcm,emh->egch", {x, theta.GetTensor("wi")});
  if (use_glu_) {
    auto halves = hidden.chunk(2, -1);
    hidden = Activate(activation_, halves[0]) * halves[1];
  } else {
    hidden = Activate(activation_, hidden);
  }
  hidden = relu_dropout_->FProp(relu_dropout_.Theta(theta), hidden);
  return at::einsum("egch,ehm->egcm", {hidden, theta.GetTensor("wo")});
}

// Every expert here. The activations are [E, G, C, H], the batch's rows along the groups (dim 1):
// a shard of the rows (a pipeline's micro-batch) draws its block of the groups of the whole
// batch's masks, so that micro-batching leaves the math as it was.
at::Tensor TransformerShardedMoeLayer::LocalExperts(const NestedMap& theta,
                                                    const at::Tensor& x) const {
  const BatchShard rows = CurrentBatchShard();
  if (rows.count == 1 || rows.count1 != 1) return Experts(theta, x);
  BatchShardScope groups(0, 1, rows.index, rows.count);
  return Experts(theta, x);
}

// GShard's expert parallelism: [E, G, C, M] of this rank's groups → the all-to-all hands rank i
// the slots of its E/n experts from every rank ([E/n, n·G, C, M]) → its experts → the all-to-all
// back → [G, E, C, M] for this rank's groups, every expert's outputs.
std::optional<BaseLayer::UnmetMeshAxis> TransformerShardedMoeLayer::UnmetMesh() const {
  if (num_devices_ <= 1 || expert_axis_ != nullptr) return std::nullopt;
  return UnmetMeshAxis{StrCat(scope(), "/wi"), "expert", num_devices_};
}

at::Tensor TransformerShardedMoeLayer::ShardedExperts(const NestedMap& theta,
                                                      const at::Tensor& x) const {
  MeshAxis* axis = expert_axis_;
  const int64_t n = num_devices_, e = x.size(0), g = x.size(1), c = x.size(2), m = x.size(3);
  const int64_t local = e / n;
  const at::Tensor mine = AllToAll(*axis, x)  // [n (from rank i), E/n, G, C, M]
                              .view({n, local, g, c, m})
                              .permute({1, 0, 2, 3, 4})
                              .reshape({local, n * g, c, m});
  // Row blocks of [E, G, C, M] are experts here: this rank's block of the one-process draw.
  // On a data × expert mesh (the trainer's rows: rank d·n + e of D·n) the groups here are data
  // replica d's, block d of the one process's groups; in a pipeline's micro-batch t of m, rank
  // i's are block (d·n + i)·m + t of D·n·m, one block per rank.
  const BatchShard rows = CurrentBatchShard();
  const int64_t mb = rows.micro_count, outer = rows.index / mb, outers = rows.count / mb;
  const int64_t replicas = outers % n == 0 ? outers / n : 1, d = replicas > 1 ? outer / n : 0;
  at::Tensor hidden;
  if (mb == 1 || outers % n != 0) {
    BatchShardScope experts(axis->index(), n, d, replicas);
    hidden = Experts(theta, mine);
  } else {
    // Each rank's block draws from the step seed one call would (the draws are the blocks of
    // one whole-tensor draw), and the seed moves on as after one call.
    const int64_t seed = GetStepSeed();
    int64_t after = seed;
    std::vector<at::Tensor> parts;
    for (int64_t i = 0; i < n; ++i) {
      ResetStepSeed(seed);
      BatchShardScope experts(axis->index(), n, (d * n + i) * mb + rows.micro, replicas * n * mb);
      parts.push_back(Experts(theta, mine.narrow(1, i * g, g)));
      after = GetStepSeed();
    }
    ResetStepSeed(after);
    hidden = at::cat(parts, 1);
  }
  const at::Tensor out = hidden.view({local, n, g, c, m}).permute({1, 0, 2, 3, 4});
  return AllToAll(*axis, out.contiguous().view({e, g, c, m})).permute({1, 0, 2, 3});
}

GLOSSA_REGISTER_CLASS(TransformerShardedMoeLayer, "glossa.layers.TransformerShardedMoeLayer");

// Declared FLOPs per token (flops.h): the gate, and the top-2 experts' two projections.
[[maybe_unused]] static const bool kDeclaredFlops = RegisterDeclaredFlops(
    "glossa.layers.TransformerShardedMoeLayer", [](const glossa::Params& p) -> std::optional<double> {
      const double m = p.GetInt("input_dim"), h = p.GetInt("hidden_dim");
      return 2.0 * m * p.GetInt("num_experts") +
             2 * (2.0 * m * h * (p.GetBool("use_glu") ? 2 : 1) + 2.0 * h * m);
    });

}  // namespace glossa
