// BaseLayer::theta (glossa/layers/base_layer_calls.cc): a tree's casts to fprop_dtype run in one
// autograd node, with the values and the gradients of casting each variable alone. The file's
// other calls are tested beside their users: FPropMap in tests/layers/fprop_map_test.cc, the
// accumulators and the inference plan in tests/layers/base_layer_test.cc, the export refusals in
// tests/inference/bundle_test.cc.
#include "glossa/layers/base_layer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

namespace glossa {
namespace {

// y = relu(x · w + frozen), then the child's; `frozen` is not trainable.
class ThetaTestLayer : public BaseLayer {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseLayer::Params();
    p.Set("cls", ClsOf<ThetaTestLayer>());
    p.Define("child", nullptr, "Optional child layer params.");
    return p;
  }
  explicit ThetaTestLayer(const glossa::Params& p) : BaseLayer(p) {
    CreateVariable("w", {{6, 6}, WeightInit::Gaussian(1.0), DType::kFloat32, {}});
    CreateVariable("frozen",
                   {{6}, WeightInit::Gaussian(1.0), DType::kFloat32, {kNonTrainableCollection}});
    if (p.IsSet("child")) CreateChild("child", p.GetParams("child"));
  }
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& x) const {
    at::Tensor y = at::relu(at::matmul(x, theta.GetTensor("w")) + theta.GetTensor("frozen"));
    if (HasChild("child")) {
      y = GetChildAs<ThetaTestLayer>("child").FProp(theta.at("child").AsMap(), y);
    }
    return y;
  }
};
GLOSSA_REGISTER_CLASS(ThetaTestLayer, "glossa.testing.ThetaTestLayer");

TEST(BaseLayerTheta, ATreesCastsRunInOneNodeWithEachCastsValuesAndGradients) {
  glossa::Params p = ThetaTestLayer::Params();
  p.Set("name", "root").Set("fprop_dtype", DType::kBFloat16).Set("random_seed", 3);
  glossa::Params grandchild = ThetaTestLayer::Params();
  p.Set("child", ThetaTestLayer::Params().Set("child", grandchild));
  auto layer = InstantiateLayer<ThetaTestLayer>(p);
  const NestedMap theta = layer->theta();
  // The reference: each variable cast alone, as Lingvo's _CastToFPropDtype does.
  const NestedMap vars = layer->vars();
  const NestedMap one_by_one = vars.Transform([](const NestedValue& v) {
    return NestedValue(v.AsTensor().to(at::kBFloat16));
  });
  const auto leaves = theta.FlattenTensors(), want = one_by_one.FlattenTensors();
  ASSERT_EQ(leaves.size(), 6u);
  ASSERT_EQ(leaves.size(), want.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    EXPECT_EQ(leaves[i].scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(leaves[i], want[i])) << i;
  }
  // The trainable weights' casts share one node; the non-trainable ones take no gradient.
  EXPECT_NE(theta.GetTensor("w").grad_fn(), nullptr);
  EXPECT_EQ(theta.GetTensor("child.child.w").grad_fn(), theta.GetTensor("w").grad_fn());
  EXPECT_FALSE(theta.GetTensor("frozen").requires_grad());
  const at::Tensor x = at::randn({4, 6}).to(at::kBFloat16);
  const std::vector<at::Tensor> ws = {layer->GetVariable("w"),
                                      layer->GetDescendant("child").GetVariable("w"),
                                      layer->GetDescendant("child.child").GetVariable("w")};
  const auto got = torch::autograd::grad({layer->FProp(theta, x).sum()}, ws);
  const auto ref = torch::autograd::grad({layer->FProp(one_by_one, x).sum()}, ws);
  for (size_t i = 0; i < ws.size(); ++i) {
    EXPECT_EQ(got[i].scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(got[i], ref[i])) << i;
  }
}

}  // namespace
}  // namespace glossa
