// The table-driven layer check. Each case of tests/reference/layer_reference.json (written by
// tests/reference/layer_reference.py from PyTorch) names a layer, its params, inputs, weights,
// outputs and gradients. For every case this test
//   1. checks that the layer's variables have exactly the reference's names and shapes;
//   2. loads the reference weights, runs FProp in float64 and float32, and compares outputs and the
//      gradients of sum(output · cotangent) w.r.t. inputs and weights (tolerances per dtype below);
//   3. compares autograd gradients with central finite differences in float64;
//   4. runs with fprop_dtype = bfloat16 and compares the outputs within the bf16 tolerance.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/block.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/conv.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/rnn.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/tasks/asr/asr.h"
#include "glossa/tasks/image/image.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

using json = nlohmann::json;

// max |actual - expected| <= atol + rtol · max |expected|, per dtype of the run.
struct Tolerance {
  double rtol, atol;
};
constexpr Tolerance kFloat64Tol{1e-9, 1e-9};
constexpr Tolerance kFloat32Tol{2e-4, 2e-4};
constexpr Tolerance kBFloat16Tol{6e-2, 6e-2};
constexpr Tolerance kFiniteDifferenceTol{1e-6, 1e-6};

using Adapter =
    std::function<NestedMap(const BaseLayer&, const NestedMap& theta, const NestedMap& inputs)>;

at::Tensor T(const NestedMap& m, const char* key) { return m.Get(key, at::Tensor()).AsTensor(); }

std::map<std::string, Adapter> Adapters();

// The adapter of `cls`; layers without one are called through the Block interface on their
// inputs x (and paddings when the case has them).
Adapter AdapterFor(const std::string& cls) {
  static const std::map<std::string, Adapter> adapters = Adapters();
  auto it = adapters.find(cls);
  if (it != adapters.end()) return it->second;
  return [cls](const BaseLayer& l, const NestedMap& th, const NestedMap& in) {
    const Block& block = AsBlock(l, StrCat("the layer check of ", cls));
    at::Tensor paddings = in.contains("paddings") ? T(in, "paddings") : at::Tensor();
    return NestedMap{{"y", block.FPropBlock(th, T(in, "x"), paddings)}};
  };
}

std::map<std::string, Adapter> Adapters() {
  std::map<std::string, Adapter> a;
  a["glossa.layers.ProjectionLayer"] = [](const BaseLayer& l, const NestedMap& th,
                                          const NestedMap& in) {
    return NestedMap{
        {"y", dynamic_cast<const ProjectionLayer&>(l).FProp(th, T(in, "x"), T(in, "paddings"))}};
  };
  a["glossa.layers.EmbeddingLayer"] = [](const BaseLayer& l, const NestedMap& th,
                                         const NestedMap& in) {
    return NestedMap{{"y", dynamic_cast<const EmbeddingLayer&>(l).EmbLookup(th, T(in, "ids"))}};
  };
  a["glossa.layers.PositionalEmbeddingLayer"] = [](const BaseLayer& l, const NestedMap& th,
                                                   const NestedMap& in) {
    return NestedMap{{"y", dynamic_cast<const PositionalEmbeddingLayer&>(l).FProp(
                               th, T(in, "seq_length").item<int64_t>())}};
  };
  a["glossa.layers.BatchNormLayer"] = [](const BaseLayer& l, const NestedMap& th,
                                         const NestedMap& in) {
    at::Tensor y = dynamic_cast<const BatchNormLayer&>(l).FProp(th, T(in, "x"), T(in, "paddings"));
    return NestedMap{{"y", y},
                     {"new_moving_mean", l.GetVariable("moving_mean").clone()},
                     {"new_moving_variance", l.GetVariable("moving_variance").clone()}};
  };
  a["glossa.layers.MultiHeadedAttention"] = [](const BaseLayer& l, const NestedMap& th,
                                               const NestedMap& in) {
    const auto& atten = dynamic_cast<const MultiHeadedAttention&>(l);
    const bool self = !in.contains("key");
    at::Tensor kv = self ? T(in, "query") : T(in, "key");
    auto [y, probs] = atten.FProp(th, T(in, "query"), kv, kv, T(in, "paddings"), /*causal=*/self);
    return NestedMap{{"y", y}, {"probs", probs}};
  };
  a["glossa.layers.TransformerLayer"] = [](const BaseLayer& l, const NestedMap& th,
                                           const NestedMap& in) {
    return NestedMap{
        {"y", dynamic_cast<const TransformerLayer&>(l)
                  .FProp(th, T(in, "x"), T(in, "paddings"), T(in, "aux"), T(in, "aux_paddings"))
                  .first}};
  };
  a["glossa.layers.TransformerDecoder"] = [](const BaseLayer& l, const NestedMap& th,
                                             const NestedMap& in) {
    return NestedMap{
        {"y", dynamic_cast<const TransformerStack&>(l).FProp(th, T(in, "x"), T(in, "paddings"),
                                                             T(in, "aux"), T(in, "aux_paddings"))}};
  };
  a["glossa.layers.SimpleFullSoftmax"] = [](const BaseLayer& l, const NestedMap& th,
                                            const NestedMap& in) {
    const auto& sm = dynamic_cast<const SimpleFullSoftmax&>(l);
    NestedMap out = sm.FProp(th, T(in, "x"), T(in, "ids"), T(in, "weights"), T(in, "paddings"));
    // FProp's fused path adds the bias inside the cross-entropy kernel and outputs no logits.
    return NestedMap{{"logits", out.Has("logits") ? out.GetTensor("logits") : sm.Logits(th, T(in, "x"))},
                     {"per_example_xent", out.GetTensor("per_example_xent")},
                     {"avg_xent", out.GetTensor("avg_xent")}};
  };
  a["glossa.layers.StackedRNN"] = [](const BaseLayer& l, const NestedMap& th, const NestedMap& in) {
    return NestedMap{
        {"y", dynamic_cast<const StackedRNN&>(l).FProp(th, T(in, "x"), T(in, "paddings")).first}};
  };
  a["glossa.layers.Conv2DLayer"] = [](const BaseLayer& l, const NestedMap& th,
                                      const NestedMap& in) {
    return NestedMap{
        {"y", dynamic_cast<const Conv2DLayer&>(l).FProp(th, T(in, "x"), T(in, "paddings")).first}};
  };
  a["glossa.layers.PoolingLayer"] = [](const BaseLayer& l, const NestedMap& th,
                                       const NestedMap& in) {
    return NestedMap{{"y", dynamic_cast<const PoolingLayer&>(l).FProp(th, T(in, "x")).first}};
  };
  for (const char* cls : {"glossa.image.ConvStack", "glossa.image.ResNet"}) {
    a[cls] = [](const BaseLayer& l, const NestedMap& th, const NestedMap& in) {
      return NestedMap{
          {"y", dynamic_cast<const ImageFeatureExtractor&>(l).FPropImages(th, T(in, "x"))}};
    };
  }
  a["glossa.asr.AsrEncoder"] = [](const BaseLayer& l, const NestedMap& th, const NestedMap& in) {
    return NestedMap{{"y", dynamic_cast<const asr::AsrEncoder&>(l)
                               .FProp(th, T(in, "features"), T(in, "paddings"))
                               .GetTensor("encoded")}};
  };
  return a;
}

// A tensor from {"shape", "data"}; entries marked "int" with integral values become int64.
at::Tensor FromJson(const json& j, at::ScalarType float_type) {
  std::vector<double> data = j["data"].get<std::vector<double>>();
  std::vector<int64_t> shape = j["shape"].get<std::vector<int64_t>>();
  at::Tensor t = at::tensor(data, at::TensorOptions().dtype(at::kDouble)).reshape(shape).clone();
  const bool is_int =
      j.contains("int") && j["int"].get<bool>() &&
      std::all_of(data.begin(), data.end(), [](double v) { return v == int64_t(v); });
  return is_int ? t.to(at::kLong) : t.to(float_type);
}

// Non-differentiable inputs are ids (int64) or float masks and weights (the run's dtype).
bool IsIdInput(const std::string& name) { return name == "ids" || name == "seq_length"; }

struct CaseRun {
  std::unique_ptr<BaseLayer> layer;
  NestedMap inputs;
  NestedMap outputs;
  std::map<std::string, at::Tensor> leaves;  // "inputs.x" / "theta.w" -> differentiable tensor
};

CaseRun RunCase(const json& c, at::ScalarType dtype, bool bf16_fprop) {
  const std::string cls = c["layer"].get<std::string>();
  Params p = ClassRegistry::Get(cls).default_params();
  p.FromText(c["params"].get<std::string>());
  p.Set("name", c["name"].get<std::string>()).Set("random_seed", 1);
  p.Set("dtype", FromScalarType(dtype));
  if (bf16_fprop) p.Set("fprop_dtype", DType::kBFloat16);
  CaseRun run;
  run.layer = p.Instantiate<BaseLayer>();
  // Load the reference weights into the layer's own variables.
  NestedMap vars = run.layer->vars();
  {
    at::NoGradGuard no_grad;
    for (const auto& [key, value] : c["theta"].items()) {
      at::Tensor var = vars.GetTensor(key);
      var.copy_(FromJson(value, var.scalar_type()));
    }
  }
  for (const auto& [key, value] : vars.FlattenItems()) {
    if (value.AsTensor().requires_grad()) run.leaves["theta." + key] = value.AsTensor();
  }
  for (const auto& [key, value] : c["inputs"].items()) {
    at::Tensor t = IsIdInput(key) ? FromJson(value, dtype) : FromJson(value, dtype).to(dtype);
    if (!value["int"].get<bool>()) {
      t.requires_grad_(true);
      run.leaves["inputs." + key] = t;
    }
    run.inputs.Put(key, t);
  }
  ResetStepSeed();
  run.outputs = AdapterFor(cls)(*run.layer, run.layer->theta(), run.inputs);
  return run;
}

double MaxAbs(const at::Tensor& t) { return t.numel() ? t.abs().max().item<double>() : 0.0; }

void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol,
                 const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double err = MaxAbs(actual.to(at::kDouble) - expected.to(at::kDouble));
  EXPECT_LE(err, tol.atol + tol.rtol * MaxAbs(expected)) << what << ": max abs error " << err;
}

at::Tensor Loss(const NestedMap& outputs, const json& cots) {
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (const auto& [key, value] : cots.items()) {
    // Updated state (BatchNorm's moving statistics, "new_*") is not a function of the inputs.
    if (key.rfind("new_", 0) == 0) continue;
    const at::Tensor& out = outputs.GetTensor(key);
    loss = loss + (out.to(at::kDouble) * FromJson(value, at::kDouble)).sum();
  }
  return loss;
}

json Cases() {
  static const json cases =
      json::parse(testing::ReadSourceFile("tests/reference/layer_reference.json"))["cases"];
  return cases;
}

class LayerCheck : public ::testing::TestWithParam<std::string> {
 protected:
  json Case() const {
    for (const auto& c : Cases()) {
      if (c["name"] == GetParam()) return c;
    }
    throw std::runtime_error("no case " + GetParam());
  }
};

TEST_P(LayerCheck, VariablesMatchTheReference) {
  json c = Case();
  CaseRun run = RunCase(c, at::kDouble, false);
  std::vector<std::string> expected;
  for (const auto& [key, value] : c["theta"].items()) {
    expected.push_back(key);
    EXPECT_EQ(run.layer->vars().GetTensor(key).sizes().vec(),
              value["shape"].get<std::vector<int64_t>>())
        << key;
  }
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(run.layer->vars().Keys(), expected);
}

TEST_P(LayerCheck, OutputsAndGradientsMatchPyTorch) {
  json c = Case();
  for (auto [dtype, tol] :
       {std::make_pair(at::kDouble, kFloat64Tol), std::make_pair(at::kFloat, kFloat32Tol)}) {
    CaseRun run = RunCase(c, dtype, false);
    const std::string tag = std::string(c["name"]) + " " + c10::toString(dtype);
    for (const auto& [key, value] : c["outputs"].items()) {
      ExpectClose(run.outputs.GetTensor(key), FromJson(value, at::kDouble), tol,
                  tag + " output " + key);
    }
    if (run.leaves.empty()) continue;
    at::Tensor loss = Loss(run.outputs, c["cotangents"]);
    if (!loss.requires_grad()) continue;
    std::vector<std::string> names;
    std::vector<at::Tensor> leaves;
    for (const auto& [k, v] : run.leaves) {
      names.push_back(k);
      leaves.push_back(v);
    }
    auto grads =
        torch::autograd::grad({loss}, leaves, {}, c10::nullopt, false, /*allow_unused=*/true);
    for (size_t i = 0; i < names.size(); ++i) {
      ASSERT_TRUE(c["grads"].contains(names[i]))
          << tag << ": no reference gradient for " << names[i];
      at::Tensor expected = FromJson(c["grads"][names[i]], at::kDouble);
      at::Tensor g = grads[i].defined() ? grads[i] : at::zeros_like(leaves[i]);
      ExpectClose(g, expected, tol, tag + " gradient " + names[i]);
    }
  }
}

TEST_P(LayerCheck, GradientsMatchFiniteDifferencesInFloat64) {
  json c = Case();
  CaseRun run = RunCase(c, at::kDouble, false);
  if (run.leaves.empty()) return;
  auto loss_of = [&]() {
    ResetStepSeed();
    NestedMap out = AdapterFor(c["layer"])(*run.layer, run.layer->theta(), run.inputs);
    return Loss(out, c["cotangents"]);
  };
  at::Tensor loss = loss_of();
  if (!loss.requires_grad()) return;
  std::vector<at::Tensor> leaves;
  std::vector<std::string> names;
  for (const auto& [k, v] : run.leaves) {
    names.push_back(k);
    leaves.push_back(v);
  }
  auto grads = torch::autograd::grad({loss}, leaves, {}, c10::nullopt, false, true);
  const double h = 1e-6;
  for (size_t i = 0; i < leaves.size(); ++i) {
    at::Tensor flat = leaves[i].detach().view(-1);  // shares storage with the leaf
    at::Tensor g = grads[i].defined() ? grads[i].reshape(-1) : at::zeros_like(flat);
    const int64_t n = flat.numel();
    const int64_t step = std::max<int64_t>(1, n / 12);  // up to ~12 elements per tensor
    for (int64_t e = 0; e < n; e += step) {
      const double orig = flat[e].item<double>();
      double plus, minus;
      {
        at::NoGradGuard no_grad;
        flat[e] = orig + h;
        plus = loss_of().item<double>();
        flat[e] = orig - h;
        minus = loss_of().item<double>();
        flat[e] = orig;
      }
      const double numeric = (plus - minus) / (2 * h);
      const double analytic = g[e].item<double>();
      EXPECT_NEAR(analytic, numeric,
                  kFiniteDifferenceTol.atol + kFiniteDifferenceTol.rtol * std::abs(numeric) + 1e-5)
          << c["name"] << " " << names[i] << "[" << e << "]";
    }
  }
}

TEST_P(LayerCheck, BFloat16FPropIsCloseToTheReference) {
  json c = Case();
  CaseRun run = RunCase(c, at::kFloat, /*bf16_fprop=*/true);
  for (const auto& [key, value] : c["outputs"].items()) {
    if (key.rfind("new_moving", 0) == 0) continue;  // statistics stay in the variable dtype
    at::Tensor out = run.outputs.GetTensor(key);
    if (c["layer"] != "glossa.layers.SimpleFullSoftmax" || key == "logits") {
      EXPECT_EQ(out.scalar_type(), at::kBFloat16) << c["name"] << " " << key;
    }
    ExpectClose(out, FromJson(value, at::kDouble), kBFloat16Tol,
                std::string(c["name"]) + " bf16 output " + key);
  }
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  for (const auto& c : Cases()) names.push_back(c["name"]);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Reference, LayerCheck, ::testing::ValuesIn(CaseNames()),
                         [](const auto& info) { return info.param; });

TEST(LayerCheckTable, CoversEveryCoreLayer) {
  std::set<std::string> covered;
  for (const auto& c : Cases()) covered.insert(c["layer"]);
  for (const char* layer :
       {"glossa.layers.ProjectionLayer", "glossa.layers.EmbeddingLayer",
        "glossa.layers.PositionalEmbeddingLayer", "glossa.layers.LayerNorm",
        "glossa.layers.BatchNormLayer", "glossa.layers.MultiHeadedAttention",
        "glossa.layers.TransformerFeedForwardLayer", "glossa.layers.TransformerLayer",
        "glossa.layers.TransformerDecoder", "glossa.layers.SimpleFullSoftmax",
        "glossa.layers.StackedRNN", "glossa.layers.Conv2DLayer", "glossa.layers.PoolingLayer",
        "glossa.image.ConvStack", "glossa.image.ResNet", "glossa.asr.AsrEncoder"}) {
    EXPECT_TRUE(covered.count(layer)) << layer << " has no reference case";
  }
}

}  // namespace
}  // namespace glossa
