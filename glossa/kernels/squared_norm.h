// Σ x² of many tensors at once, in double: the learner's gradient and variable norms.
//
//   std::vector<double> sq = SumsOfSquares({g0, g1, g2});   // sq[i] = Σ gᵢ²
//
// Float32 contiguous CPU tensors go through one parallel pass over all of them: fixed chunks of
// 2^16 elements, each summed in double, the chunks of a tensor added in order, so that the result
// is the same for any thread count (AVX-512 where the CPU has it; a plain loop otherwise and with
// GLOSSA_KERNELS=reference). Any other tensor (float64, bf16, strided, on a device) is
// summed by ATen in float64.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace glossa {

std::vector<double> SumsOfSquares(const std::vector<at::Tensor>& tensors);

// One tensor's Σ x² by ATen in float64: the reference SumsOfSquares is tested against.
double SumOfSquaresReference(const at::Tensor& t);

}  // namespace glossa
