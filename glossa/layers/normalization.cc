#include "glossa/layers/normalization.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/layer_norm.h"

namespace glossa {

glossa::Params LayerNorm::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<LayerNorm>());
  p.Define("input_dim", 0, "Depth of the input to the network.");
  p.Define("epsilon", 1e-6, "Tiny value to guard the rsqrt.");
  p.Define("direct_scale", false,
           "If True, multiply by `scale` (init 1); otherwise by 1 + `scale` (init 0).");
  return p;
}

LayerNorm::LayerNorm(const glossa::Params& p) : BaseLayer(p) {
  input_dim_ = params().GetInt("input_dim");
  epsilon_ = params().GetFloat("epsilon");
  direct_scale_ = params().GetBool("direct_scale");
  if (input_dim_ <= 0)
    throw InvalidArgumentError(StrCat("layer '", path(), "': input_dim must be > 0"));
  const DType dtype = params().Get("dtype").AsDType();
  CreateVariable(
      "scale", WeightParams({input_dim_}, WeightInit::Constant(direct_scale_ ? 1.0 : 0.0), dtype));
  CreateVariable("bias", WeightParams({input_dim_}, WeightInit::Constant(0.0), dtype));
}

at::Tensor LayerNorm::FProp(const NestedMap& theta, const at::Tensor& inputs) const {
  if (inputs.dim() < 1 || inputs.size(-1) != input_dim_) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': inputs must end in input_dim ",
                                      input_dim_, ", got shape ", inputs.sizes()));
  }
  at::Tensor x = CastToFPropDtype(inputs);
  at::Tensor scale = theta.GetTensor("scale");
  if (!direct_scale_) scale = scale + 1;
  return LayerNormLastDim(x, scale, theta.GetTensor("bias"), epsilon_);
}

glossa::Params BatchNormLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<BatchNormLayer>());
  p.Define("dim", 0, "Depth of the input/output.");
  p.Define("decay", 0.999, "Decay in updating the mean and variance moving average.");
  p.Define("epsilon", 0.001, "Small value added to the variance to avoid dividing by zero.");
  p.Define("set_padded_output_to_zero", true, "If True, outputs at padded positions are 0.");
  p.Define("use_moving_avg_in_training", false,
           "If True, normalize with the moving averages in training too (still updating them).");
  return p;
}

BatchNormLayer::BatchNormLayer(const glossa::Params& p) : BaseLayer(p) {
  dim_ = params().GetInt("dim");
  decay_ = params().GetFloat("decay");
  epsilon_ = params().GetFloat("epsilon");
  set_padded_output_to_zero_ = params().GetBool("set_padded_output_to_zero");
  use_moving_avg_in_training_ = params().GetBool("use_moving_avg_in_training");
  if (dim_ <= 0) throw InvalidArgumentError(StrCat("layer '", path(), "': dim must be > 0"));
  const DType dtype = params().Get("dtype").AsDType();
  // As in Lingvo, batch-norm variables are exempt from L1/L2 regularization.
  CreateVariable("beta", WeightParams({dim_}, WeightInit::Constant(0.0), dtype,
                                      {kSkipLpRegularizationCollection}));
  CreateVariable("gamma", WeightParams({dim_}, WeightInit::Constant(0.0), dtype,
                                       {kSkipLpRegularizationCollection}));
  CreateVariable("moving_mean", WeightParams({dim_}, WeightInit::Constant(0.0), dtype,
                                             {kNonTrainableCollection, kMovingVarsCollection,
                                              kSkipLpRegularizationCollection}));
  CreateVariable("moving_variance", WeightParams({dim_}, WeightInit::Constant(1.0), dtype,
                                                 {kNonTrainableCollection, kMovingVarsCollection,
                                                  kSkipLpRegularizationCollection}));
}

at::Tensor BatchNormLayer::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                 const at::Tensor& paddings) const {
  if (inputs.dim() < 1 || inputs.size(-1) != dim_) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': inputs must end in dim ", dim_,
                                      ", got shape ", inputs.sizes()));
  }
  at::Tensor x = CastToFPropDtype(inputs);
  const bool training = !IsEvalMode() && !is_inference();
  const bool fusable = (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) &&
                       x.numel() > 0 &&
                       (!training || (!paddings.defined() && !use_moving_avg_in_training_));
  if (fusable) {
    at::Tensor out = FusedFProp(theta, x, training);
    if (paddings.defined() && set_padded_output_to_zero_)
      out = out * (1 - paddings.to(out.scalar_type())).unsqueeze(-1);
    return out;
  }
  at::Tensor mean, var;
  if (training) {
    at::Tensor w = paddings.defined() ? (1 - paddings.to(x.scalar_type())).unsqueeze(-1)
                                      : at::ones_like(x.select(-1, 0)).unsqueeze(-1);
    std::vector<int64_t> dims;
    for (int64_t d = 0; d + 1 < x.dim(); ++d) dims.push_back(d);
    at::Tensor count = at::clamp_min((w * at::ones_like(x)).sum(dims), 1.0);
    at::Tensor batch_mean = (x * w).sum(dims) / count;
    at::Tensor batch_var = ((x - batch_mean).square() * w).sum(dims) / count;
    {
      at::NoGradGuard no_grad;
      for (const auto& [name, stat] : {std::make_pair("moving_mean", batch_mean),
                                       std::make_pair("moving_variance", batch_var)}) {
        at::Tensor var_tensor = GetVariable(name);
        var_tensor.sub_((var_tensor - stat.detach().to(var_tensor.scalar_type())) * (1 - decay_));
      }
    }
    if (use_moving_avg_in_training_) {
      mean = theta.GetTensor("moving_mean");
      var = theta.GetTensor("moving_variance");
    } else {
      mean = batch_mean;
      var = batch_var;
    }
  } else {
    mean = theta.GetTensor("moving_mean");
    var = theta.GetTensor("moving_variance");
  }
  at::Tensor out = (x - mean) * at::rsqrt(var + epsilon_) * (1 + theta.GetTensor("gamma")) +
                   theta.GetTensor("beta");
  if (paddings.defined() && set_padded_output_to_zero_)
    out = out * (1 - paddings.to(out.scalar_type())).unsqueeze(-1);
  return out;
}

// ATen's fused batch norm over [rows, dim] (one pass for the statistics, one for the output, and
// one fused backward): used where every row counts, i.e. without paddings in training. The batch
// variance for the moving average comes back from the saved 1 / sqrt(var + epsilon), in double.
at::Tensor BatchNormLayer::FusedFProp(const NestedMap& theta, const at::Tensor& x,
                                      bool training) const {
  const at::ScalarType t = x.scalar_type();
  const at::Tensor rows = x.reshape({-1, dim_});
  const at::Tensor weight = (1 + theta.GetTensor("gamma")).to(t);
  const at::Tensor bias = theta.GetTensor("beta").to(t);
  if (!training) {
    return at::batch_norm(rows, weight, bias, theta.GetTensor("moving_mean").to(t),
                          theta.GetTensor("moving_variance").to(t), /*training=*/false, 0.0,
                          epsilon_, /*cudnn_enabled=*/false)
        .view(x.sizes());
  }
  auto [out, batch_mean, invstd] =
      at::native_batch_norm(rows, weight, bias, {}, {}, /*training=*/true, 0.0, epsilon_);
  {
    at::NoGradGuard no_grad;
    const at::Tensor batch_var =
        at::clamp_min(invstd.detach().to(at::kDouble).pow(-2) - epsilon_, 0.0);
    for (const auto& [name, stat] : {std::make_pair("moving_mean", batch_mean.detach()),
                                     std::make_pair("moving_variance", batch_var)}) {
      at::Tensor var_tensor = GetVariable(name);
      var_tensor.sub_((var_tensor - stat.to(var_tensor.scalar_type())) * (1 - decay_));
    }
  }
  return out.view(x.sizes());
}

GLOSSA_REGISTER_CLASS(LayerNorm, "glossa.layers.LayerNorm");
GLOSSA_REGISTER_CLASS(BatchNormLayer, "glossa.layers.BatchNormLayer");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature LayerNorm::FPropMapSpec() const {
  return {{"inputs"}, 1, {"outputs"}, false, "Tensor"};
}

NestedMap LayerNorm::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap out;
  out.Put("outputs", FProp(theta, inputs.GetTensor("inputs")));
  return out;
}

BaseLayer::FPropMapSignature BatchNormLayer::FPropMapSpec() const {
  return {{"inputs", "paddings"}, 1, {"outputs"}, false, "Tensor"};
}

NestedMap BatchNormLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap out;
  out.Put("outputs", FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "paddings")));
  return out;
}

}  // namespace glossa
