// A complete custom layer: a gated feed-forward block with a residual connection.
// Compiled into the test binary (tests/CMakeLists.txt); docs/layers.md shows this file verbatim.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "glossa/layers/base_layer.h"
#include "glossa/layers/normalization.h"

namespace example {

using glossa::BaseLayer;
using glossa::NestedMap;

// y = x + w_out · (sigmoid(norm(x) · w_gate) ⊙ (norm(x) · w_value))
class GatedFeedForward : public BaseLayer {
 public:
  // 1. Params: the base layer's fields plus this layer's, each with a doc string.
  static glossa::Params Params() {
    glossa::Params p = BaseLayer::Params();
    p.Set("cls", glossa::ClsOf<GatedFeedForward>());
    p.Define("input_dim", 0, "Depth of the input and output.");
    p.Define("hidden_dim", 0, "Depth of the gated hidden layer.");
    p.Define("norm", glossa::LayerNorm::Params(), "Params of the input layer norm.");
    return p;
  }

  // 2. Construction: variables and children, created only here.
  explicit GatedFeedForward(const glossa::Params& p) : BaseLayer(p) {
    const int64_t d = params().GetInt("input_dim"), h = params().GetInt("hidden_dim");
    const auto init = glossa::WeightInit::FromParams(params().GetParams("params_init"));
    const auto dtype = params().Get("dtype").AsDType();
    CreateVariable("w_gate", glossa::WeightParams({d, h}, init, dtype));
    CreateVariable("w_value", glossa::WeightParams({d, h}, init, dtype));
    CreateVariable("w_out", glossa::WeightParams({h, d}, init, dtype));
    CreateChild("norm", params().GetParams("norm").Copy().Set("input_dim", d));
  }

  // 3. FProp reads weights only from `theta`, so it runs on any weights.
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& x) const {
    const auto& norm = GetChildAs<glossa::LayerNorm>("norm");
    at::Tensor n = norm.FProp(theta.at("norm").AsMap(), CastToFPropDtype(x));
    at::Tensor gate = at::sigmoid(at::matmul(n, theta.GetTensor("w_gate")));
    at::Tensor value = at::matmul(n, theta.GetTensor("w_value"));
    return x + at::matmul(gate * value, theta.GetTensor("w_out"));
  }
};

// 4. Registration: the key is what `cls` holds in params text.
GLOSSA_REGISTER_CLASS(GatedFeedForward, "example.GatedFeedForward");

TEST(DocsExample, GatedFeedForwardBuildsRunsAndTrains) {
  glossa::Params p = GatedFeedForward::Params();
  p.FromText("name : 'ffn'\ninput_dim : 4\nhidden_dim : 8\nrandom_seed : 1\n");
  auto layer = glossa::InstantiateLayer<GatedFeedForward>(p);

  for (const auto& [info, value] : layer->AllVariables()) {
    std::cout << info.full_name << " " << value.sizes() << "\n";  // ffn/w_gate [4, 8], ...
  }
  at::Tensor x = at::randn({2, 3, 4});
  at::Tensor y = layer->FProp(layer->theta(), x);
  EXPECT_EQ(y.sizes(), x.sizes());
  y.square().sum().backward();
  EXPECT_TRUE(layer->GetVariable("w_gate").grad().defined());
  EXPECT_TRUE(layer->GetChild("norm").GetVariable("scale").grad().defined());
}

}  // namespace example
