#include "glossa/layers/custom_gradient.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include "glossa/core/step_seed.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

NestedMap Fwd(const NestedMap& xs) {
  NestedMap ys;
  ys.Set("y", 2 * xs.GetTensor("x").pow(2));
  return ys;
}

std::pair<double, double> ValueAndGrad(const CustomBakFn& bak) {
  at::Tensor x = at::full({}, 3.0, at::kDouble).requires_grad_(true);
  NestedMap xs{{"x", x}};
  NestedMap ys = CallWithCustomGradient(Fwd, bak, xs);
  at::Tensor y = ys.GetTensor("y");
  auto grads = torch::autograd::grad({y}, {x}, {at::full({}, 5.0, at::kDouble)});
  return {y.item<double>(), grads[0].item<double>()};
}

TEST(CustomGradient, TwoXSquaredWithAndWithoutBak) {
  // fwd(x) = 2x^2 at x = 3 with upstream gradient 5: value 18, gradient 5 * 4x = 60.
  EXPECT_EQ(ValueAndGrad(nullptr), std::make_pair(18.0, 60.0));
  auto bak = [](const NestedMap& xs, const NestedMap&, const NestedMap& dys) {
    NestedMap dxs;
    dxs.Set("x", dys.GetTensor("y") * 4 * xs.GetTensor("x"));
    return dxs;
  };
  EXPECT_EQ(ValueAndGrad(bak), std::make_pair(18.0, 60.0));
}

TEST(CustomGradient, TheNodeAndItsTensorsAreFreedWithTheGraph) {
  // Holding the outputs inside the node would make a cycle (output -> node -> output) that
  // leaks every step's tensors.
  auto bak = [](const NestedMap& xs, const NestedMap&, const NestedMap& dys) {
    return NestedMap{{"x", dys.GetTensor("y") * 4 * xs.GetTensor("x")}};
  };
  at::Tensor x = at::full({1000}, 3.0, at::kDouble).requires_grad_(true);
  std::weak_ptr<torch::autograd::Node> node;
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  std::optional<WeakImpl> y_impl;
  {
    at::Tensor y = CallWithCustomGradient(Fwd, bak, NestedMap{{"x", x}}).GetTensor("y");
    node = y.grad_fn();
    y_impl.emplace(y.getIntrusivePtr());
    EXPECT_FALSE(node.expired());
    y.sum().backward();
  }
  EXPECT_TRUE(node.expired());
  EXPECT_TRUE(y_impl->expired());
  EXPECT_TRUE(at::allclose(x.grad(), at::full({1000}, 12.0, at::kDouble)));
  // Without a backward pass, dropping the outputs frees the node too.
  {
    at::Tensor y = CallWithCustomGradient(Fwd, bak, NestedMap{{"x", x}}).GetTensor("y");
    node = y.grad_fn();
  }
  EXPECT_TRUE(node.expired());
}

TEST(CustomGradient, BakReplacesAutodiff) {
  auto bak = [](const NestedMap& xs, const NestedMap&, const NestedMap& dys) {
    NestedMap dxs;
    dxs.Set("x", dys.GetTensor("y") * 4 * xs.GetTensor("x") + 100);
    return dxs;
  };
  EXPECT_EQ(ValueAndGrad(bak), std::make_pair(18.0, 160.0));
}

TEST(CustomGradient, NestedMapInputsAndOutputsAndYsInBak) {
  at::Tensor a = at::tensor({1.0, 2.0}, at::kDouble).requires_grad_(true);
  at::Tensor b = at::tensor({3.0}, at::kDouble).requires_grad_(true);
  NestedMap xs;
  xs.Set("p.a", a);
  xs.Set("q[0]", b);
  auto fwd = [](const NestedMap& in) {
    NestedMap out;
    out.Set("sum", in.GetTensor("p.a").sum() + in.GetTensor("q[0]").sum());
    out.Set("prod.v", in.GetTensor("p.a") * in.GetTensor("q[0]"));
    return out;
  };
  bool saw_ys = false;
  auto bak = [&](const NestedMap& in, const NestedMap& ys, const NestedMap& dys) {
    saw_ys = at::allclose(ys.GetTensor("prod.v"), in.GetTensor("p.a") * in.GetTensor("q[0]"));
    NestedMap dxs;
    at::Tensor ds = dys.GetTensor("sum");
    at::Tensor dv = dys.GetTensor("prod.v");
    dxs.Set("p.a", ds * at::ones_like(in.GetTensor("p.a")) + dv * in.GetTensor("q[0]"));
    dxs.Set("q[0]", (ds + (dv * in.GetTensor("p.a")).sum()).reshape({1}));
    return dxs;
  };
  for (bool use_bak : {false, true}) {
    NestedMap ys = CallWithCustomGradient(fwd, use_bak ? CustomBakFn(bak) : CustomBakFn(), xs);
    at::Tensor loss = ys.GetTensor("sum") * 2 + ys.GetTensor("prod.v").sum();
    auto g = torch::autograd::grad({loss}, {a, b});
    EXPECT_TRUE(at::allclose(g[0], at::tensor({2.0 + 3.0, 2.0 + 3.0}, at::kDouble))) << use_bak;
    EXPECT_TRUE(at::allclose(g[1], at::tensor({2.0 + 3.0}, at::kDouble))) << use_bak;
  }
  EXPECT_TRUE(saw_ys);
}

TEST(CustomGradient, StepSeedIsResetInsideAndRestoredAfter) {
  ResetStepSeed(50);
  int64_t seen_fwd = -1, seen_bak = -1;
  int64_t bak_step = -1;
  auto fwd = [&](const NestedMap& xs) {
    seen_fwd = GetIncStepSeed();
    return NestedMap{{"y", xs.GetTensor("x") * 2}};
  };
  auto bak = [&](const NestedMap&, const NestedMap&, const NestedMap& dys) {
    seen_bak = GetIncStepSeed();
    bak_step = GetGlobalStep();
    return NestedMap{{"x", dys.GetTensor("y") * 2}};
  };
  at::Tensor x = at::ones({2}).requires_grad_(true);
  NestedMap ys;
  {
    GlobalStepContext step(77);
    ys = CallWithCustomGradient(fwd, bak, NestedMap{{"x", x}});
  }
  EXPECT_EQ(seen_fwd, 0);
  EXPECT_EQ(GetStepSeed(), 50);
  ys.GetTensor("y").sum().backward();
  EXPECT_EQ(seen_bak, 0);
  EXPECT_EQ(bak_step, 77);  // bak runs under the global step fwd saw
  EXPECT_EQ(GetStepSeed(), 50);
  EXPECT_TRUE(at::allclose(x.grad(), at::full({2}, 2.0)));
}

TEST(CustomGradient, BakMustMatchXs) {
  auto bak = [](const NestedMap&, const NestedMap&, const NestedMap&) {
    return NestedMap{{"wrong", at::ones({})}};
  };
  at::Tensor x = at::ones({}).requires_grad_(true);
  NestedMap ys = CallWithCustomGradient(Fwd, bak, NestedMap{{"x", x}});
  EXPECT_THROW(ys.GetTensor("y").backward(), std::exception);
}

}  // namespace
}  // namespace glossa
