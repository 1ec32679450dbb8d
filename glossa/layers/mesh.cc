#include "glossa/layers/mesh.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
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

// All-reduce forward, identity backward (and its conjugate below).
class ReduceOverAxisFunction : public torch::autograd::Function<ReduceOverAxisFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext*,
                                                const at::Tensor& input, int64_t axis_ptr) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor sum = input.contiguous().clone();
    reinterpret_cast<MeshAxis*>(axis_ptr)->AllReduceSum(sum);
    return {sum};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

class ReplicateOverAxisFunction : public torch::autograd::Function<ReplicateOverAxisFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& input, int64_t axis_ptr) {
    ctx->saved_data["axis"] = axis_ptr;
    return {input.view_as(input)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* axis = reinterpret_cast<MeshAxis*>(ctx->saved_data["axis"].toInt());
    // A gradient the loss did not reach is zeros: the peers still sum theirs.
    at::Tensor sum = grads[0].contiguous().clone();
    axis->AllReduceSum(sum);
    return {sum, at::Tensor()};
  }
};

}  // namespace

at::Tensor ReduceOverAxis(MeshAxis& axis, const at::Tensor& input) {
  return ReduceOverAxisFunction::apply(input, reinterpret_cast<int64_t>(&axis))[0];
}

at::Tensor ReplicateOverAxis(MeshAxis& axis, const at::Tensor& input) {
  return ReplicateOverAxisFunction::apply(input, reinterpret_cast<int64_t>(&axis))[0];
}

WeightSplit ParseWeightSplit(const ParamValue& mapping, int64_t rank, const std::string& what) {
  WeightSplit split;
  if (mapping.is_none()) return split;
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(StrCat(what, ": ", why, " (weight_split_dims_mapping lists, per "
                                       "dim of the weight, None or a mesh axis name such as "
                                       "\"model\"; at most one dim split)"));
  };
  if (!mapping.is_list()) throw bad(StrCat("a value of type ", mapping.KindName(), ", not a list"));
  const auto& list = mapping.AsList();
  if (static_cast<int64_t>(list.size()) != rank) {
    throw bad(StrCat(list.size(), " entries for a weight of ", rank, " dims"));
  }
  for (size_t d = 0; d < list.size(); ++d) {
    if (list[d].is_none()) continue;
    if (list[d].kind() != ParamValue::Kind::kString || list[d].AsString().empty()) {
      throw bad(StrCat("entry ", d, " is a ", list[d].KindName(), ", not None or an axis name"));
    }
    if (split.dim >= 0) throw bad(StrCat("dims ", split.dim, " and ", d, " are both split"));
    split.dim = static_cast<int64_t>(d);
    split.axis = list[d].AsString();
  }
  return split;
}

ParamValue WeightSplitMapping(int64_t rank, int64_t dim, const std::string& axis) {
  ParamValue::List list(static_cast<size_t>(rank));
  list.at(static_cast<size_t>(dim)) = axis;
  return list;
}

void MeshAxis::AllReduceSum(at::Tensor& t) {
  (void)t;
  throw UnimplementedError(StrCat("this mesh axis (", typeid(*this).name(), ") has no all-reduce"));
}

BuildContext& BuildContext::WithAxis(const std::string& name, MeshAxis* axis) {
  std::erase_if(axes_, [&](const auto& a) { return a.first == name; });
  if (axis != nullptr && axis->size() > 1) axes_.emplace_back(name, axis);
  return *this;
}

BuildContext& BuildContext::WithCollection(const std::string& collection) {
  if (std::find(collections_.begin(), collections_.end(), collection) == collections_.end()) {
    collections_.push_back(collection);
  }
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
