#include "glossa/kernels/residual_add.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"

namespace glossa {
namespace {

class ResidualAddFunction : public torch::autograd::Function<ResidualAddFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& y) {
    at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
    const float *xp = x.data_ptr<float>(), *yp = y.data_ptr<float>();
    float* op = out.data_ptr<float>();
    KernelParallelFor(0, x.numel(), ParallelGrain(8), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) op[i] = xp[i] + yp[i];
    });
    ctx->set_materialize_grads(false);
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], grads[0]};
  }
};

}  // namespace

at::Tensor ResidualAdd(const at::Tensor& x, const at::Tensor& y) {
  if (x.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat && x.device().is_cpu() &&
      y.device().is_cpu() && x.sizes() == y.sizes() && x.is_contiguous() && y.is_contiguous() &&
      x.numel() >= kResidualAddMinNumel && !KernelsForcedToReference()) {
    return ResidualAddFunction::apply(x, y)[0];
  }
  return x + y;
}

}  // namespace glossa
