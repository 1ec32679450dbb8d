#include "glossa/layers/base_layer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "glossa/core/step_seed.h"
#include "glossa/kernels/attention_core.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/int8_gemm.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/process_seed.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// A layer with a weight `w` [dim, dim], a non-trainable counter, and children from its params.
class TestLayer : public BaseLayer {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseLayer::Params();
    p.Set("cls", ClsOf<TestLayer>());
    p.Define("dim", 2, "Width.");
    p.Define("child", nullptr, "Optional child layer params.");
    p.Define("layers", nullptr, "Optional list or dict of child layer params.");
    return p;
  }
  explicit TestLayer(const glossa::Params& p) : BaseLayer(p) {
    const int64_t d = p.GetInt("dim");
    CreateVariable("w", {{d, d},
                         WeightInit::FromParams(params().GetParams("params_init")),
                         params().Get("dtype").AsDType(),
                         {}});
    CreateVariable("total_samples",
                   {{}, WeightInit::Constant(0), DType::kInt64, {kNonTrainableCollection}});
    if (p.IsSet("child")) CreateChild("child", p.GetParams("child"));
    if (p.IsSet("layers")) CreateChildren("layers", p.Get("layers"));
  }
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& x) const {
    at::Tensor y = at::matmul(x, theta.GetTensor("w"));
    if (HasChild("child")) {
      y = GetChildAs<TestLayer>("child").FProp(theta.at("child").AsMap(), y);
    }
    return y;
  }
  void CreateLate() { CreateVariable("late", {{1}}); }
};
GLOSSA_REGISTER_CLASS(TestLayer, "glossa.testing.TestLayer");

class CountingAccumulator : public Accumulator {
 public:
  at::Tensor DefaultValue() const override { return at::zeros({}); }
};

class AccLayer : public BaseLayer {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseLayer::Params();
    p.Set("cls", ClsOf<AccLayer>());
    return p;
  }
  explicit AccLayer(const glossa::Params& p) : BaseLayer(p) {
    RegisterAccumulator("count", std::make_unique<CountingAccumulator>());
  }
};
GLOSSA_REGISTER_CLASS(AccLayer, "glossa.testing.AccLayer");

glossa::Params Named(glossa::Params p, const std::string& name) {
  p.Set("name", name);
  return p;
}

TEST(BaseLayer, ParamsDefineAndDocumentLingvosFields) {
  glossa::Params p = BaseLayer::Params();
  for (const char* key : {"name", "dtype", "fprop_dtype", "random_seed", "vn", "params_init",
                          "is_inference", "skip_lp_regularization"}) {
    ASSERT_TRUE(p.Contains(key)) << key;
    EXPECT_FALSE(p.Doc(key).empty()) << key;
  }
  EXPECT_EQ(p.Get("dtype").AsDType(), DType::kFloat32);
  EXPECT_TRUE(WeightInit::FromParams(p.GetParams("params_init")).IsDefault());
  EXPECT_TRUE(p.GetParams("vn").Contains("global_vn"));
  EXPECT_ERROR_CONTAINS(InstantiateLayer(TestLayer::Params()), InvalidArgumentError,
                        "must set `name`");
  // Names have a length limit (they become variable names, checkpoint keys and summary tags).
  EXPECT_NO_THROW(InstantiateLayer(Named(TestLayer::Params(), std::string(256, 'a'))));
  EXPECT_ERROR_CONTAINS(InstantiateLayer(Named(TestLayer::Params(), std::string(30000, 'a'))),
                        InvalidArgumentError, "is 30000 bytes; the limit is 256");
}

TEST(BaseLayer, VariablesHaveScopedFullNamesAndNestedVars) {
  glossa::Params child = Named(TestLayer::Params(), "");
  glossa::Params root = Named(TestLayer::Params(), "root");
  root.Set("random_seed", 7);
  root.Set("child", child);
  glossa::Params named = TestLayer::Params();
  named.Set("name", "custom");
  root.Set("layers", ParamValue::List{TestLayer::Params(), named, TestLayer::Params()});
  auto layer = InstantiateLayer<TestLayer>(root);
  std::vector<std::string> names;
  for (const auto& [info, t] : layer->AllVariables()) names.push_back(info.full_name);
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "root/w", "root/total_samples", "root/child/w", "root/child/total_samples",
                "root/layers_0/w", "root/layers_0/total_samples", "root/custom/w",
                "root/custom/total_samples", "root/layers_1/w", "root/layers_1/total_samples"}));
  NestedMap vars = layer->vars();
  EXPECT_EQ(vars.Keys(), (std::vector<std::string>{
                             "child.total_samples", "child.w", "layers[0].total_samples",
                             "layers[0].w", "layers[1].total_samples", "layers[1].w",
                             "layers[2].total_samples", "layers[2].w", "total_samples", "w"}));
  EXPECT_TRUE(vars.GetTensor("w").is_same(layer->GetVariable("w")));
  EXPECT_TRUE(vars.GetTensor("w").requires_grad());
  EXPECT_FALSE(vars.GetTensor("total_samples").requires_grad());
  EXPECT_EQ(layer->GetDescendant("layers[1]").scope(), "root/custom");
  EXPECT_EQ(layer->GetDescendant("child").path(), "root.child");
  EXPECT_ERROR_CONTAINS(layer->GetDescendant("layers[5]"), NotFoundError, "no element [5]");
  EXPECT_ERROR_CONTAINS(layer->GetDescendant("childd"), NotFoundError, "did you mean: [child]");
  EXPECT_EQ(layer->GetChildren("layers").size(), 3u);
}

TEST(BaseLayer, DictChildrenKeepTheirStructure) {
  glossa::Params root = Named(TestLayer::Params(), "root");
  root.Set("layers", ParamValue::Dict{{"b", TestLayer::Params()},
                                      {"a", ParamValue::List{TestLayer::Params()}}});
  auto layer = InstantiateLayer<TestLayer>(root);
  EXPECT_TRUE(layer->vars().Has("layers.a[0].w"));
  EXPECT_TRUE(layer->vars().Has("layers.b.w"));
  // Unnamed children are numbered in flatten order: dict keys sorted, lists by index.
  EXPECT_EQ(layer->GetDescendant("layers.a[0]").scope(), "root/layers_0");
  EXPECT_EQ(layer->GetDescendant("layers.b").scope(), "root/layers_1");
}

TEST(BaseLayer, InitIsDeterministicGivenSeedAndFullName) {
  glossa::Params p = Named(TestLayer::Params(), "root");
  p.Set("random_seed", 1234).Set("dim", 8).Set("child", TestLayer::Params().Set("dim", 8));
  auto a = InstantiateLayer<TestLayer>(p);
  auto b = InstantiateLayer<TestLayer>(p);
  EXPECT_TRUE(at::equal(a->GetVariable("w"), b->GetVariable("w")));
  // Same seed, different full name: different values.
  EXPECT_FALSE(at::equal(a->GetVariable("w"), a->GetChild("child").GetVariable("w")));
  p.Set("random_seed", 1235);
  auto c = InstantiateLayer<TestLayer>(p);
  EXPECT_FALSE(at::equal(a->GetVariable("w"), c->GetVariable("w")));
  // A WeightInit seed overrides the layer's.
  p.Set("params_init", WeightInit::Gaussian(1.0, 5).ToParams());
  auto d = InstantiateLayer<TestLayer>(p);
  p.Set("random_seed", 999);
  auto e = InstantiateLayer<TestLayer>(p);
  EXPECT_TRUE(at::equal(d->GetVariable("w"), e->GetVariable("w")));
}

// glossa/layers/process_seed.cc: a layer without any seed draws the process's seed, once per
// process, and counts each variable initialized from it; a seeded layer does not.
TEST(BaseLayer, VariablesWithoutASeedDrawTheProcessSeedAndCountIt) {
  const int64_t before = ProcessRandomSeedUses();
  auto unseeded = InstantiateLayer<TestLayer>(Named(TestLayer::Params(), "root").Set("dim", 4));
  const int64_t after = ProcessRandomSeedUses();
  EXPECT_GE(after, before + 1);
  EXPECT_EQ(ProcessRandomSeed(), ProcessRandomSeed());
  auto seeded = InstantiateLayer<TestLayer>(
      Named(TestLayer::Params(), "root").Set("dim", 4).Set("random_seed", ProcessRandomSeed()));
  EXPECT_EQ(ProcessRandomSeedUses(), after);
  EXPECT_TRUE(at::equal(unseeded->GetVariable("w"), seeded->GetVariable("w")));
}

// glossa/layers/layer_scopes.cc: the execution-mode scopes nest and restore on this thread.
TEST(BaseLayer, ModeScopesNestAndRestore) {
  EXPECT_FALSE(IsEvalMode());
  {
    EvalModeScope eval;
    EXPECT_TRUE(IsEvalMode());
    {
      EvalModeScope train(false);
      EXPECT_FALSE(IsEvalMode());
    }
    EXPECT_TRUE(IsEvalMode());
  }
  EXPECT_FALSE(IsEvalMode());
  EXPECT_EQ(VariableStubScope::Current(), nullptr);
  {
    VariableStubScope outer;
    {
      VariableStubScope inner;
      EXPECT_EQ(VariableStubScope::Current(), &inner);
    }
    EXPECT_EQ(VariableStubScope::Current(), &outer);
  }
  EXPECT_EQ(VariableStubScope::Current(), nullptr);
  auto collections_of_w = [](const BaseLayer& l) {
    for (const auto& info : l.variable_infos()) {
      if (info.name == "w") return info.params.collections;
    }
    return std::vector<std::string>{};
  };
  // Collections come from the build context, passed down the construction stack: a parent's
  // CreateChildrenIn gives them to its children (a pipeline stage's cells), never a thread's scope.
  auto tagged = InstantiateLayer<TestLayer>(
      Named(TestLayer::Params(), "t").Set("random_seed", 1),
      BuildContext().WithCollection("stage_a").WithCollection("stage_b"));
  const auto tc = collections_of_w(*tagged);
  EXPECT_NE(std::find(tc.begin(), tc.end(), "stage_a"), tc.end());
  EXPECT_NE(std::find(tc.begin(), tc.end(), "stage_b"), tc.end());
  auto plain = InstantiateLayer<TestLayer>(Named(TestLayer::Params(), "t").Set("random_seed", 1));
  const auto c = collections_of_w(*plain);
  EXPECT_EQ(std::find(c.begin(), c.end(), "stage_a"), c.end());
}

TEST(BaseLayer, CopyBaseParamsFillsOnlyDefaults) {
  glossa::Params parent = TestLayer::Params();
  parent.Set("dtype", DType::kFloat64).Set("random_seed", 3).Set("is_inference", true);
  parent.Set("fprop_dtype", DType::kBFloat16).Set("skip_lp_regularization", true);
  parent.Set("params_init", WeightInit::Gaussian(0.5).ToParams());
  parent.Set("vn.global_vn", true);
  glossa::Params child = TestLayer::Params();
  BaseLayer::CopyBaseParams(parent, child);
  EXPECT_EQ(child.Get("dtype").AsDType(), DType::kFloat64);
  EXPECT_EQ(child.GetInt("random_seed"), 3);
  EXPECT_TRUE(child.GetBool("is_inference"));
  EXPECT_EQ(child.Get("fprop_dtype").AsDType(), DType::kBFloat16);
  EXPECT_TRUE(child.GetBool("skip_lp_regularization"));
  EXPECT_EQ(WeightInit::FromParams(child.GetParams("params_init")), WeightInit::Gaussian(0.5));
  EXPECT_TRUE(child.GetBool("vn.global_vn"));
  glossa::Params set_child = TestLayer::Params();
  set_child.Set("dtype", DType::kFloat16).Set("random_seed", 9).Set("is_inference", false);
  set_child.Set("params_init", WeightInit::Uniform(0.1).ToParams()).Set("vn.scale", 0.5);
  BaseLayer::CopyBaseParams(parent, set_child);
  EXPECT_EQ(set_child.Get("dtype").AsDType(), DType::kFloat16);
  EXPECT_EQ(set_child.GetInt("random_seed"), 9);
  EXPECT_FALSE(set_child.GetBool("is_inference"));
  EXPECT_EQ(WeightInit::FromParams(set_child.GetParams("params_init")), WeightInit::Uniform(0.1));
  EXPECT_FALSE(set_child.GetBool("vn.global_vn"));  // vn differs from default: kept whole
  // A child explicitly set to float32 is overwritten, as in Lingvo.
  glossa::Params f32 = TestLayer::Params();
  f32.Set("dtype", DType::kFloat32);
  EXPECT_EQ(BaseLayer::CopyBaseParams(parent, f32).Get("dtype").AsDType(), DType::kFloat64);
}

TEST(BaseLayer, ChildrenInheritBaseParamsAtConstruction) {
  glossa::Params p = Named(TestLayer::Params(), "root");
  p.Set("dtype", DType::kFloat64).Set("random_seed", 5).Set("child", TestLayer::Params());
  auto layer = InstantiateLayer<TestLayer>(p);
  EXPECT_EQ(layer->GetChild("child").GetVariable("w").scalar_type(), at::kDouble);
  EXPECT_EQ(layer->GetChild("child").params().GetInt("random_seed"), 5);
  EXPECT_TRUE(layer->params().IsFrozen());
}

TEST(BaseLayer, ConstructionOnlyOperationsAndNameChecks) {
  auto layer = InstantiateLayer<TestLayer>(Named(TestLayer::Params(), "root"));
  EXPECT_ERROR_CONTAINS(layer->CreateLate(), FailedPreconditionError,
                        "CreateVariable is only allowed during construction");
  class Dup : public BaseLayer {
   public:
    explicit Dup(const glossa::Params& p) : BaseLayer(p) {
      CreateVariable("x", {{1}});
      CreateChild("x", Named(TestLayer::Params(), ""));
    }
  };
  EXPECT_ERROR_CONTAINS(Dup(Named(TestLayer::Params(), "d")), InvalidArgumentError,
                        "child name 'x' is already used");
  class BadName : public BaseLayer {
   public:
    explicit BadName(const glossa::Params& p) : BaseLayer(p) { CreateVariable("1x", {{1}}); }
  };
  EXPECT_ERROR_CONTAINS(BadName(Named(TestLayer::Params(), "d")), InvalidArgumentError,
                        "invalid variable name");
}

TEST(BaseLayer, FPropRunsOnAnyTheta) {
  glossa::Params p = Named(TestLayer::Params(), "root");
  p.Set("random_seed", 1);
  auto layer = InstantiateLayer<TestLayer>(p);
  at::Tensor x = at::ones({1, 2});
  NestedMap theta = layer->theta();
  NestedMap other = theta.Transform([](const NestedValue& v) {
    return v.is_tensor() && v.AsTensor().is_floating_point() ? NestedValue(at::eye(2)) : v;
  });
  EXPECT_TRUE(at::allclose(layer->FProp(other, x), x));
  EXPECT_TRUE(at::allclose(layer->FProp(theta, x), at::matmul(x, layer->GetVariable("w"))));
}

TEST(BaseLayer, ThetaCastsToFPropDtypeOnly) {
  glossa::Params p = Named(TestLayer::Params(), "root");
  p.Set("fprop_dtype", DType::kBFloat16);
  auto layer = InstantiateLayer<TestLayer>(p);
  NestedMap theta = layer->theta();
  EXPECT_EQ(theta.GetTensor("w").scalar_type(), at::kBFloat16);
  EXPECT_EQ(theta.GetTensor("total_samples").scalar_type(), at::kLong);  // not dtype: not cast
  EXPECT_EQ(layer->GetVariable("w").scalar_type(), at::kFloat);
  EXPECT_EQ(layer->CastToFPropDtype(at::ones({2}, at::kDouble)).scalar_type(), at::kBFloat16);
  EXPECT_EQ(layer->CastToFPropDtype(at::ones({2}, at::kLong)).scalar_type(), at::kLong);
}

class FakeEma : public EmaSource {
 public:
  std::optional<at::Tensor> Average(const std::string& name) const override {
    if (name == "root/child/w") return at::full({2, 2}, 42.0);
    return std::nullopt;
  }
};

TEST(BaseLayer, EvalThetaReadsEmaAveragesFromTheRoot) {
  glossa::Params p = Named(TestLayer::Params(), "root");
  p.Set("child", TestLayer::Params());
  auto layer = InstantiateLayer<TestLayer>(p);
  layer->SetEma(std::make_shared<FakeEma>());
  EXPECT_FALSE(at::equal(layer->theta().GetTensor("child.w"), at::full({2, 2}, 42.0)));
  {
    EvalModeScope eval;
    EXPECT_TRUE(at::equal(layer->theta().GetTensor("child.w"), at::full({2, 2}, 42.0)));
    EXPECT_TRUE(layer->theta().GetTensor("w").is_same(layer->GetVariable("w")));
  }
  glossa::Params inference = p.Copy();
  inference.Set("is_inference", true);
  auto inf_layer = InstantiateLayer<TestLayer>(inference);
  inf_layer->SetEma(std::make_shared<FakeEma>());
  EvalModeScope eval;
  EXPECT_FALSE(at::equal(inf_layer->theta().GetTensor("child.w"), at::full({2, 2}, 42.0)));
}

TEST(BaseLayer, GlobalVariationalNoiseInTrainingOnly) {
  glossa::Params p = Named(TestLayer::Params(), "root");
  p.Set("random_seed", 3).Set("vn.global_vn", true).Set("vn.scale", 0.1);
  auto layer = InstantiateLayer<TestLayer>(p);
  GlobalStepContext step(5);
  ResetStepSeed();
  at::Tensor noisy = layer->theta().GetTensor("w");
  EXPECT_FALSE(at::equal(noisy, layer->GetVariable("w")));
  EXPECT_LT((noisy - layer->GetVariable("w")).abs().max().item<double>(), 0.1 * 6);
  ResetStepSeed();
  EXPECT_TRUE(at::equal(noisy, layer->theta().GetTensor("w")));  // replayable
  EvalModeScope eval;
  EXPECT_TRUE(at::equal(layer->theta().GetTensor("w"), layer->GetVariable("w")));
}

TEST(BaseLayer, StubModeSharesZeroTensorsPerShapeAndDtype) {
  glossa::Params p = Named(TestLayer::Params(), "root");
  p.Set("child", TestLayer::Params())
      .Set("layers", ParamValue::List{TestLayer::Params().Set("dim", 3)});
  VariableStubScope stubs;
  auto layer = InstantiateLayer<TestLayer>(p);
  EXPECT_TRUE(layer->GetVariable("w").is_same(layer->GetChild("child").GetVariable("w")));
  EXPECT_TRUE(at::equal(layer->GetVariable("w"), at::zeros({2, 2})));
  EXPECT_FALSE(
      layer->GetVariable("total_samples")
          .is_same(layer->GetChild("child").GetVariable("total_samples")));  // real variables
  EXPECT_EQ(stubs.num_cached(), 2u);  // [2,2] and [3,3] float32
}

TEST(BaseLayer, AccumulatorsRegisterGetSetResetAndCountDisables) {
  glossa::Params p = Named(TestLayer::Params(), "root");
  p.Set("layers", ParamValue::List{AccLayer::Params(), AccLayer::Params()});
  auto layer = InstantiateLayer<TestLayer>(p);
  NestedMap values = layer->GetAccumulatorValues();
  EXPECT_EQ(values.Keys(), (std::vector<std::string>{"layers[0].count", "layers[1].count"}));
  values.Set("layers[1].count", at::full({}, 5.0));
  layer->SetAccumulatorValues(values);
  Accumulator& acc = layer->GetDescendant("layers[1]").GetAccumulator("count");
  EXPECT_EQ(acc.GetValue().item<double>(), 5.0);
  layer->DisableAccumulators();
  layer->DisableAccumulators();
  EXPECT_EQ(acc.GetValue().item<double>(), 0.0);  // disabled: default
  acc.SetValue(at::full({}, 9.0));                // ignored while disabled
  layer->EnableAccumulators();
  EXPECT_TRUE(acc.IsDisabled());  // counted: one Disable left
  layer->EnableAccumulators();
  EXPECT_EQ(acc.GetValue().item<double>(), 5.0);
  layer->ResetAccumulators();
  EXPECT_EQ(acc.GetValue().item<double>(), 0.0);
  EXPECT_THROW(acc.Enable(), FailedPreconditionError);
  NestedMap wrong;
  wrong.Set("x", at::zeros({}));
  EXPECT_ERROR_CONTAINS(layer->SetAccumulatorValues(wrong), InvalidArgumentError, "do not match");
}

// The inference plan made over a layer tree (PlanInference): each layer prepares what its FProp
// reads, keyed by its variables' full names, and FProp reads it where the plan applies
// (autograd off) and only there.
TEST(ComputePlan, LayersPrepareTheirWeightsAndFPropReadsThem) {
  at::manual_seed(7);
  auto proj = Make<ProjectionLayer>(ProjectionLayer::Params(),
                                    "input_dim : 16\noutput_dim : 12\nhas_bias : True");
  const at::Tensor x = at::randn({3, 5, 16});
  const NestedMap theta = proj->theta();
  const at::Tensor &w = theta.GetTensor("w"), &b = theta.GetTensor("b");
  const at::Tensor fp32 = proj->FProp(theta, x);
  auto plan = PlanInference(*proj, {.precision = Precision::kInt8});
  EXPECT_EQ(plan->keys(), std::vector<std::string>{"layer/w"});
  proj->SetComputePlan(plan);
  {
    at::NoGradGuard no_grad;
    ASSERT_NE(proj->compute_plan(), nullptr);
    const at::Tensor y = proj->FProp(theta, x);
    const at::Tensor want = Int8Affine(x.reshape({15, 16}), *QuantizeInt8(w), b, /*relu=*/true);
    EXPECT_TRUE(SameBits(y.reshape({15, 12}), want));
    EXPECT_FALSE(SameBits(y, fp32));
  }
  // Autograd on (training): the plan does not apply.
  EXPECT_EQ(proj->compute_plan(), nullptr);
  EXPECT_TRUE(SameBits(proj->FProp(theta, x), fp32));
  // Weights written after the plan was made: FProp refuses the stale plan, naming the weight.
  {
    at::NoGradGuard no_grad;
    theta.GetTensor("w").mul_(1.5);
    EXPECT_ERROR_CONTAINS(proj->FProp(theta, x), InternalError, "weight 'layer/w'");
    proj->SetComputePlan(nullptr);
    EXPECT_LT((proj->FProp(theta, x) - at::relu(at::matmul(x, w) + b)).abs().max().item<double>(),
              1e-5);
  }
}

// Self-attention under a plan: Q, K and V as one matrix prepared at load (the same bits as the
// matrix concatenated per call), and a batch-invariant plan's rows are the bits each row gets
// alone (the projections and the attention core take the invariant kernels).
TEST(ComputePlan, AttentionFusesQkvAtLoadAndRunsBatchInvariant) {
  at::manual_seed(8);
  auto atten = Make<MultiHeadedAttention>(MultiHeadedAttention::Params(),
                                          "input_dim : 16\nnum_heads : 2");
  const NestedMap theta = atten->theta();
  at::Tensor x = at::randn({3, 7, 16});
  at::Tensor paddings = at::zeros({3, 7});
  paddings[0].narrow(0, 4, 3).fill_(1.0);
  at::NoGradGuard no_grad;
  const at::Tensor fp32 = atten->FProp(theta, x, x, x, paddings).first;
  auto plan = PlanInference(*atten, {});
  const std::vector<std::string> keys = plan->keys();
  EXPECT_NE(std::find(keys.begin(), keys.end(), "layer/qkv"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "layer/post/w"), keys.end());
  atten->SetComputePlan(plan);
  EXPECT_TRUE(SameBits(atten->FProp(theta, x, x, x, paddings).first, fp32));
  atten->SetComputePlan(PlanInference(*atten, {.batch_invariant = true}));
  if (KernelsForcedToReference()) return;  // ATen's kernels are not batch-invariant
  const at::Tensor batch = atten->FProp(theta, x, x, x, paddings).first;
  EXPECT_LT((batch - fp32).abs().max().item<double>(), 1e-5);
  for (int64_t r : {0, 2}) {
    const at::Tensor xr = x.narrow(0, r, 1).narrow(1, 0, r == 0 ? 4 : 7).contiguous();
    const at::Tensor alone =
        atten->FProp(theta, xr, xr, xr, at::zeros({1, xr.size(1)})).first;
    EXPECT_TRUE(SameBits(alone[0], batch[r].narrow(0, 0, xr.size(1)))) << "row " << r;
  }
}

}  // namespace
}  // namespace glossa
