#include "glossa/layers/attention.h"
#include "glossa/layers/attention_mask.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <typeinfo>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/dropout.h"
#include "glossa/kernels/attention_core.h"
#include "glossa/kernels/step_attention.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/compute_plan.h"

namespace glossa {

glossa::Params MultiHeadedAttention::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<MultiHeadedAttention>());
  p.Define("input_dim", 0, "Number of key nodes.");
  p.Define("hidden_dim", 0, "Number of hidden nodes; 0 means input_dim.");
  p.Define("num_heads", 1, "Number of attention heads.");
  p.Define("atten_dropout_prob", 0.0,
           "Probability at which we apply dropout to the attention weights.");
  p.Define("enable_per_dim_scale", true,
           "Whether to use a learned per-dim scale on the queries (else 1/sqrt(dim_per_head)).");
  p.Define("use_bias", true, "Whether to use bias in the projections.");
  p.Define("causal_blocks", true,
           "Causal self-attention in blocks of queries, skipping the blocks of keys that every "
           "query of a block has masked (the strided core, T >= 64: about a third of the "
           "attention's GEMM work). The same results up to float32 rounding: BLAS groups the "
           "sums of the shorter products differently.");
  p.Define("proj_tpl", MultiHeadedProjectionLayer::Params(),
           "Params of the query, key, value and post projections (input_dim, num_heads, "
           "dim_per_head, use_bias and is_output_projection are set by this layer).");
  p.Define("dropout_tpl", DeterministicDropoutLayer::Params(),
           "Params of the attention-weight dropout (keep_prob is set from atten_dropout_prob).");
  p.Define("weight_split_dims_mapping", nullptr,
           "Tensor parallelism: the projections' weight_split_dims_mapping ([None, \"model\", "
           "None]: the heads split over the 'model' axis, each rank attending with its own; the "
           "output projection sums them: one all-reduce per layer). None: replicated.");
  return p;
}

MultiHeadedAttention::MultiHeadedAttention(const glossa::Params& p) : BaseLayer(p) {
  input_dim_ = params().GetInt("input_dim");
  hidden_dim_ = params().GetInt("hidden_dim");
  if (hidden_dim_ == 0) hidden_dim_ = input_dim_;
  num_heads_ = params().GetInt("num_heads");
  if (input_dim_ <= 0 || num_heads_ <= 0 || hidden_dim_ % num_heads_ != 0) {
    throw InvalidArgumentError(StrCat("layer '", path(),
                                      "': need input_dim > 0, num_heads > 0 "
                                      "and hidden_dim (",
                                      hidden_dim_, ") divisible by num_heads (", num_heads_, ")"));
  }
  dim_per_head_ = hidden_dim_ / num_heads_;
  per_dim_scale_ = params().GetBool("enable_per_dim_scale");
  glossa::Params proj = params().GetParams("proj_tpl").Copy();
  proj.Set("input_dim", input_dim_).Set("num_heads", num_heads_).Set("dim_per_head", dim_per_head_);
  proj.Set("use_bias", params().GetBool("use_bias"));
  const ParamValue& mapping = params().Get("weight_split_dims_mapping");
  const WeightSplit split = ParseWeightSplit(mapping, 3, StrCat("layer '", path(), "'"));
  axis_ = split.Resolve(build_context());
  if (!mapping.is_none()) proj.Set("weight_split_dims_mapping", mapping);
  query_ = CreateChild<MultiHeadedProjectionLayer>("query", proj);
  key_ = CreateChild<MultiHeadedProjectionLayer>("key", proj);
  value_ = CreateChild<MultiHeadedProjectionLayer>("value", proj);
  use_bias_ = params().GetBool("use_bias");
  causal_blocks_ = params().GetBool("causal_blocks");
  fuse_qkv_ = typeid(*query_.get()) == typeid(MultiHeadedProjectionLayer) &&
              typeid(*key_.get()) == typeid(MultiHeadedProjectionLayer) &&
              typeid(*value_.get()) == typeid(MultiHeadedProjectionLayer);
  proj.Set("is_output_projection", true);
  post_ = CreateChild<MultiHeadedProjectionLayer>("post", proj);
  // This rank's heads (the projections checked that they split).
  if (axis_ != nullptr) num_heads_ /= axis_->size();
  if (per_dim_scale_) {
    per_dim_scale_layer_ = CreateChild<PerDimScaleLayer>(
        "per_dim_scale", PerDimScaleLayer::Params().Set("dim", dim_per_head_));
  }
  atten_dropout_active_ = params().GetFloat("atten_dropout_prob") > 0;
  glossa::Params dropout = params().GetParams("dropout_tpl").Copy().Set(
      "keep_prob", 1.0 - params().GetFloat("atten_dropout_prob"));
  // The weights [B, N, T, S] of this rank's heads: its block of the whole layer's mask.
  if (axis_ != nullptr) {
    dropout.Set("activation_split_dims_mapping", WeightSplitMapping(3, 0, split.axis));
  }
  atten_dropout_ = CreateChild<DropoutLayer>("atten_dropout", dropout);
}

at::Tensor MultiHeadedAttention::ScaleQuery(const NestedMap& theta, const at::Tensor& q) const {
  if (per_dim_scale_ && axis_ != nullptr) {
    // Every rank's heads use the scale: its gradient sums theirs over the axis.
    NestedMap t = per_dim_scale_layer_.Theta(theta);
    t.Set("per_dim_scale", ReplicateOverAxis(*axis_, t.GetTensor("per_dim_scale")));
    return per_dim_scale_layer_->FProp(t, q);
  }
  if (per_dim_scale_) return per_dim_scale_layer_->FProp(per_dim_scale_layer_.Theta(theta), q);
  return q * (1.0 / std::sqrt(static_cast<double>(dim_per_head_)));
}

at::Tensor MultiHeadedAttention::QueryScaleVector(const NestedMap& theta,
                                                  const at::Tensor& q) const {
  if (q.scalar_type() != at::kFloat || axis_ != nullptr) return at::Tensor();
  if (per_dim_scale_) return per_dim_scale_layer_->Scale(per_dim_scale_layer_.Theta(theta));
  // q * (1/√H) multiplies by the float nearest 1/√H, as this vector holds.
  return at::full({dim_per_head_}, 1.0 / std::sqrt(static_cast<double>(dim_per_head_)),
                  q.options());
}

std::pair<at::Tensor, at::Tensor> MultiHeadedAttention::Attend(const NestedMap& theta, at::Tensor q,
                                                               const at::Tensor& k,
                                                               const at::Tensor& v,
                                                               const at::Tensor& key_mask,
                                                               bool causal,
                                                               const at::Tensor& qkv) const {
  // q [B, T, N, H], k/v [B, S, N, H], key_mask [B or 1, 1, T or 1, S] (true = masked).
  if (!atten_dropout_active_) {
    // The kernel: its native core where it applies (its bias in float32), else the reference.
    // In float32 the core takes the query scale and applies it as it reads q.
    const at::Tensor scale = QueryScaleVector(theta, q);
    if (!scale.defined()) q = ScaleQuery(theta, q);
    const auto options =
        AttentionCoreNativeApplies(q, k, v) ? q.options().dtype(at::kFloat) : q.options();
    const at::Tensor bias =
        key_mask.defined() ? MaskBias(key_mask, options) : at::empty({0}, options);
    auto [encoded, probs] =
        qkv.defined() && scale.defined()
            ? AttentionCoreQkv(qkv, bias, causal, PlannedBatchInvariant(), scale)
            : AttentionCore(q, k, v, bias, causal, PlannedBatchInvariant(), scale);
    return {post_->FProp(post_.Theta(theta), encoded), probs};
  }
  q = ScaleQuery(theta, q);
  // With attention dropout: the reference composition with the dropout between its two products.
  at::Tensor logits = at::einsum("btnh,bsnh->bnts", {q, k});
  if (key_mask.defined()) logits = logits + MaskBias(key_mask, logits.options());
  at::Tensor probs = at::softmax(logits, -1);
  at::Tensor dropped = atten_dropout_->FProp(atten_dropout_.Theta(theta), probs);
  at::Tensor encoded = at::einsum("bnts,bsnh->btnh", {dropped, v});
  encoded = post_->FProp(post_.Theta(theta), encoded);
  return {encoded, probs};
}

std::pair<at::Tensor, at::Tensor> MultiHeadedAttention::FProp(
    const NestedMap& theta, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& paddings, bool causal, const at::Tensor& segment_ids,
    const at::Tensor& source_segment_ids) const {
  if (query.dim() != 3 || key.dim() != 3 || value.dim() != 3 || query.size(-1) != input_dim_ ||
      key.size(-1) != input_dim_ || value.size(-1) != input_dim_ || key.size(1) != value.size(1)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': expected query [B, T, ", input_dim_,
                                      "] and key/value [B, S, ", input_dim_, "], got ",
                                      query.sizes(), ", ", key.sizes(), ", ", value.sizes()));
  }
  const int64_t t = query.size(1), s = key.size(1);
  if (causal && t != s) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': causal attention needs T == S, got ", t, " and ", s));
  }
  auto proj = [&](const Child<MultiHeadedProjectionLayer>& p, const at::Tensor& x) {
    return p->FProp(p.Theta(theta), CastToFPropDtype(x));
  };
  at::Tensor q, k, v, qkv;
  if (fuse_qkv_ && query.is_same(key) && key.is_same(value)) {
    qkv = ProjectQkv(theta, CastToFPropDtype(query));
    // unbind: one backward node that stacks the three gradients (three selects would each
    // scatter into a zero tensor of the whole output), where the core does not take qkv whole.
    const std::vector<at::Tensor> parts = qkv.unbind(2);
    q = parts[0], k = parts[1], v = parts[2];
  } else {
    q = proj(query_, query);
    k = proj(key_, key);
    v = proj(value_, value);
  }
  if (paddings.defined() &&
      (paddings.dim() != 2 || paddings.size(0) != key.size(0) || paddings.size(1) != s)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': paddings must be [B, S] = [",
                                      key.size(0), ", ", s, "], got ", paddings.sizes()));
  }
  const at::Tensor key_segments = source_segment_ids.defined() ? source_segment_ids : segment_ids;
  CheckSegmentIds(segment_ids, key_segments, query.size(0), t, s);
  // Blocks only where every query sees a key at or before it: a query with every key masked
  // spreads its probability evenly over all S keys, which the blocks would not all compute.
  // Unpacked, key 0 unpadded; packed, a query sees itself unless it is padded outside segment 0.
  bool blocks = causal && causal_blocks_;
  if (blocks && paddings.defined()) {
    blocks = segment_ids.defined()
                 ? !((paddings > 0.5) & (segment_ids != 0)).any().item<bool>()
                 : !(paddings.select(1, 0) > 0.5).any().item<bool>();
  }
  return Attend(theta, q, k, v,
                KeyMask(paddings, segment_ids, key_segments, t, s, causal, query.device()), blocks,
                qkv);
}

void MultiHeadedAttention::CheckSegmentIds(const at::Tensor& query_segments,
                                           const at::Tensor& key_segments, int64_t b, int64_t t,
                                           int64_t s) const {
  if (!query_segments.defined() && !key_segments.defined()) return;
  auto bad = [&](const at::Tensor& x, int64_t n) {
    return !x.defined() || x.dim() != 2 || x.size(0) != b || x.size(1) != n ||
           x.is_floating_point();
  };
  if (bad(query_segments, t) || bad(key_segments, s)) {
    throw InvalidArgumentError(StrCat(
        "layer '", path(), "': segment ids must be integer tensors [B, T] = [", b, ", ", t,
        "] for the queries and [B, S] = [", b, ", ", s, "] for the keys, got ",
        query_segments.defined() ? StrCat(query_segments.sizes(), " ",
                                          query_segments.scalar_type())
                                 : std::string("none"),
        " and ",
        key_segments.defined() ? StrCat(key_segments.sizes(), " ", key_segments.scalar_type())
                               : std::string("none")));
  }
}

at::Tensor MultiHeadedAttention::ProjectQkv(const NestedMap& theta, const at::Tensor& x) const {
  const NestedMap &tq = query_.Theta(theta), &tk = key_.Theta(theta), &tv = value_.Theta(theta);
  const int64_t nh = num_heads_ * dim_per_head_;
  const at::Tensor &wq = tq.GetTensor("w"), &wk = tk.GetTensor("w"), &wv = tv.GetTensor("w");
  at::Tensor x2 = x.reshape({-1, input_dim_});
  if (axis_ != nullptr) x2 = ReplicateOverAxis(*axis_, x2);  // the heads' projections are split
  const at::Tensor b = use_bias_ ? at::cat({tq.GetTensor("b").reshape({-1}),
                                            tk.GetTensor("b").reshape({-1}),
                                            tv.GetTensor("b").reshape({-1})})
                                 : at::Tensor();
  // The plan's matrix, concatenated once at load; else concatenated here.
  const PreparedWeight* planned = axis_ == nullptr ? PlannedWeight("qkv", {wq, wk, wv}) : nullptr;
  at::Tensor out =
      planned != nullptr
          ? compute_plan()->Affine(*planned, x2, b)
          : Affine(x2,
                   at::cat({wq.reshape({input_dim_, nh}), wk.reshape({input_dim_, nh}),
                            wv.reshape({input_dim_, nh})},
                           1),
                   b);
  return out.view({x.size(0), x.size(1), 3, num_heads_, dim_per_head_});
}

void MultiHeadedAttention::PrepareWeights(const NestedMap& theta, ComputePlan& plan) const {
  if (!fuse_qkv_ || axis_ != nullptr) return;
  const int64_t nh = num_heads_ * dim_per_head_;
  const at::Tensor& wq = query_.Theta(theta).GetTensor("w");
  const at::Tensor& wk = key_.Theta(theta).GetTensor("w");
  const at::Tensor& wv = value_.Theta(theta).GetTensor("w");
  plan.Prepare(PlanKey("qkv"),
               at::cat({wq.reshape({input_dim_, nh}), wk.reshape({input_dim_, nh}),
                        wv.reshape({input_dim_, nh})},
                       1),
               {wq, wk, wv});
}

NestedMap MultiHeadedAttention::ProjectSource(const NestedMap& theta,
                                             const at::Tensor& source) const {
  if (source.dim() != 3 || source.size(-1) != input_dim_) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': source must be [B, S, ", input_dim_,
                                      "], got ", source.sizes()));
  }
  const at::Tensor x = CastToFPropDtype(source);
  NestedMap out;
  out.Put("key", key_->FProp(key_.Theta(theta), x));
  out.Put("value", value_->FProp(value_.Theta(theta), x));
  return out;
}

std::pair<at::Tensor, at::Tensor> MultiHeadedAttention::FPropProjected(
    const NestedMap& theta, const at::Tensor& query, const NestedMap& source,
    const at::Tensor& paddings) const {
  const at::Tensor& k = source.GetTensor("key");
  const at::Tensor& v = source.GetTensor("value");
  if (query.dim() != 3 || query.size(-1) != input_dim_ || query.size(0) != k.size(0)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': query must be [", k.size(0), ", T, ",
                                      input_dim_, "], got ", query.sizes()));
  }
  const int64_t s = k.size(1);
  if (paddings.defined() &&
      (paddings.dim() != 2 || paddings.size(0) != k.size(0) || paddings.size(1) != s)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': paddings must be [B, S] = [",
                                      k.size(0), ", ", s, "], got ", paddings.sizes()));
  }
  at::Tensor q = query_->FProp(query_.Theta(theta), CastToFPropDtype(query));
  at::Tensor mask;
  if (paddings.defined()) mask = (paddings > 0.5).view({paddings.size(0), 1, 1, s});
  return Attend(theta, q, k, v, mask);
}

NestedMap MultiHeadedAttention::InitStates(int64_t batch_size, at::ScalarType dtype) const {
  auto opts = at::TensorOptions().dtype(dtype);
  const int64_t c = kInitialCacheSteps;
  return MakeStates(at::zeros({batch_size, c, num_heads_, dim_per_head_}, opts),
                    at::zeros({batch_size, c, num_heads_, dim_per_head_}, opts),
                    at::zeros({batch_size, c}, at::kLong), at::zeros({batch_size}, at::kLong));
}

NestedMap MultiHeadedAttention::MakeStates(const at::Tensor& key, const at::Tensor& value,
                                           const at::Tensor& rows, const at::Tensor& length) {
  NestedMap kv;
  kv.Put("key", key);
  kv.Put("value", value);
  NestedMap states;
  states.Put("unordered", kv);
  states.Put("rows", rows);
  states.Put("length", length);
  return states;
}

std::pair<at::Tensor, NestedMap> MultiHeadedAttention::ExtendStep(const NestedMap& theta,
                                                                const at::Tensor& query,
                                                                const NestedMap& cached_states,
                                                                const NestedMap& context) const {
  return ExtendStep(theta, query, cached_states, OptionalInput(context, "paddings"));
}

namespace {

// `t` [B, C, ...] with its capacity C at least `need` (doubled), the first C columns kept.
at::Tensor WithCapacity(const at::Tensor& t, int64_t need) {
  if (t.size(1) >= need) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[1] = std::max(need, 2 * t.size(1));
  at::Tensor grown = at::zeros(shape, t.options());
  grown.narrow(1, 0, t.size(1)).copy_(t);
  return grown;
}

}  // namespace

MultiHeadedAttention::StepCaches MultiHeadedAttention::PrepareStep(
    const NestedMap& cached_states, int64_t n, at::ScalarType dtype) const {
  if (!cached_states.contains("unordered") || !cached_states.contains("rows") ||
      !cached_states.contains("length")) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': ExtendStep states must come from "
                                      "InitStates ({unordered: {key, value}, rows, length})"));
  }
  const NestedMap& kv = cached_states.GetItem("unordered").AsMap();
  StepCaches c;
  c.length = cached_states.GetTensor("length");
  c.rows = cached_states.GetTensor("rows");
  c.key = kv.GetTensor("key");
  c.value = kv.GetTensor("value");
  // The caches may hold more slots than rows: a search that dropped finished sources (row i
  // writes slot i; the row table says where every earlier step of row i is).
  if (c.rows.size(0) != n || c.length.numel() != n || c.key.size(0) < n) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': ExtendStep states are for ",
                                      c.rows.size(0), " hypotheses (caches of ", c.key.size(0),
                                      " slots), the query has ", n));
  }
  c.step = n > 0 ? c.length[0].item<int64_t>() : 0;
  // This step's key and value go into column `step` of the caches, in place: earlier states
  // (of length <= step) never read that column.
  at::NoGradGuard no_grad;
  c.key = WithCapacity(c.key.to(dtype), c.step + 1);
  c.value = WithCapacity(c.value.to(dtype), c.step + 1);
  c.rows = WithCapacity(c.rows, c.step + 1);
  if (c.rows.is_contiguous() && c.rows.scalar_type() == at::kLong) {
    int64_t* r = c.rows.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) r[i * c.rows.size(1) + c.step] = i;
  } else {
    c.rows.select(1, c.step).copy_(at::arange(n, c.rows.options()));
  }
  return c;
}

NestedMap MultiHeadedAttention::StatesAfterStep(const StepCaches& c) {
  return MakeStates(c.key, c.value, c.rows, c.length + 1);
}

std::pair<at::Tensor, NestedMap> MultiHeadedAttention::ExtendStep(
    const NestedMap& theta, const at::Tensor& query, const NestedMap& cached_states,
    const at::Tensor& paddings) const {
  if (query.dim() != 2 || query.size(1) != input_dim_) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': ExtendStep query must be [B, ",
                                      input_dim_, "], got ", query.sizes()));
  }
  const int64_t n = query.size(0);
  at::Tensor x = CastToFPropDtype(query).unsqueeze(1);  // [B, 1, D]
  auto proj = [&](const Child<MultiHeadedProjectionLayer>& p) {
    return p->FProp(p.Theta(theta), x).squeeze(1);  // [B, N, H]
  };
  const at::Tensor q = proj(query_);
  const StepCaches c = PrepareStep(cached_states, n, q.scalar_type());
  const int64_t step = c.step;
  {
    at::NoGradGuard no_grad;
    // Row i writes slot i (the caches may hold more slots than rows: PrepareStep).
    c.key.select(1, step).narrow(0, 0, n).copy_(proj(key_));
    c.value.select(1, step).narrow(0, 0, n).copy_(proj(value_));
  }
  at::Tensor bias;
  if (paddings.defined()) {
    if (paddings.dim() != 2 || paddings.size(0) != n || paddings.size(1) != step + 1) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': ExtendStep paddings must be [B, ",
                                        step + 1, "], got ", paddings.sizes()));
    }
    bias = at::zeros(paddings.sizes(), paddings.options().dtype(at::kFloat))
               .masked_fill_(paddings > 0.5, std::numeric_limits<float>::lowest());
  }
  const at::Tensor ctx = StepAttention(ScaleQuery(theta, q), c.key, c.value, c.rows, step + 1, bias);
  const at::Tensor encoded = post_->FProp(post_.Theta(theta), ctx.unsqueeze(1)).squeeze(1);
  return {encoded, StatesAfterStep(c)};
}

GLOSSA_REGISTER_CLASS(MultiHeadedAttention, "glossa.layers.MultiHeadedAttention");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature MultiHeadedAttention::FPropMapSpec() const {
  return {{"query", "key", "value", "paddings", "causal", "segment_ids", "source_segment_ids"},
          3, {"context", "probs"}, true, "(context, probs)"};
}

NestedMap MultiHeadedAttention::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  const bool causal = inputs.contains("causal") && !inputs.at("causal").is_none() &&
                      inputs.at("causal").AsBool();
  auto [context, probs] = FProp(theta, inputs.GetTensor("query"), inputs.GetTensor("key"),
                                inputs.GetTensor("value"), OptionalInput(inputs, "paddings"), causal,
                                OptionalInput(inputs, "segment_ids"),
                                OptionalInput(inputs, "source_segment_ids"));
  NestedMap out;
  out.Put("context", context);
  out.Put("probs", probs);
  return out;
}

}  // namespace glossa
