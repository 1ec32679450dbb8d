// Adam's update of a variable and its slots, in place (the Adam optimizer in glossa/optim/ calls
// it once per variable with the bias-corrected learning rate):
//   m = b1·m + (1 − b1)·g;  v = b2·v + (1 − b2)·g²;  var −= lr_t · m / (√v + ε).
//
//   AdamUpdate(var, m, v, g, 0.9, 0.997, 1e-9, lr_t);
//
// Float32 contiguous CPU tensors on a CPU with AVX-512 take one fused pass on the kernel threads,
// with the ATen ops' roundings (bit for bit: tests/optim/optimizer_test.cc). Everything else, and
// GLOSSA_KERNELS=reference, takes the reference: the ATen ops (mul_, add_, addcmul_, sqrt,
// add_, addcdiv_). No autograd; the variable's version counter moves on, as in-place ops move it.
//
// `bf16_copy` (optional): where the fused pass runs, it also gives the updated variable rounded to
// bf16 (the bits of .to(at::kBFloat16)), written as each value is updated: the next forward's bf16
// weights without another pass over the float32 ones (BaseLayer::theta). A contiguous bf16 tensor
// of the variable's shape there is written in place (the last step's copy, when nothing else holds
// it); otherwise a new one is made. Undefined where the reference runs.
#pragma once

#include <ATen/core/Tensor.h>

namespace glossa {

void AdamUpdate(const at::Tensor& var, const at::Tensor& m, const at::Tensor& v,
                const at::Tensor& g, double b1, double b2, double eps, double lr_t,
                at::Tensor* bf16_copy = nullptr);
void AdamUpdateReference(const at::Tensor& var, const at::Tensor& m, const at::Tensor& v,
                const at::Tensor& g,
                         double b1, double b2, double eps, double lr_t);

}  // namespace glossa
