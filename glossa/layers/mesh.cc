#include "glossa/layers/mesh.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <typeinfo>
#include <utility>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

class AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& input, int64_t axis_ptr) {
    ctx->saved_data["axis"] = axis_ptr;
    at::AutoDispatchBelowADInplaceOrView guard;
    return {reinterpret_cast<MeshAxis*>(axis_ptr)->ExchangeBlocks(input.contiguous())};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* axis = reinterpret_cast<MeshAxis*>(ctx->saved_data["axis"].toInt());
    // A gradient the loss did not reach is zeros: the peers still exchange theirs.
    const at::Tensor g = grads[0];
    return {axis->ExchangeBlocks(g.contiguous()), at::Tensor()};
  }
};

}  // namespace

BuildContext& BuildContext::WithAxis(const std::string& name, MeshAxis* axis) {
  std::erase_if(axes_, [&](const auto& a) { return a.first == name; });
  if (axis != nullptr && axis->size() > 1) axes_.emplace_back(name, axis);
  return *this;
}

MeshAxis* BuildContext::axis(const std::string& name) const {
  for (const auto& [n, a] : axes_) {
    if (n == name) return a;
  }
  return nullptr;
}

at::Tensor AllToAll(MeshAxis& axis, const at::Tensor& input) {
  if (input.dim() < 1 || input.size(0) % axis.size() != 0) {
    throw InvalidArgumentError(StrCat("AllToAll: dim 0 of ", input.sizes(),
                                      " does not split into ", axis.size(), " equal blocks"));
  }
  return AllToAllFunction::apply(input, reinterpret_cast<int64_t>(&axis))[0];
}

void MeshAxis::SendTo(const at::Tensor& t, int dst) {
  (void)t;
  throw UnimplementedError(StrCat("this mesh axis (", typeid(*this).name(),
                                  ") has no point-to-point send (to rank ", dst, ")"));
}

void MeshAxis::RecvFrom(at::Tensor& out, int src) {
  (void)out;
  throw UnimplementedError(StrCat("this mesh axis (", typeid(*this).name(),
                                  ") has no point-to-point recv (from rank ", src, ")"));
}

void MeshAxis::Broadcast(at::Tensor& t, int root) {
  (void)t;
  throw UnimplementedError(StrCat("this mesh axis (", typeid(*this).name(),
                                  ") has no broadcast (from rank ", root, ")"));
}

}  // namespace glossa
