// Layer norm over the last dimension: (x − mean) · rsqrt(var + eps) · scale + bias, the biased
// variance, as ATen's layer_norm (LayerNorm in glossa/layers/normalization.h calls it).
//
//   at::Tensor y = LayerNormLastDim(x, scale, bias, 1e-6);  // x [..., D], scale and bias [D]
//
// bf16 and float32 rows on a CPU with AVX-512 BW/VL run one pass each way on the kernel threads
// (read the row, normalize in float32, write the row's dtype; the scale and bias gradients summed
// over fixed blocks of 64 rows in order, so the same on any number of threads; a row's bits do
// not depend on the other rows). Otherwise, and with GLOSSA_KERNELS=reference or a non-CPU
// tensor, the reference: ATen's layer_norm, bf16/fp16 normalized in float32 and cast back.
#pragma once

#include <ATen/core/Tensor.h>

namespace glossa {

at::Tensor LayerNormLastDim(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& bias,
                            double epsilon);
at::Tensor LayerNormLastDimReference(const at::Tensor& x, const at::Tensor& scale,
                                     const at::Tensor& bias, double epsilon);

}  // namespace glossa
