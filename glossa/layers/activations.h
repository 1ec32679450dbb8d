// Activation functions by Lingvo's names.
//
//   at::Tensor y = Activate("GELU", x);   // InvalidArgument (with near names) for unknown names
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>
#include <vector>

namespace glossa {

// RELU, RELU6, SIGMOID, TANH, GELU (exact, erf), GELU_APPROXIMATE (tanh), SWISH (x·sigmoid(x)),
// SILU (= SWISH), SOFTPLUS, LEAKY_RELU (slope 0.2, as Lingvo), ELU, SQUARE, NONE.
at::Tensor Activate(std::string_view name, const at::Tensor& x);
const std::vector<std::string>& ActivationNames();
// InvalidArgument naming `where` when `name` is not an activation.
void CheckActivation(std::string_view name, std::string_view where);

}  // namespace glossa
