// Top-2 gating against the independent PyTorch port of Lingvo's Top2GatingOnLogits
// (tests/reference/moe_gating_reference.py → .json), hand-worked cases, and the MoE layer:
// shapes, routing, gradients by finite differences, the aux-loss context and training in an LM.
#include "glossa/layers/moe.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "glossa/base/errors.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/transformer.h"
#include "glossa/layers/weight_init.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/optim/learner.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"
#include "glossa/summary/summary.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

using nlohmann::json;

at::Tensor FromJson(const json& values, std::vector<int64_t> shape) {
  std::vector<double> v = values.get<std::vector<double>>();
  return at::tensor(v, at::kDouble).view(shape);
}

TEST(Top2Gating, MatchesTheLingvoPortInPyTorch) {
  const json cases =
      json::parse(testing::ReadSourceFile("tests/reference/moe_gating_reference.json"))["cases"];
  ASSERT_GE(cases.size(), 12u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const int64_t G = c["G"], S = c["S"], E = c["E"];
    at::Tensor logits = FromJson(c["logits"], {G, S, E});
    at::Tensor paddings = c["paddings"].is_null() ? at::Tensor() : FromJson(c["paddings"], {G, S});
    Top2GatingOptions o;
    o.expert_capacity_dim = c["expert_capacity_dim"];
    if (!c["capacity_factor"].is_null()) o.capacity_factor = c["capacity_factor"].get<double>();
    o.second_expert_policy = c["second_expert_policy"];
    o.second_expert_threshold = c["second_expert_threshold"];
    o.legacy_mtf_behavior = c["legacy_mtf_behavior"];
    o.fprop_dtype = at::kDouble;
    if (!c["importance"].is_null()) o.importance = FromJson(c["importance"], {G, S});
    if (!c["sampling_uniform"].is_null()) {
      o.sampling_uniform = FromJson(c["sampling_uniform"], {G, S, E});
    }
    if (!c["random_uniform"].is_null()) o.random_uniform = FromJson(c["random_uniform"], {G, S});
    Top2GatingOutput out = Top2GatingOnLogits(logits, paddings, o);
    const json& want = c["expected"];
    const int64_t C = want["C"];
    ASSERT_EQ(out.capacity, C);
    EXPECT_NEAR(out.aux_loss.item<double>(), want["aux_loss"].get<double>(), 1e-12);
    EXPECT_TRUE(at::allclose(out.combine, FromJson(want["combine"], {G, S, E, C}), 1e-12, 1e-12))
        << out.combine;
    EXPECT_TRUE(at::equal(out.dispatch, FromJson(want["dispatch"], {G, S, E, C})));
    EXPECT_NEAR(out.over_capacity_1_ratio.item<double>(),
                want["over_capacity_1_ratio"].get<double>(), 1e-6);
    EXPECT_NEAR(out.over_capacity_2_ratio.item<double>(),
                want["over_capacity_2_ratio"].get<double>(), 1e-6);
  }
}

// Three tokens, two experts, capacity 1. Gates: token 0 [0.75, 0.25] → expert 0 first;
// token 1 [0.75, 0.25] → expert 0 first but position 1 ≥ C, dropped; its second choice (expert 1)
// queues behind expert 1's first choices (token 2): position 1 + 0 → dropped too; token 2
// [0.25, 0.75] → expert 1 first at position 0. Second choices: token 0 → expert 1 at position
// 1 (one first choice ahead) → dropped; token 2 → expert 0 at 1 → dropped.
TEST(Top2Gating, HandWorkedCapacityOverflow) {
  const double l3 = std::log(3.0);
  at::Tensor logits = at::tensor({l3, 0.0, l3, 0.0, 0.0, l3}, at::kDouble).view({1, 3, 2});
  Top2GatingOptions o;
  o.expert_capacity_dim = 1;
  o.fprop_dtype = at::kDouble;
  Top2GatingOutput out = Top2GatingOnLogits(logits, {}, o);
  at::Tensor want = at::zeros({1, 3, 2, 1}, at::kDouble);
  const double g = 0.75 / (0.75 + 0.25 + 1e-9);  // legacy: normalized over the top 2
  want[0][0][0][0] = g;
  want[0][2][1][0] = g;
  EXPECT_TRUE(at::allclose(out.combine, want, 0, 1e-15)) << out.combine;
  // density_1 = [2/3, 1/3], proxy = mean gates = [(0.75 + 0.75 + 0.25) / 3, (0.25 + 0.25 + 0.75)
  // / 3]; aux = mean(proxy · density) · 4.
  const double aux = (1.75 / 3 * 2.0 / 3 + 1.25 / 3 * 1.0 / 3) / 2 * 4;
  EXPECT_NEAR(out.aux_loss.item<double>(), aux, 1e-12);
  EXPECT_NEAR(out.over_capacity_1_ratio.item<double>(), 1.0 / 3, 1e-7);
  EXPECT_NEAR(out.over_capacity_2_ratio.item<double>(), 1.0, 1e-7);
}

TEST(Top2Gating, CapacityFactorRoundsUpToAMultipleOfFour) {
  at::Tensor logits = at::randn({1, 10, 3}, at::kDouble);
  Top2GatingOptions o;
  o.capacity_factor = 2.0;  // int(10 · 2 / 3) = 6 → 8
  EXPECT_EQ(Top2GatingOnLogits(logits, {}, o).capacity, 8);
  o.capacity_factor = 0.1;  // int(0.33) = 0 → 4
  EXPECT_EQ(Top2GatingOnLogits(logits, {}, o).capacity, 4);
  o.expert_capacity_dim = 9;  // already above int(10 · 2 / 3)
  o.capacity_factor = 2.0;
  EXPECT_EQ(Top2GatingOnLogits(logits, {}, o).capacity, 9);
}

TEST(Top2Gating, RandomPoliciesReplayWithTheStepSeedAndSummariesAreRecorded) {
  at::Tensor logits = at::randn({2, 16, 4}, at::kDouble);
  Top2GatingOptions o;
  o.expert_capacity_dim = 6;
  o.second_expert_policy = "sampling";
  o.random_seed = 3;
  auto run = [&] {
    ResetStepSeed(0);
    GlobalStepContext step(5);
    return Top2GatingOnLogits(logits, {}, o).combine;
  };
  EXPECT_TRUE(at::equal(run(), run()));
  o.second_expert_policy = "random";
  o.second_expert_threshold = 0.5;
  EXPECT_TRUE(at::equal(run(), run()));
  SummaryContext ctx;
  Top2GatingOnLogits(logits, {}, o);
  auto all = ctx.MergeAll();
  EXPECT_TRUE(all.count("over_capacity_1_ratio/"));
  EXPECT_TRUE(all.count("over_capacity_2_ratio/"));
  EXPECT_EQ(all.at("expert_capacity/").item<double>(), 6.0);
}

TEST(Top2Gating, RejectsBadInputs) {
  at::Tensor logits = at::randn({1, 4, 3});
  Top2GatingOptions o;
  EXPECT_ERROR_CONTAINS(Top2GatingOnLogits(logits, {}, o), InvalidArgumentError,
                        "expert_capacity_dim must be > 0");
  o.expert_capacity_dim = 2;
  o.second_expert_policy = "best";
  EXPECT_ERROR_CONTAINS(Top2GatingOnLogits(logits, {}, o), InvalidArgumentError,
                        "second_expert_policy must be all, sampling or random, got 'best'");
  o.second_expert_policy = "all";
  EXPECT_ERROR_CONTAINS(Top2GatingOnLogits(logits, at::zeros({1, 5}), o), InvalidArgumentError,
                        "paddings must be [1, 4], got [1, 5]");
  EXPECT_ERROR_CONTAINS(Top2GatingOnLogits(at::randn({4, 3}), {}, o), InvalidArgumentError,
                        "logits must be [G, S, E]");
}

std::unique_ptr<TransformerShardedMoeLayer> MakeMoe(const std::string& extra = "") {
  Params p = TransformerShardedMoeLayer::Params();
  p.Set("name", "moe").Set("random_seed", 11).Set("dtype", DType::kFloat64);
  p.FromText(
      "input_dim : 6\nhidden_dim : 10\nnum_experts : 4\nnum_groups : 2\n"
      "expert_capacity_dim : 3\n" +
      extra);
  return InstantiateLayer<TransformerShardedMoeLayer>(p);
}

// An independent per-token evaluation of the MoE block: each token's output is the gate-weighted
// sum of its routed experts' FFNs (from the combine tensor), plus the residual.
at::Tensor PerTokenReference(const TransformerShardedMoeLayer& moe, const NestedMap& theta,
                             const at::Tensor& x, int64_t groups) {
  const int64_t b = x.size(0), t = x.size(1), m = x.size(2);
  at::Tensor normalized =
      moe.GetChildAs<LayerNorm>("layer_norm").FProp(theta.at("layer_norm").AsMap(), x);
  at::Tensor tokens = normalized.reshape({groups, b * t / groups, m});
  Top2GatingOptions o;
  o.expert_capacity_dim = moe.params().GetInt("expert_capacity_dim");
  o.fprop_dtype = at::kDouble;
  at::Tensor combine =
      Top2GatingOnLogits(at::einsum("gsm,me->gse", {tokens, theta.GetTensor("gate")}), {}, o)
          .combine.sum(-1);  // [G, S, E]
  at::Tensor out = at::zeros_like(tokens);
  for (int64_t g = 0; g < tokens.size(0); ++g) {
    for (int64_t s = 0; s < tokens.size(1); ++s) {
      for (int64_t e = 0; e < combine.size(2); ++e) {
        const double w = combine[g][s][e].item<double>();
        if (w == 0) continue;
        at::Tensor h = at::relu(at::matmul(tokens[g][s], theta.GetTensor("wi")[e]));
        out[g][s] += w * at::matmul(h, theta.GetTensor("wo")[e]);
      }
    }
  }
  return x + out.reshape({b, t, m});
}

TEST(TransformerShardedMoeLayer, MatchesAPerTokenEvaluationOfTheRoutedExperts) {
  auto moe = MakeMoe();
  at::Tensor x = at::randn({2, 4, 6}, at::kDouble);
  AuxLossContext aux;
  at::Tensor y = moe->FProp(moe->theta(), x, at::zeros({2, 4}));
  ASSERT_EQ(aux.losses().size(), 1u);
  EXPECT_TRUE(at::allclose(y, PerTokenReference(*moe, moe->theta(), x, 2), 1e-10, 1e-12));
  // Padded positions get no MoE output: only the residual.
  at::Tensor paddings = at::zeros({2, 4});
  paddings[1][3] = 1.0;
  at::Tensor yp = moe->FProp(moe->theta(), x, paddings);
  EXPECT_TRUE(at::allclose(yp[1][3], x[1][3], 0, 1e-15));
}

TEST(TransformerShardedMoeLayer, GradientsMatchFiniteDifferencesInFloat64) {
  auto moe = MakeMoe("use_glu : True\nactivation : 'GELU'");
  at::Tensor x = at::randn({2, 4, 6}, at::kDouble);
  NestedMap theta = moe->theta();
  std::vector<at::Tensor> ws = {theta.GetTensor("gate"), theta.GetTensor("wi"),
                                theta.GetTensor("wo")};
  auto loss = [&]() {
    AuxLossContext aux;
    at::Tensor y = moe->FProp(theta, x, {});
    return (y * y).sum() * 0.5 + aux.Sum().to(at::kDouble) * 0.3;
  };
  std::vector<at::Tensor> grads = torch::autograd::grad({loss()}, ws);
  // Small steps keep the routing (argmax, capacity) fixed, so the block is smooth there.
  for (size_t i = 0; i < ws.size(); ++i) {
    at::Tensor w = ws[i];
    for (int64_t k = 0; k < std::min<int64_t>(w.numel(), 12); ++k) {
      const int64_t idx = (k * 7919) % w.numel();
      const double eps = 1e-6;
      at::NoGradGuard no_grad;
      double* p = w.data_ptr<double>() + idx;
      const double saved = *p;
      *p = saved + eps;
      const double up = loss().item<double>();
      *p = saved - eps;
      const double down = loss().item<double>();
      *p = saved;
      const double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(grads[i].view(-1)[idx].item<double>(), numeric, 1e-6 + 1e-5 * std::abs(numeric))
          << "variable " << i << " element " << idx;
    }
  }
}

TEST(TransformerShardedMoeLayer, Bfloat16ComputeRoutesInFloat32AndTracksFloat32) {
  Params p = TransformerShardedMoeLayer::Params();
  p.Set("name", "moe").Set("random_seed", 11);
  p.FromText(
      "input_dim : 16\nhidden_dim : 32\nnum_experts : 4\nnum_groups : 2\n"
      "expert_capacity_dim : 16\npre_layer_norm : False");
  auto f32 = InstantiateLayer<TransformerShardedMoeLayer>(p);
  auto bf16 =
      InstantiateLayer<TransformerShardedMoeLayer>(p.Copy().Set("fprop_dtype", DType::kBFloat16));
  at::Tensor x = at::randn({2, 8, 16}, MakeSeededGenerator({4, 2}));  // fixed: no near-ties
  at::Tensor y32 = f32->FProp(f32->theta(), x);
  AuxLossContext aux;
  at::Tensor y16 = bf16->FProp(bf16->theta(), x);
  EXPECT_EQ(y16.scalar_type(), at::kBFloat16);
  EXPECT_EQ(aux.losses().at(0).scalar_type(), at::kFloat);  // gating ran in float32
  const double scale = y32.abs().max().item<double>();
  EXPECT_LT((y16.to(at::kFloat) - y32).abs().max().item<double>(), 0.05 * scale);
}

TEST(TransformerShardedMoeLayer, ValidatesParamsAndShapes) {
  EXPECT_ERROR_CONTAINS(MakeMoe("num_experts : 1"), InvalidArgumentError,
                        "num_experts must be >= 2, got 1");
  EXPECT_ERROR_CONTAINS(MakeMoe("second_expert_policy : 'best'"), InvalidArgumentError,
                        "second_expert_policy must be all, sampling or random");
  auto moe = MakeMoe();
  EXPECT_ERROR_CONTAINS(moe->FProp(moe->theta(), at::randn({1, 3, 6}, at::kDouble)),
                        InvalidArgumentError, "3 tokens do not split into 2 groups");
  EXPECT_ERROR_CONTAINS(moe->FProp(moe->theta(), at::randn({2, 4, 5}, at::kDouble)),
                        InvalidArgumentError, "inputs must be [B, T, 6], got [2, 4, 5]");
}

TEST(TransformerShardedMoeLayer, MoeTransformerLmTrains) {
  Params p = TransformerLmTask::CommonParams(/*vocab_size=*/12, /*model_dim=*/16,
                                            /*hidden_dim=*/32, /*num_heads=*/2,
                                            /*num_layers=*/2);
  p.Set("name", "lm").Set("random_seed", 3);
  // MoE in every 2nd layer: a list of [dense, MoE] layer templates.
  const Params dense = p.GetParams("stack.transformer_layer_params_tpl");
  Params moe = dense.Copy();
  moe.Set("tr_fflayer_tpl", TransformerShardedMoeLayer::Params()
                                .Set("hidden_dim", 32)
                                .Set("num_experts", 4)
                                .Set("num_groups", 2)
                                .Set("expert_capacity_factor", 1.5));
  p.Set("stack.transformer_layer_params_tpl", ParamValue::List{dense, moe});
  p.Set("train.learner.learning_rate", 3e-3);
  p.Set("train.learner.lr_schedule", ConstantSchedule::Params());
  auto lm = InstantiateLayer<TransformerLmTask>(p);
  // Layer 1 of 2 is MoE (every 2nd); layer 0 stays dense.
  EXPECT_NE(
      dynamic_cast<TransformerShardedMoeLayer*>(&lm->GetDescendant("stack.x_layers[1].fflayer")),
      nullptr);
  EXPECT_EQ(
      dynamic_cast<TransformerShardedMoeLayer*>(&lm->GetDescendant("stack.x_layers[0].fflayer")),
      nullptr);
  // A cyclic sequence: next token = (token + 1) mod 10 + 1.
  at::Tensor ids = (at::arange(16, at::kLong).view({1, 16}) + at::arange(4, at::kLong).view({4, 1}))
                       .remainder(10) +
                   1;
  NestedMap batch{
      {"ids", ids}, {"labels", ids.remainder(10) + 1}, {"paddings", at::zeros({4, 16})}};
  const auto vars = LearnerVariables(*lm);
  const at::Tensor wi_before =
      lm->GetDescendant("stack.x_layers[1].fflayer").vars().GetTensor("wi").clone();
  double first = 0, last = 0;
  for (int64_t step = 0; step < 60; ++step) {
    GlobalStepContext ctx(step);
    auto r = lm->FPropDefaultTheta(batch);
    ASSERT_TRUE(r.metrics.count("aux_loss"));
    EXPECT_GT(r.metrics.at("aux_loss").value.item<double>(), 0.0);
    const double log_pplx = r.metrics.at("log_pplx").value.item<double>();
    if (step == 0) first = log_pplx;
    last = log_pplx;
    lm->learner().Apply({{"loss", Metric{r.loss, r.metrics.at("loss").weight}}}, vars, step);
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
  // The experts' weights were trained.
  EXPECT_FALSE(
      at::equal(lm->GetDescendant("stack.x_layers[1].fflayer").vars().GetTensor("wi"), wi_before));
}

}  // namespace
}  // namespace glossa
