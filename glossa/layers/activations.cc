#include "glossa/layers/activations.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {

const std::vector<std::string>& ActivationNames() {
  static const std::vector<std::string> kNames = {
      "RELU",     "RELU6",      "SIGMOID", "TANH",   "GELU", "GELU_APPROXIMATE", "SWISH", "SILU",
      "SOFTPLUS", "LEAKY_RELU", "ELU",     "SQUARE", "NONE"};
  return kNames;
}

void CheckActivation(std::string_view name, std::string_view where) {
  const auto& names = ActivationNames();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw InvalidArgumentError(StrCat(where, ": unknown activation ", KeyErrorString(name, names)));
  }
}

at::Tensor Activate(std::string_view name, const at::Tensor& x) {
  if (name == "NONE") return x;
  if (name == "RELU") return at::relu(x);
  if (name == "RELU6") return at::clamp(x, 0.0, 6.0);
  if (name == "SIGMOID") return at::sigmoid(x);
  if (name == "TANH") return at::tanh(x);
  if (name == "GELU") return at::gelu(x);
  if (name == "GELU_APPROXIMATE") return at::gelu(x, "tanh");
  if (name == "SWISH" || name == "SILU") return at::silu(x);
  if (name == "SOFTPLUS") return at::softplus(x);
  if (name == "LEAKY_RELU") return at::leaky_relu(x, 0.2);
  if (name == "ELU") return at::elu(x);
  if (name == "SQUARE") return at::square(x);
  CheckActivation(name, "Activate");
  throw InternalError(StrCat("activation ", name, " has no implementation"));
}

}  // namespace glossa
