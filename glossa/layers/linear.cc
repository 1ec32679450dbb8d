#include "glossa/layers/linear.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/activations.h"
#include "glossa/layers/mesh.h"
#include "glossa/layers/weight_init.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/compute_plan.h"

namespace glossa {

bool AnyPadding(const at::Tensor& paddings) {
  // The layers of a stack ask about the same paddings tensor again and again: remember the last
  // answer per thread. The entry holds the tensor (its address cannot be reused by another while
  // cached) and its version (an in-place write makes the entry stale). A per-thread cache.
  thread_local at::Tensor last;
  thread_local int64_t last_version = 0;  // per-thread cache
  thread_local bool last_any = false;  // per-thread cache
  if (last.defined() && last.unsafeGetTensorImpl() == paddings.unsafeGetTensorImpl() &&
      last_version == paddings._version()) {
    return last_any;
  }
  last_any = at::any(paddings).item<bool>();
  last = paddings;
  last_version = paddings._version();
  return last_any;
}

at::Tensor ApplyPaddings(const at::Tensor& x, const at::Tensor& paddings) {
  if (!paddings.defined()) return x;
  // x · 1 is x exactly (values and gradients), so a batch without padding skips the multiply and
  // its backward: on CPU they cost a few percent of a Transformer step. (Checked on CPU only,
  // where reading the flag does not stall a device queue.)
  if (paddings.is_cpu() && !paddings.requires_grad() && !AnyPadding(paddings)) return x;
  at::Tensor p = paddings.to(x.scalar_type());
  while (p.dim() < x.dim()) p = p.unsqueeze(-1);
  return x * (1 - p);
}

glossa::Params ProjectionLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<ProjectionLayer>());
  p.Define("input_dim", 0, "Depth of the input.");
  p.Define("output_dim", 0, "Depth of the output.");
  p.Define("activation", "RELU", "Activation function (see activations.h for the names).");
  p.Define("has_bias", false, "Whether to add a bias.");
  p.Define("bias_init", 0.0, "Initial value of the bias.");
  p.Define("weight_split_dims_mapping", nullptr,
           "Tensor parallelism (Lingvo/GShard): per dim of w [input_dim, output_dim], None or a "
           "mesh axis name. [None, \"model\"] splits the output columns over the 'model' axis "
           "(column-parallel: each rank computes its block of outputs); [\"model\", None] the "
           "input rows (row-parallel: the input is each rank's block of features, and the "
           "partial products are summed over the axis). Built whole without that axis.");
  return p;
}

ProjectionLayer::ProjectionLayer(const glossa::Params& p) : BaseLayer(p) {
  input_dim_ = params().GetInt("input_dim");
  output_dim_ = params().GetInt("output_dim");
  activation_ = params().GetString("activation");
  has_bias_ = params().GetBool("has_bias");
  if (input_dim_ <= 0 || output_dim_ <= 0) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': input_dim and output_dim must be > 0"));
  }
  CheckActivation(activation_, StrCat("layer '", path(), "'"));
  const DType dtype = params().Get("dtype").AsDType();
  const WeightSplit split = ParseWeightSplit(params().Get("weight_split_dims_mapping"), 2,
                                             StrCat("layer '", path(), "'"));
  axis_ = split.Resolve(build_context());
  WeightParams w({input_dim_, output_dim_},
                 WeightInit::FromParams(params().GetParams("params_init")), dtype);
  WeightParams b({output_dim_}, WeightInit::Constant(params().GetFloat("bias_init")), dtype);
  if (axis_ != nullptr) {
    const int64_t m = axis_->size(), whole = split.dim == 0 ? input_dim_ : output_dim_;
    if (whole % m != 0) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': ", split.dim == 0 ? "input_dim" :
                                        "output_dim", " ", whole, " does not split over the ", m,
                                        " ranks of the '", split.axis, "' axis"));
    }
    row_parallel_ = split.dim == 0;
    (row_parallel_ ? input_dim_ : output_dim_) = whole / m;
    w.shape = {input_dim_, output_dim_};
    w.collections.push_back(kModelShardedCollection);
    w.shard_dim = split.dim;
    w.shard_index = axis_->index();
    w.shard_count = m;
    if (!row_parallel_) {  // the bias of this rank's columns; a row-parallel one is added whole
      b.shape = {output_dim_};
      b.collections.push_back(kModelShardedCollection);
      b.shard_index = axis_->index();
      b.shard_count = m;
    }
  }
  CreateVariable("w", w);
  if (has_bias_) CreateVariable("b", b);
}

at::Tensor ProjectionLayer::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                  const at::Tensor& paddings) const {
  if (inputs.dim() < 1 || inputs.size(-1) != input_dim_) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': inputs must end in input_dim ",
                                      input_dim_, ", got shape ", inputs.sizes()));
  }
  at::Tensor x = CastToFPropDtype(inputs);
  const at::Tensor& w = theta.GetTensor("w");
  at::Tensor y;
  if (row_parallel_) {
    // This rank's block of input features times its rows of w, summed over the axis; then the
    // (whole) bias and the activation.
    y = ReduceOverAxis(*axis_, at::matmul(x, w));
    if (has_bias_) y = y + theta.GetTensor("b");
    return ApplyPaddings(Activate(activation_, y), paddings);
  }
  if (axis_ != nullptr) x = ReplicateOverAxis(*axis_, x);  // column-parallel
  const PreparedWeight* planned = axis_ == nullptr ? PlannedWeight("w", {w}) : nullptr;
  if ((has_bias_ || planned != nullptr) && x.dim() >= 2) {  // x·w + b as one GEMM, bias fused in
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = w.size(1);
    // A ReLU goes into the same call: applied in place, its backward in one pass.
    const bool relu = activation_ == "RELU";
    const at::Tensor b = has_bias_ ? theta.GetTensor("b") : at::Tensor();
    const at::Tensor x2 = x.reshape({-1, input_dim_});
    y = (planned != nullptr ? compute_plan()->Affine(*planned, x2, b, relu)
                            : Affine(x2, w, b, relu))
            .view(shape);
    if (!relu) y = Activate(activation_, y);
  } else {
    y = at::matmul(x, w);
    if (has_bias_) y = y + theta.GetTensor("b");
    y = Activate(activation_, y);
  }
  return ApplyPaddings(y, paddings);
}

glossa::Params FCLayer::Params() {
  glossa::Params p = ProjectionLayer::Params();
  p.Set("cls", ClsOf<FCLayer>());
  p.Set("has_bias", true);
  return p;
}

void ProjectionLayer::PrepareWeights(const NestedMap& theta, ComputePlan& plan) const {
  if (axis_ != nullptr) return;  // a shard: the plan covers a model in one process
  const at::Tensor& w = theta.GetTensor("w");
  plan.Prepare(PlanKey("w"), w, {w});
}

GLOSSA_REGISTER_CLASS(ProjectionLayer, "glossa.layers.ProjectionLayer");
GLOSSA_REGISTER_CLASS(FCLayer, "glossa.layers.FCLayer");

at::Tensor ProjectionLayer::FPropBlock(const NestedMap& theta, const at::Tensor& x,
                                       const at::Tensor& paddings) const {
  return FProp(theta, x, paddings.defined() && x.dim() == paddings.dim() + 1 ? paddings : at::Tensor());
}

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature ProjectionLayer::FPropMapSpec() const {
  return {{"inputs", "paddings"}, 1, {"outputs"}, false, "Tensor"};
}

NestedMap ProjectionLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap out;
  out.Put("outputs", FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "paddings")));
  return out;
}

}  // namespace glossa
