// Many tensors cast to one dtype in one autograd node: a layer tree's float32 master weights in
// its fprop_dtype (BaseLayer::theta, glossa/layers/base_layer.h).
//
//   std::vector<at::Tensor> bf16 = CastTogether({w1, b1, w2}, at::kBFloat16);
//
// Each output equals xs[i].to(dtype) (float32 to bf16 rounded to nearest even as ATen rounds, NaN
// to a quiet NaN: kernels/gemm.h's Narrow), and the backward returns each gradient in its input's
// dtype (bf16 widened exactly). Casting a model's weights one by one cost one cast op and one
// ToCopyBackward node per weight each step (51 of each on the tiny LM in bf16, about a twentieth
// of its step); here the forward is one loop over the tensors and the backward one node.
// Inputs must all require gradients or none (the caller groups them): an input that does not
// would otherwise receive a gradient computed for nothing.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace glossa {

// A variable's copy in its layer's fprop dtype, made by the optimizer as it updates the variable
// (AdamUpdate's bf16_copy), so that the next forward need not read the float32 weights again to
// cast them. It stands for the variable only while the variable is the tensor it was made from,
// unchanged since: the same data and the same version (any in-place change moves the version on).
// A layer keeps one per variable it casts (BaseLayer::VariableInfo::fprop_copy); the learner
// hands it to the optimizer (VarGrad::fprop_copy).
class FpropCopy {
 public:
  // The copy, when it stands for `var` in `dtype`; undefined otherwise.
  at::Tensor For(const at::Tensor& var, at::ScalarType dtype) const;
  // `copy` is now `var` (just updated) in copy's dtype; an undefined copy forgets the last one.
  void Set(const at::Tensor& var, at::Tensor copy);
  // The copy for the updater to write in place, when nothing else holds its data (the last
  // forward's casts are gone); undefined otherwise (a new one is then made). The copy is forgotten.
  at::Tensor TakeForRewrite();

 private:
  at::Tensor copy_;
  const void* data_ = nullptr;
  int64_t version_ = -1;
};

// `ready` (optional, one per input): an input's cast made already (FpropCopy::For), which the
// output then is (without a cast); the gradient flows to the input as for a cast one.
std::vector<at::Tensor> CastTogether(const std::vector<at::Tensor>& xs, at::ScalarType dtype,
                                     const std::vector<at::Tensor>& ready = {});

}  // namespace glossa
