// ThreadState (glossa/base/thread_state.h): every registered context crosses to a thread started
// with Capture(), none to one started Fresh(), and the starter's values come back after a Scope.
// The list below is every slot there is: a slot added without a check here fails the first test.
#include "glossa/base/thread_state.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/base_layer.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/moe.h"
#include "glossa/runtime/distributed.h"
#include "glossa/summary/summary.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// What a thread sees of every slot.
struct Seen {
  bool eval = false, stubbed = false, grad = true;
  int64_t seed = -1, seed_step = -1, global_step = -1, overwrite_step = -1;
  BatchShard shard;
  SummaryContext* summaries = nullptr;
  std::string name_scope;
  bool suppressed = false;
  AuxLossContext* aux = nullptr;
  Distributed *dist = nullptr, *batch_group = nullptr;
};

// Reads every slot on this thread (building a layer for the variable scopes; recording a summary
// when the context is the test's own, to see whether it is suppressed).
Seen Look(SummaryContext* own) {
  Seen s;
  s.eval = IsEvalMode();
  Params p = ProjectionLayer::Params();
  p.Set("name", "proj").Set("input_dim", 3).Set("output_dim", 2).Set("random_seed", 1);
  auto layer = InstantiateLayer<ProjectionLayer>(p);
  s.stubbed = layer->theta().GetTensor("w").abs().sum().item<double>() == 0.0;
  s.grad = at::GradMode::is_enabled();
  s.seed = GetStepSeed();
  GetIncStepSeed();
  s.seed_step = GetStepSeed() - s.seed;
  ResetStepSeed(s.seed);
  s.global_step = GetGlobalStep();
  s.overwrite_step = GetOverWriteGlobalStep();
  s.shard = CurrentBatchShard();
  s.summaries = SummaryContext::Current();
  s.name_scope = SummaryNameScope::Current();
  if (s.summaries == own && own != nullptr) {
    const size_t before = own->MergeAll().size();
    summary::Scalar(StrCat("probe_", before), 1.0);
    s.suppressed = own->MergeAll().size() == before;
  }
  s.aux = AuxLossContext::Current();
  s.dist = CurrentDistributed();
  s.batch_group = CurrentBatchGroup();
  return s;
}

Seen LookOnThread(ThreadState state, SummaryContext* own) {
  Seen seen;
  std::thread t = StartThread(std::move(state), [&] { seen = Look(own); });
  t.join();
  return seen;
}

TEST(ThreadState, EveryRegisteredContextCrossesToACapturedThread) {
  // Every slot, in registration order is not promised: compare as sets.
  std::vector<std::string> names = ThreadState::SlotNames();
  std::sort(names.begin(), names.end());
  // No slot selects arithmetic: what a loaded model computes is its inference plan
  // (glossa/kernels/compute_plan.h), not a scope on the thread.
  const std::vector<std::string> checked = {
      "aux_losses",    "batch_group",           "batch_shard",          "distributed",
      "eval_mode",     "global_step",           "overwrite_global_step", "step_seed",
      "step_seed_increments", "summaries",      "summaries_suppressed", "summary_name_scopes",
      "variable_stubs"};
  ASSERT_EQ(names, checked) << "a ThreadState slot without a check in this test (or a check of a "
                               "slot that is gone): add it to Look() and to the expectations";

  DistributedOptions o;
  o.world_size = 1;
  o.rank = 0;
  o.master_port = 0;
  Distributed dist(o);
  Distributed group(o);  // a second object, to tell the batch group from the current one
  const int64_t process_step = GetGlobalStep();
  at::NoGradGuard no_grad;  // ATen's grad mode crosses too
  SummaryContext summaries;
  SummaryNameScope scope("outer");
  AuxLossContext aux;
  DistributedScope dist_scope(&dist, &group);
  EvalModeScope eval;
  VariableStubScope stubs;
  const int64_t saved_seed = GetStepSeed();
  ResetStepSeed(41);
  StepSeedIncrementContext increments(3);
  GlobalStepContext step(7);
  OverWriteGlobalStepContext overwrite(9);
  BatchShardScope shard(1, 2);

  const Seen here = Look(nullptr);
  const Seen there = LookOnThread(ThreadState::Capture(), &summaries);
  EXPECT_TRUE(there.eval);
  EXPECT_TRUE(there.stubbed);
  EXPECT_FALSE(there.grad);
  EXPECT_EQ(there.seed, 41);
  EXPECT_EQ(there.seed_step, 3);
  EXPECT_EQ(there.global_step, 7);
  EXPECT_EQ(there.overwrite_step, 9);
  EXPECT_EQ(there.shard.index, 1);
  EXPECT_EQ(there.shard.count, 2);
  EXPECT_EQ(there.summaries, &summaries);
  EXPECT_EQ(there.name_scope, "outer");
  EXPECT_FALSE(there.suppressed);
  EXPECT_EQ(there.aux, &aux);
  EXPECT_EQ(there.dist, &dist);
  EXPECT_EQ(there.batch_group, &group);
  {
    SummarySuppressScope quiet;
    EXPECT_TRUE(LookOnThread(ThreadState::Capture(), &summaries).suppressed);
  }
  // The same as this thread sees (the thread's step seed moves on its own copy only).
  EXPECT_EQ(here.seed, there.seed);
  EXPECT_EQ(GetStepSeed(), 41);

  // Fresh: a new thread's defaults, whatever the starter has.
  const Seen fresh = LookOnThread(ThreadState::Fresh(), &summaries);
  EXPECT_FALSE(fresh.eval);
  EXPECT_FALSE(fresh.stubbed);
  EXPECT_TRUE(fresh.grad);
  EXPECT_EQ(fresh.seed, 0);
  EXPECT_EQ(fresh.seed_step, 1);
  EXPECT_EQ(fresh.global_step, process_step);
  EXPECT_EQ(fresh.shard.count, 1);
  EXPECT_EQ(fresh.summaries, nullptr);
  EXPECT_EQ(fresh.name_scope, "");
  EXPECT_EQ(fresh.aux, nullptr);
  EXPECT_EQ(fresh.dist, nullptr);
  EXPECT_EQ(fresh.batch_group, nullptr);

  // Reset: one slot at its default, the others carried; an unknown slot is named.
  const Seen reset = LookOnThread(ThreadState::Capture().Reset("summaries"), &summaries);
  EXPECT_EQ(reset.summaries, nullptr);
  EXPECT_EQ(reset.name_scope, "outer");
  EXPECT_ERROR_CONTAINS(ThreadState::Capture().Reset("no_such_slot"), InvalidArgumentError,
                        "no slot 'no_such_slot'");
  ResetStepSeed(saved_seed);
}

// A Scope installs a state on the running thread and gives the thread its own back after.
TEST(ThreadState, AScopeRestoresTheThreadsOwnState) {
  ThreadState evaluating = [] {
    EvalModeScope eval;
    GlobalStepContext step(123);
    return ThreadState::Capture();
  }();
  ASSERT_FALSE(IsEvalMode());
  BatchShardScope shard(0, 3);
  {
    ThreadState::Scope scope(evaluating);
    EXPECT_TRUE(IsEvalMode());
    EXPECT_EQ(GetGlobalStep(), 123);
    EXPECT_EQ(CurrentBatchShard().count, 1);  // captured where it was not set
  }
  EXPECT_FALSE(IsEvalMode());
  EXPECT_EQ(CurrentBatchShard().count, 3);
}

}  // namespace
}  // namespace glossa
