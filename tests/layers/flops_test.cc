// Declared FLOPs and the stage ends a pipeline derives from them (glossa/layers/flops.h): the
// balanced split against every contiguous split enumerated, the declared figures against the
// layers' weight counts, and a stack of unequal layers placed so that no stage waits on another.
#include "glossa/layers/flops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "glossa/layers/gpipe.h"
#include "glossa/layers/gpipe_transformer.h"
#include "glossa/layers/moe.h"
#include "glossa/layers/mesh.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// The costliest stage of the split `ends` over `costs`, the first stage costing `first` more and
// the last `last`.
double Costliest(const std::vector<double>& costs, const std::vector<int64_t>& ends,
                 double first = 0, double last = 0) {
  double worst = 0;
  int64_t a = 0;
  for (size_t s = 0; s < ends.size(); ++s) {
    double c = (s == 0 ? first : 0) + (s + 1 == ends.size() ? last : 0);
    for (int64_t i = a; i < ends[s]; ++i) c += costs[i];
    worst = std::max(worst, c);
    a = ends[s];
  }
  return worst;
}

// Every split of cells [first, n) into `stages` stages (their ends), by enumeration.
void EverySplit(int64_t n, int64_t stages, int64_t first, std::vector<int64_t>& ends,
                const std::function<void(const std::vector<int64_t>&)>& visit) {
  if (stages == 1) {
    ends.push_back(n);
    visit(ends);
    ends.pop_back();
    return;
  }
  for (int64_t e = first + 1; e <= n - stages + 1; ++e) {
    ends.push_back(e);
    EverySplit(n, stages - 1, e, ends, visit);
    ends.pop_back();
  }
}

// The cheapest costliest stage over every split of n cells into s stages, by enumeration.
double BruteForce(const std::vector<double>& costs, int64_t stages, int64_t first = 0) {
  const int64_t n = static_cast<int64_t>(costs.size());
  double here = 0, best = 1e300;
  if (stages == 1) {
    for (int64_t i = first; i < n; ++i) here += costs[i];
    return here;
  }
  for (int64_t e = first + 1; e <= n - stages + 1; ++e) {
    here += costs[e - 1];
    best = std::min(best, std::max(here, BruteForce(costs, stages - 1, e)));
  }
  return best;
}

TEST(DeclaredFlops, BalancedStageEndsAreTheCheapestSplitAndEvenWhenThatIsOne) {
  EXPECT_EQ(BalancedStageEnds({1, 1, 1, 1}, 2), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(BalancedStageEnds({1, 1, 1, 1, 1}, 2), (std::vector<int64_t>{3, 5}));  // as EvenStageEnds
  EXPECT_EQ(BalancedStageEnds({1, 1, 1, 4.5}, 2), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(BalancedStageEnds({5, 1, 1, 1}, 2), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(BalancedStageEnds({1, 2, 3}, 3), (std::vector<int64_t>{1, 2, 3}));
  at::manual_seed(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 2 + trial % 7, stages = 1 + trial % n;
    const at::Tensor r = at::rand({n}, at::kDouble) * 10 + 0.1;
    std::vector<double> costs(r.data_ptr<double>(), r.data_ptr<double>() + n);
    const std::vector<int64_t> ends = BalancedStageEnds(costs, stages);
    ASSERT_EQ(static_cast<int64_t>(ends.size()), stages);
    for (size_t s = 0; s < ends.size(); ++s) EXPECT_GT(ends[s], s == 0 ? 0 : ends[s - 1]);
    EXPECT_EQ(ends.back(), n);
    EXPECT_NEAR(Costliest(costs, ends), BruteForce(costs, stages), 1e-9) << "trial " << trial;
  }
}

// What runs beside the first and the last stage (a task's embedding and softmax under Lingvo's
// placement) counts in the balance: against every split enumerated, with random extras.
TEST(DeclaredFlops, WhatRunsBesideTheEndStagesCountsInTheBalance) {
  const std::vector<double> eight(8, 1.0);
  EXPECT_EQ(BalancedStageEnds(eight, 2, 0, 2), (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(BalancedStageEnds(eight, 2, 2, 0), (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(BalancedStageEnds(eight, 2, 1, 1), (std::vector<int64_t>{4, 8}));  // even is cheapest
  at::manual_seed(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 2 + trial % 7, stages = 1 + trial % n;
    const at::Tensor r = at::rand({n + 2}, at::kDouble) * 10 + 0.1;
    const double* v = r.data_ptr<double>();
    const std::vector<double> costs(v, v + n);
    const double first = trial % 3 == 0 ? 0.0 : v[n], last = v[n + 1] * (trial % 4);
    double best = 1e300;
    std::vector<int64_t> scratch;
    EverySplit(n, stages, 0, scratch, [&](const std::vector<int64_t>& ends) {
      best = std::min(best, Costliest(costs, ends, first, last));
    });
    const std::vector<int64_t> ends = BalancedStageEnds(costs, stages, first, last);
    ASSERT_EQ(static_cast<int64_t>(ends.size()), stages);
    for (size_t s = 0; s < ends.size(); ++s) EXPECT_GT(ends[s], s == 0 ? 0 : ends[s - 1]);
    EXPECT_EQ(ends.back(), n);
    EXPECT_NEAR(Costliest(costs, ends, first, last), best, 1e-9) << "trial " << trial;
  }
}

// A layer's declared FLOPs per token: 2 per weight a token meets (the MoE layer's gate and its
// top-2 experts), checked against the built layers' variables.
TEST(DeclaredFlops, TransformerAndMoeLayersDeclareTwoPerWeightATokenMeets) {
  Params dense = TransformerLayer::Params();
  dense.Set("name", "dense").Set("input_dim", 8).Set("tr_atten_tpl.num_heads", 2);
  dense.Set("tr_fflayer_tpl.hidden_dim", 16);
  auto layer = InstantiateLayer<TransformerLayer>(dense);
  double weights = 0;  // the projections' (the q, k, v, post and fc0, fc1 w), no biases or norms
  for (const auto& [key, t] : layer->theta().FlattenItems()) {
    if (key.ends_with(".w") || key.ends_with("/w")) {
      weights += static_cast<double>(t.AsTensor().numel());
    }
  }
  EXPECT_EQ(DeclaredFlopsPerToken(dense), 2 * weights);
  EXPECT_EQ(*DeclaredFlopsPerToken(dense), 8 * 8 * 8 + 4 * 8 * 16);
  Params moe = dense.Copy();
  moe.Set("tr_fflayer_tpl", TransformerShardedMoeLayer::Params()
                                .Set("hidden_dim", 32)
                                .Set("num_experts", 4)
                                .Set("num_groups", 1));
  // The gate [8, 4], and 2 of the 4 experts' wi [8, 32] and wo [32, 8].
  EXPECT_EQ(*DeclaredFlopsPerToken(moe), 8 * 8 * 8 + 2 * 8 * 4 + 2 * (2 * 8 * 32 + 2 * 32 * 8));
  Params unknown = Params();
  EXPECT_FALSE(DeclaredFlopsPerToken(unknown).has_value());
}

// A stack of 3 dense layers and a MoE layer with 2 splits: evenly (2 + 2) its second stage would
// cost 2.8x its first; derived from the declared FLOPs, the MoE layer takes a stage alone. Equal
// layers still split evenly, and splits given as a list are taken as they are.
TEST(DeclaredFlops, PipelinedStacksBalanceTheirStagesByDeclaredFlops) {
  auto stack = [](bool mixed, const ParamValue& splits) {
    Params p = GPipeTransformerStack::Params();
    p.Set("name", "s").Set("num_layers", 4).Set("mdl_dim", 8).Set("num_atten_heads", 2);
    p.Set("hidden_dim", 16).Set("splits", splits).Set("num_micro_batches", 2);
    if (mixed) {
      p.Set("hidden_dim", 0);  // each template keeps its own
      Params dense = TransformerLayer::Params();
      dense.Set("tr_fflayer_tpl.hidden_dim", 16);
      Params moe = dense.Copy();
      moe.Set("tr_fflayer_tpl", TransformerShardedMoeLayer::Params()
                                    .Set("hidden_dim", 64)
                                    .Set("num_experts", 4)
                                    .Set("num_groups", 1));
      p.Set("transformer_layer_params_tpl", ParamValue::List{dense, dense, dense, moe});
    }
    return InstantiateLayer<GPipeTransformerStack>(p);
  };
  EXPECT_EQ(stack(true, ParamValue(int64_t{2}))->stage_ends(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(stack(false, ParamValue(int64_t{2}))->stage_ends(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(stack(true, ParamValue(ParamValue::List{ParamValue(int64_t{2}), ParamValue(int64_t{4})}))
                ->stage_ends(),
            (std::vector<int64_t>{2, 4}));
}

// A pipe axis's rank that only answers where it sits: building a stage exchanges nothing.
class StageOnlyAxis : public MeshAxis {
 public:
  StageOnlyAxis(int size, int index) : size_(size), index_(index) {}
  int size() const override { return size_; }
  int index() const override { return index_; }
  at::Tensor ExchangeBlocks(const at::Tensor&) override {
    throw InternalError("a stage's construction exchanged blocks");
  }

 private:
  int size_, index_;
};

// Under Lingvo's placement the LM's softmax runs on the last stage: an LM of 8 equal layers whose
// softmax costs 2 layers (2 · 16 · 256 against 8 · 16² + 4 · 16 · 32 per token) puts 5 layers on
// stage 0 and 3 beside the softmax on stage 1 of a 'pipe' axis; without the axis (one process,
// where the softmax runs on the caller) the stack splits evenly, and a given list is kept.
TEST(DeclaredFlops, TheLmsSoftmaxCountsOnTheLastStage) {
  auto lm_layers = [](MeshAxis* pipe, const ParamValue& splits) {
    Params p = TransformerLmTask::CommonParams(/*vocab_size=*/256, 16, 32, 2, 8);
    p.Set("name", "lm").Set("stack.splits", splits).Set("stack.num_micro_batches", 2);
    auto lm = InstantiateLayer<TransformerLmTask>(p, BuildContext().WithAxis("pipe", pipe));
    return lm->GetChildAs<TransformerStack>("stack").num_layers();
  };
  EXPECT_EQ(*DeclaredFlopsPerToken(SimpleFullSoftmax::Params()
                                       .Set("input_dim", 16)
                                       .Set("num_classes", 256)),
            2.0 * 16 * 256);
  StageOnlyAxis first(2, 0), last(2, 1);
  const ParamValue two(int64_t{2});
  EXPECT_EQ(lm_layers(&first, two), 5);
  EXPECT_EQ(lm_layers(&last, two), 3);
  EXPECT_EQ(lm_layers(nullptr, two), 8);  // one process holds every layer
  const ParamValue given(ParamValue::List{ParamValue(int64_t{4}), ParamValue(int64_t{8})});
  EXPECT_EQ(lm_layers(&first, given), 4);
}

}  // namespace
}  // namespace glossa
