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

#include <vector>

namespace glossa {

std::vector<at::Tensor> CastTogether(const std::vector<at::Tensor>& xs, at::ScalarType dtype);

}  // namespace glossa
