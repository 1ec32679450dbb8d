// The multi-headed attention's projections and query scale (attention_projection.h).
#include "glossa/layers/attention_projection.h"

#include <ATen/ATen.h>

#include <cmath>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/kernels/gemm.h"
#include "glossa/layers/weight_init.h"

namespace glossa {

glossa::Params MultiHeadedProjectionLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<MultiHeadedProjectionLayer>());
  p.Define("input_dim", 0, "Input dimension.");
  p.Define("num_heads", 0, "Number of heads.");
  p.Define("dim_per_head", 0, "Size of each head.");
  p.Define("is_output_projection", false,
           "Whether it is an output projection ([B, T, N, H] -> [B, T, D]).");
  p.Define("use_bias", true, "Whether to add a bias.");
  p.Define("weight_split_dims_mapping", nullptr,
           "Tensor parallelism: per dim of w [input_dim, num_heads, dim_per_head], None or a "
           "mesh axis name; [None, \"model\", None] splits the heads over the 'model' axis "
           "(an output projection sums its heads' partial products over the axis). Built whole "
           "without that axis.");
  return p;
}

MultiHeadedProjectionLayer::MultiHeadedProjectionLayer(const glossa::Params& p) : BaseLayer(p) {
  const int64_t d = params().GetInt("input_dim");
  int64_t n = params().GetInt("num_heads");
  const int64_t h = params().GetInt("dim_per_head");
  if (d <= 0 || n <= 0 || h <= 0) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': input_dim, num_heads and dim_per_head must be > 0"));
  }
  is_output_projection_ = params().GetBool("is_output_projection");
  use_bias_ = params().GetBool("use_bias");
  const DType dtype = params().Get("dtype").AsDType();
  const WeightSplit split = ParseWeightSplit(params().Get("weight_split_dims_mapping"), 3,
                                             StrCat("layer '", path(), "'"));
  if (split.dim >= 0 && split.dim != 1) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': weight_split_dims_mapping may split "
                                      "the heads (dim 1) only, not dim ", split.dim));
  }
  axis_ = split.Resolve(build_context());
  const int64_t m = axis_ != nullptr ? axis_->size() : 1;
  if (n % m != 0) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': ", n, " heads do not split over the ",
                                      m, " ranks of the '", split.axis, "' axis"));
  }
  n /= m;
  auto sharded = [&](WeightParams wp, int64_t dim) {
    if (axis_ == nullptr) return wp;
    wp.collections.push_back(kModelShardedCollection);
    wp.shard_dim = dim;
    wp.shard_index = axis_->index();
    wp.shard_count = m;
    return wp;
  };
  CreateVariable("w", sharded(WeightParams({d, n, h},
                                           WeightInit::FromParams(params().GetParams("params_init")),
                                           dtype),
                              1));
  if (use_bias_) {
    // An output projection's bias is added once, to the sum over the axis: whole.
    if (is_output_projection_) {
      CreateVariable("b", WeightParams({d}, WeightInit::Constant(0.0), dtype));
    } else {
      CreateVariable("b", sharded(WeightParams({n, h}, WeightInit::Constant(0.0), dtype), 0));
    }
  }
}

at::Tensor MultiHeadedProjectionLayer::FProp(const NestedMap& theta,
                                             const at::Tensor& inputs) const {
  // One GEMM over the flattened batch (the bias fused in), the same contraction as the einsums
  // btd,dnh->btnh and btnh,dnh->btd.
  const at::Tensor& w = theta.GetTensor("w");
  const int64_t d = w.size(0), nh = w.size(1) * w.size(2);
  std::vector<int64_t> out_shape = inputs.sizes().vec();
  at::Tensor x, w2;
  if (is_output_projection_) {
    out_shape.resize(out_shape.size() - 2);
    out_shape.push_back(d);
    x = inputs.reshape({-1, nh});
    w2 = w.reshape({d, nh}).t();
  } else {
    out_shape.pop_back();
    out_shape.push_back(w.size(1));
    out_shape.push_back(w.size(2));
    x = inputs.reshape({-1, d});
    w2 = w.reshape({d, nh});
  }
  if (axis_ != nullptr && is_output_projection_) {
    // This rank's heads' share of the output, summed over the axis; then the bias.
    at::Tensor out = ReduceOverAxis(*axis_, Affine(x, w2, at::Tensor()));
    if (use_bias_) out = out + theta.GetTensor("b");
    return out.view(out_shape);
  }
  const at::Tensor b = use_bias_ ? theta.GetTensor("b").reshape({-1}) : at::Tensor();
  if (axis_ != nullptr) {
    return Affine(ReplicateOverAxis(*axis_, x), w2, b).view(out_shape);
  }
  return PlannedAffine("w", w, x, w2, b).view(out_shape);
}

void MultiHeadedProjectionLayer::PrepareWeights(const NestedMap& theta, ComputePlan& plan) const {
  if (axis_ != nullptr) return;  // a block of heads: the plan covers a model in one process
  const at::Tensor& w = theta.GetTensor("w");
  const int64_t d = w.size(0), nh = w.size(1) * w.size(2);
  plan.Prepare(PlanKey("w"), is_output_projection_ ? w.reshape({d, nh}).t() : w.reshape({d, nh}),
               {w});
}

glossa::Params PerDimScaleLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<PerDimScaleLayer>());
  p.Define("dim", 0, "Number of individual dims.");
  return p;
}

PerDimScaleLayer::PerDimScaleLayer(const glossa::Params& p) : BaseLayer(p) {
  dim_ = params().GetInt("dim");
  if (dim_ <= 0) throw InvalidArgumentError(StrCat("layer '", path(), "': dim must be > 0"));
  CreateVariable("per_dim_scale",
                 WeightParams({dim_}, WeightInit::Constant(0.0), params().Get("dtype").AsDType()));
}

at::Tensor PerDimScaleLayer::Scale(const NestedMap& theta) const {
  // 1.0/softplus(0.0) = 1.442695041: the scale is 1/sqrt(dim) at initialization.
  const double r_softplus_0 = 1.442695041;
  return at::softplus(theta.GetTensor("per_dim_scale")) *
         (r_softplus_0 / std::sqrt(static_cast<double>(dim_)));
}

at::Tensor PerDimScaleLayer::FProp(const NestedMap& theta, const at::Tensor& inputs) const {
  return inputs * Scale(theta);
}

GLOSSA_REGISTER_CLASS(MultiHeadedProjectionLayer, "glossa.layers.MultiHeadedProjectionLayer");
GLOSSA_REGISTER_CLASS(PerDimScaleLayer, "glossa.layers.PerDimScaleLayer");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature MultiHeadedProjectionLayer::FPropMapSpec() const {
  return {{"inputs"}, 1, {"outputs"}, false, "Tensor"};
}

NestedMap MultiHeadedProjectionLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap out;
  out.Put("outputs", FProp(theta, inputs.GetTensor("inputs")));
  return out;
}

BaseLayer::FPropMapSignature PerDimScaleLayer::FPropMapSpec() const {
  return {{"inputs"}, 1, {"outputs"}, false, "Tensor"};
}

NestedMap PerDimScaleLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap out;
  out.Put("outputs", FProp(theta, inputs.GetTensor("inputs")));
  return out;
}

}  // namespace glossa
