#include "glossa/layers/normalization.h"

#include <ATen/ATen.h>
// GCC 12 flags the AVX-512 intrinsics' masked loads as maybe-uninitialized; a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "glossa/base/errors.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/base/strings.h"
#include "glossa/layers/bf16_simd.h"
#include "glossa/runtime/cpu_runtime.h"

namespace glossa {
namespace {

// ---- Layer norm of bf16 rows in one pass each way ----
//
// For bf16 inputs the layer used to widen x to float32 (a pass and a copy), run ATen's float32
// layer norm, and round its output to bf16 (another pass); and the backward the same in reverse.
// These kernels read the bf16 rows, normalize in float32 (the same arithmetic: mean, biased
// variance, rsqrt(var + eps), · scale + bias) and write bf16, on Glossa's loop threads; the
// backward writes the bf16 input gradient and the float32 scale and bias gradients, summed over
// fixed blocks of rows in order, so the same on any number of threads.

using bf16_simd::FirstLanes;
using bf16_simd::Load;
using bf16_simd::Store;

__attribute__((target("avx512f,avx512bw,avx512vl"))) void LnForwardRows(
    const uint16_t* x, const float* gamma, const float* beta, int64_t D, float eps, uint16_t* y,
    float* mean_out, float* rstd_out, int64_t lo, int64_t hi) {
  for (int64_t r = lo; r < hi; ++r) {
    const uint16_t* xr = x + r * D;
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < D; c += 16) sum = _mm512_add_ps(sum, Load(xr + c, FirstLanes(D - c)));
    const float mean = _mm512_reduce_add_ps(sum) / static_cast<float>(D);
    const __m512 vm = _mm512_set1_ps(mean);
    __m512 sq = _mm512_setzero_ps();
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 m = FirstLanes(D - c);
      const __m512 d = _mm512_maskz_sub_ps(m, Load(xr + c, m), vm);
      sq = _mm512_fmadd_ps(d, d, sq);
    }
    const float rstd = 1.0f / std::sqrt(_mm512_reduce_add_ps(sq) / static_cast<float>(D) + eps);
    const __m512 vr = _mm512_set1_ps(rstd);
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 m = FirstLanes(D - c);
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(Load(xr + c, m), vm), vr);
      Store(y + r * D + c,
              _mm512_fmadd_ps(xhat, _mm512_maskz_loadu_ps(m, gamma + c),
                              _mm512_maskz_loadu_ps(m, beta + c)),
              m);
    }
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·γ; dγ += dy·x̂ and dβ += dy into this block's
// row of the partial sums.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void LnBackwardRows(
    const uint16_t* x, const uint16_t* dy, const float* gamma, const float* mean,
    const float* rstd, int64_t D, uint16_t* dx, float* dgamma, float* dbeta, int64_t lo,
    int64_t hi) {
  for (int64_t r = lo; r < hi; ++r) {
    const uint16_t *xr = x + r * D, *dyr = dy + r * D;
    const __m512 vm = _mm512_set1_ps(mean[r]), vr = _mm512_set1_ps(rstd[r]);
    __m512 sg = _mm512_setzero_ps(), sgx = _mm512_setzero_ps();
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 m = FirstLanes(D - c);
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(Load(xr + c, m), vm), vr);
      const __m512 d = Load(dyr + c, m);
      const __m512 g = _mm512_mul_ps(d, _mm512_maskz_loadu_ps(m, gamma + c));
      sg = _mm512_add_ps(sg, g);
      sgx = _mm512_fmadd_ps(g, xhat, sgx);
      _mm512_mask_storeu_ps(dgamma + c, m,
                            _mm512_fmadd_ps(d, xhat, _mm512_maskz_loadu_ps(m, dgamma + c)));
      _mm512_mask_storeu_ps(dbeta + c, m, _mm512_add_ps(d, _mm512_maskz_loadu_ps(m, dbeta + c)));
    }
    const __m512 a = _mm512_set1_ps(_mm512_reduce_add_ps(sg) / static_cast<float>(D));
    const __m512 b = _mm512_set1_ps(_mm512_reduce_add_ps(sgx) / static_cast<float>(D));
    for (int64_t c = 0; c < D; c += 16) {
      const __mmask16 m = FirstLanes(D - c);
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(Load(xr + c, m), vm), vr);
      const __m512 g = _mm512_mul_ps(Load(dyr + c, m), _mm512_maskz_loadu_ps(m, gamma + c));
      Store(dx + r * D + c, _mm512_mul_ps(vr, _mm512_sub_ps(_mm512_sub_ps(g, a),
                                                              _mm512_mul_ps(xhat, b))),
              m);
    }
  }
}

constexpr int64_t kLnBlock = 64;  // rows per partial sum of dγ, dβ

bool HasAvx512Bw() {
  static const bool has = CpuHasAvx512BwVl();
  return has;
}

class Bf16LayerNormFunction : public torch::autograd::Function<Bf16LayerNormFunction> {
 public:
  // x [M, D] bf16 contiguous; gamma, beta [D] float32 contiguous.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& gamma,
                                                const at::Tensor& beta, double eps) {
    const int64_t M = x.size(0), D = x.size(1);
    at::Tensor y = at::empty({M, D}, x.options());
    at::Tensor mean = at::empty({M}, gamma.options()), rstd = at::empty({M}, gamma.options());
    const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
    uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
    const float *gp = gamma.data_ptr<float>(), *bp = beta.data_ptr<float>();
    float *mp = mean.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    KernelParallelFor(0, M, std::max<int64_t>(1, 16384 / D), [&](int64_t lo, int64_t hi) {
      LnForwardRows(xp, gp, bp, D, static_cast<float>(eps), yp, mp, rp, lo, hi);
    });
    ctx->save_for_backward({x, gamma, mean, rstd});
    ctx->set_materialize_grads(false);
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return torch::autograd::variable_list(4);  // one per input
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &gamma = saved[1], &mean = saved[2], &rstd = saved[3];
    const at::Tensor dy = grads[0].to(at::kBFloat16).contiguous();
    const int64_t M = x.size(0), D = x.size(1), blocks = (M + kLnBlock - 1) / kLnBlock;
    at::Tensor dx = at::empty({M, D}, x.options());
    at::Tensor partial = at::zeros({2, blocks, D}, gamma.options());
    const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
    const uint16_t* dyp = reinterpret_cast<const uint16_t*>(dy.data_ptr());
    uint16_t* dxp = reinterpret_cast<uint16_t*>(dx.data_ptr());
    float* pp = partial.data_ptr<float>();
    KernelParallelFor(0, blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t blk = lo; blk < hi; ++blk) {
        LnBackwardRows(xp, dyp, gamma.data_ptr<float>(), mean.data_ptr<float>(),
                       rstd.data_ptr<float>(), D, dxp, pp + blk * D, pp + (blocks + blk) * D,
                       blk * kLnBlock, std::min(M, (blk + 1) * kLnBlock));
      }
    });
    // The blocks' partial sums in block order (at::sum's order over dim 1 is fixed, too).
    const at::Tensor sums = partial.sum(1);
    return {dx, sums[0], sums[1], at::Tensor()};
  }
};

}  // namespace

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
  // (x - mean) * rsqrt(var + eps) * scale + bias with the biased variance over the last dim:
  // ATen's fused kernel computes exactly this (and its gradient) in one pass.
  // bf16/fp16 inputs are normalized in float32 (as autocast does; ATen's reduced-precision
  // kernel is also several times slower on CPU) and cast back.
  if (x.scalar_type() == at::kBFloat16 && x.device().is_cpu() && HasAvx512Bw() &&
      x.numel() > 0) {
    // One pass each way over the bf16 rows (Bf16LayerNormFunction above).
    const at::Tensor x2 = x.contiguous().view({-1, input_dim_});
    return Bf16LayerNormFunction::apply(x2, scale.to(at::kFloat).contiguous(),
                                        theta.GetTensor("bias").to(at::kFloat).contiguous(),
                                        epsilon_)[0]
        .view(x.sizes());
  }
  if (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) {
    return at::layer_norm(x.to(at::kFloat), {input_dim_}, scale.to(at::kFloat),
                          theta.GetTensor("bias").to(at::kFloat), epsilon_)
        .to(x.scalar_type());
  }
  return at::layer_norm(x, {input_dim_}, scale, theta.GetTensor("bias"), epsilon_);
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
  at::Tensor mean, var;
  const bool training = !IsEvalMode() && !is_inference();
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

GLOSSA_REGISTER_CLASS(LayerNorm, "glossa.layers.LayerNorm");
GLOSSA_REGISTER_CLASS(BatchNormLayer, "glossa.layers.BatchNormLayer");

}  // namespace glossa
