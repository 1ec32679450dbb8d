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
                                                at::TensorList xs, at::ScalarType dtype,
                                                const std::vector<at::Tensor>* ready) {
    RECORD_USER_SCOPE("fwd:CastTogether");  // seen by --profile_ops
    std::vector<int64_t> from;
    torch::autograd::variable_list out;
    out.reserve(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      from.push_back(static_cast<int64_t>(xs[i].scalar_type()));
      // A ready cast, as a tensor of its own (sharing its data): the output's autograd history
      // is set on it, not on the copy its owner keeps.
      const bool is_ready = i < ready->size() && (*ready)[i].defined();
      out.push_back(is_ready ? (*ready)[i].detach() : CastOne(xs[i], dtype));
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
    out.emplace_back();  // ready (not a tensor argument: the casts made already, by pointer)
    return out;
  }
};

}  // namespace

at::Tensor FpropCopy::For(const at::Tensor& var, at::ScalarType dtype) const {
  if (!copy_.defined() || copy_.scalar_type() != dtype || !var.defined() ||
      var.data_ptr() != data_ || var._version() != version_ || copy_.sizes() != var.sizes()) {
    return at::Tensor();
  }
  return copy_;
}

void FpropCopy::Set(const at::Tensor& var, at::Tensor copy) {
  copy_ = std::move(copy);
  data_ = copy_.defined() ? var.data_ptr() : nullptr;
  version_ = copy_.defined() ? var._version() : -1;
}

at::Tensor FpropCopy::TakeForRewrite() {
  at::Tensor copy = std::move(copy_);
  copy_ = at::Tensor();
  data_ = nullptr;
  version_ = -1;
  if (!copy.defined() || copy.use_count() != 1 || !copy.storage() ||
      copy.storage().use_count() != 1) {
    return at::Tensor();
  }
  return copy;
}

std::vector<at::Tensor> CastTogether(const std::vector<at::Tensor>& xs, at::ScalarType dtype,
                                     const std::vector<at::Tensor>& ready) {
  if (xs.empty()) return {};
  if (!xs[0].requires_grad() || !at::GradMode::is_enabled()) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> out;
    out.reserve(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      const bool is_ready = i < ready.size() && ready[i].defined();
      out.push_back(is_ready ? ready[i] : CastOne(xs[i], dtype));
    }
    return out;
  }
  return CastTogetherFunction::apply(at::TensorList(xs), dtype, &ready);
}

}  // namespace glossa
