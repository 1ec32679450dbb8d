// A complete custom layer: a gated feed-forward block with a residual connection.
// Compiled into the test binary (tests/CMakeLists.txt); docs/layers.md shows this file verbatim.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "glossa/layers/base_layer.h"
#include "glossa/layers/block.h"
#include "glossa/layers/normalization.h"

namespace example {

using glossa::BaseLayer;
using glossa::NestedMap;

// y = x + w_out · (sigmoid(norm(x) · w_gate) ⊙ (norm(x) · w_value))
class GatedFeedForward : public BaseLayer, public glossa::Block {
 public:
  // 1. Params: the base layer's fields plus this layer's, each with a doc string; a sublayer is a
  //    template (sub-Params), so all its fields stay reachable: `norm.epsilon : 1e-5`.
  static glossa::Params Params() {
    glossa::Params p = BaseLayer::Params();
    p.Set("cls", glossa::ClsOf<GatedFeedForward>());
    p.Define("input_dim", 0, "Depth of the input and output.");
    p.Define("hidden_dim", 0, "Depth of the gated hidden layer.");
    p.Define("norm", glossa::LayerNorm::Params(), "Params of the input layer norm.");
    return p;
  }

  // 2. Construction: Params are read here, variables and children created here, and the child
  //    kept as a typed handle.
  explicit GatedFeedForward(const glossa::Params& p) : BaseLayer(p) {
    const int64_t d = p.GetInt("input_dim"), h = p.GetInt("hidden_dim");
    const auto init = glossa::WeightInit::FromParams(p.GetParams("params_init"));
    const auto dtype = p.Get("dtype").AsDType();
    CreateVariable("w_gate", glossa::WeightParams({d, h}, init, dtype));
    CreateVariable("w_value", glossa::WeightParams({d, h}, init, dtype));
    CreateVariable("w_out", glossa::WeightParams({h, d}, init, dtype));
    norm_ = CreateChild<glossa::LayerNorm>("norm", p.GetParams("norm").Copy().Set("input_dim", d));
  }

  // 3. FProp reads weights only from `theta` (so it runs on any weights) and members only (no
  //    Params, no lookups by name): Lingvo's self.norm.FProp(theta.norm, x).
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& x) const {
    at::Tensor n = norm_->FProp(norm_.Theta(theta), CastToFPropDtype(x));
    at::Tensor gate = at::sigmoid(at::matmul(n, theta.GetTensor("w_gate")));
    at::Tensor value = at::matmul(n, theta.GetTensor("w_value"));
    return x + at::matmul(gate * value, theta.GetTensor("w_out"));
  }

  // 4. The Block interface: the layer drops into SequentialLayer, RevNet, GPipe, or a
  //    TransformerLayer's tr_fflayer_tpl without registering anything.
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor&) const override {
    return FProp(theta, x);
  }

 private:
  glossa::Child<glossa::LayerNorm> norm_;
};

// 5. Registration: the key is what `cls` holds in params text.
GLOSSA_REGISTER_CLASS(GatedFeedForward, "example.GatedFeedForward");

TEST(DocsExample, GatedFeedForwardBuildsRunsAndTrains) {
  glossa::Params p = GatedFeedForward::Params();
  p.FromText("name : 'ffn'\ninput_dim : 4\nhidden_dim : 8\nrandom_seed : 1\nnorm.epsilon : 1e-5\n");
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

  // Two of them in a SequentialLayer: the second sees the first's output.
  glossa::Params seq = glossa::SequentialLayer::Params();
  seq.Set("name", "seq").Set("sub", glossa::ParamValue::List{p, p});
  auto two = glossa::InstantiateLayer<glossa::SequentialLayer>(seq);
  const NestedMap theta = two->theta();
  const auto& first = dynamic_cast<const GatedFeedForward&>(*two->GetChildren("sub")[0]);
  const auto& second = dynamic_cast<const GatedFeedForward&>(*two->GetChildren("sub")[1]);
  at::Tensor want = second.FProp(theta.GetItem("sub[1]").AsMap(),
                                 first.FProp(theta.GetItem("sub[0]").AsMap(), x));
  EXPECT_TRUE(at::allclose(two->FProp(theta, x), want));
}

}  // namespace example
