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

#include "glossa/kernels/cast_together.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/optim/learner.h"
#include "glossa/optim/optimizer.h"

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

// Adam's bf16 copy (FpropCopy, glossa/kernels/cast_together.h): after an update, theta's bf16
// weights are the copy the update wrote (no second cast), with the bits of casting the updated
// variable; its gradient still reaches the variable; an in-place change of the variable (a
// restore, say) ends the copy's use, and theta casts again.
TEST(BaseLayerTheta, AdamsBf16CopyStandsForTheVariableUntilItChanges) {
  glossa::Params p = ThetaTestLayer::Params();
  p.Set("name", "root").Set("fprop_dtype", DType::kBFloat16).Set("random_seed", 5);
  p.Set("child", ThetaTestLayer::Params());
  auto layer = InstantiateLayer<ThetaTestLayer>(p);
  std::vector<LearnerVariable> vars;
  for (const LearnerVariable& v : LearnerVariables(*layer)) {
    if (v.trainable) vars.push_back(v);
  }
  ASSERT_EQ(vars.size(), 2u);
  for (const auto& v : vars) ASSERT_NE(v.fprop_copy, nullptr) << v.name;
  auto adam = Adam::Params().Instantiate<Optimizer>();
  const at::Tensor x = at::randn({4, 6}).to(at::kBFloat16);
  const std::vector<at::Tensor> ws = {layer->GetVariable("w"),
                                      layer->GetDescendant("child").GetVariable("w")};
  const bool fused = CpuHasAvx512BwVl() && !KernelsForcedToReference();
  std::vector<const void*> copy_data(ws.size(), nullptr);
  for (int step = 0; step < 4; ++step) {
    std::vector<VarGrad> var_grads;
    {
      const NestedMap theta = layer->theta();
      const std::vector<at::Tensor> cast_w = {theta.GetTensor("w"), theta.GetTensor("child.w")};
      for (size_t i = 0; i < ws.size(); ++i) {
        EXPECT_TRUE(at::equal(cast_w[i], ws[i].to(at::kBFloat16))) << "step " << step << " " << i;
        // From the second step the cast is the copy's data (where the fused update runs).
        const at::Tensor copy = vars[i].fprop_copy->For(ws[i], at::kBFloat16);
        EXPECT_EQ(copy.defined(), step > 0 && fused);
        if (copy.defined()) {
          EXPECT_EQ(cast_w[i].data_ptr(), copy.data_ptr()) << i;
        }
      }
      // The gradients through theta are those through a plain cast of each variable.
      const auto got = torch::autograd::grad({layer->FProp(theta, x).sum()}, ws);
      NestedMap plain = theta;
      plain.Set("w", ws[0].to(at::kBFloat16));
      plain.Set("child.w", ws[1].to(at::kBFloat16));
      const auto want = torch::autograd::grad({layer->FProp(plain, x).sum()}, ws);
      for (size_t i = 0; i < ws.size(); ++i) {
        EXPECT_TRUE(at::equal(got[i], want[i])) << "step " << step << " " << i;
        var_grads.push_back({vars[i].name, vars[i].value, got[i], false, 1.0,
                             vars[i].fprop_copy});
      }
    }  // the forward's casts are gone: the update rewrites the copies in place
    adam->Apply(0.01, var_grads, step);
    for (size_t i = 0; i < ws.size() && fused; ++i) {
      const void* data = vars[i].fprop_copy->For(ws[i], at::kBFloat16).data_ptr();
      if (step >= 2) {
        EXPECT_EQ(data, copy_data[i]) << "step " << step << " " << i;
      }
      copy_data[i] = data;
    }
  }
  // A change in place (as a restore's copy_) ends the copy's use.
  {
    at::NoGradGuard no_grad;
    ws[0].mul_(2);
  }
  EXPECT_FALSE(vars[0].fprop_copy->For(ws[0], at::kBFloat16).defined());
  const NestedMap theta = layer->theta();
  EXPECT_TRUE(at::equal(theta.GetTensor("w"), ws[0].to(at::kBFloat16)));
}

}  // namespace
}  // namespace glossa
