#include "glossa/kernels/cast_together.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include "glossa/kernels/gemm.h"

namespace glossa {
namespace {

// float32 -> bf16 through Narrow's one pass (contiguous CPU tensors); anything else ATen's .to().
at::Tensor CastOne(const at::Tensor& x, at::ScalarType dtype) {
  if (x.scalar_type() == at::kFloat && dtype == at::kBFloat16) return Narrow(x.contiguous(), dtype);
  return x.to(dtype);
}

class CastTogetherFunction : public torch::autograd::Function<CastTogetherFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList xs, at::ScalarType dtype) {
    RECORD_USER_SCOPE("fwd:CastTogether");  // seen by --profile_ops
    std::vector<int64_t> from;
    torch::autograd::variable_list out;
    out.reserve(xs.size());
    for (const at::Tensor& x : xs) {
      from.push_back(static_cast<int64_t>(x.scalar_type()));
      out.push_back(CastOne(x, dtype));
    }
    ctx->saved_data["from"] = from;
    ctx->set_materialize_grads(false);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<int64_t> from = ctx->saved_data["from"].toIntVector();
    torch::autograd::variable_list out;
    out.reserve(grads.size() + 1);
    for (size_t i = 0; i < grads.size(); ++i) {
      const auto to = static_cast<at::ScalarType>(from[i]);
      if (!grads[i].defined()) {
        out.emplace_back();
      } else if (grads[i].scalar_type() == at::kBFloat16 && to == at::kFloat) {
        out.push_back(Widen(grads[i]));  // exact, one pass
      } else {
        out.push_back(grads[i].to(to));
      }
    }
    out.emplace_back();  // dtype
    return out;
  }
};

}  // namespace

std::vector<at::Tensor> CastTogether(const std::vector<at::Tensor>& xs, at::ScalarType dtype) {
  if (xs.empty()) return {};
  if (!xs[0].requires_grad() || !at::GradMode::is_enabled()) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> out;
    out.reserve(xs.size());
    for (const at::Tensor& x : xs) out.push_back(CastOne(x, dtype));
    return out;
  }
  return CastTogetherFunction::apply(at::TensorList(xs), dtype);
}

}  // namespace glossa
