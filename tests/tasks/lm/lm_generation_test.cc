// Continuous batching of the LM's "generate" (glossa/tasks/lm/lm_generation.h): requests that join
// a running batch at any step, and leave it as they finish, get the bits they get alone.
#include "glossa/tasks/lm/lm_generation.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/inference/predictor.h"
#include "glossa/kernels/cpu_features.h"
#include "tests/inference/test_bundle.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

InferenceMap Feeds(std::vector<std::string> prompts, int64_t max_new, double temperature,
                   int64_t seed, int64_t top_k = 0) {
  return {{"prompt", InferenceValue::Strings(std::move(prompts))},
          {"max_new_tokens", InferenceValue::Of(at::scalar_tensor(max_new, at::kLong))},
          {"temperature", InferenceValue::Of(at::scalar_tensor(temperature, at::kFloat))},
          {"top_k", InferenceValue::Of(at::scalar_tensor(top_k, at::kLong))},
          {"seed", InferenceValue::Of(at::scalar_tensor(seed, at::kLong))}};
}

// Equal bits alone or in a batch hold under the batch-invariant kernels; GLOSSA_KERNELS=reference
// turns them off (ATen's GEMMs pick their kernels by the whole matrix's shape), and a draw may
// then differ in the last bits and so in its token: only the answer's shape is compared.
void ExpectSameAnswer(const InferenceMap& got, const InferenceMap& want, const std::string& what) {
  if (KernelsForcedToReference()) {
    EXPECT_EQ(got.at("text").strings.size(), want.at("text").strings.size()) << what;
    EXPECT_EQ(got.at("ids").tensor.size(0), want.at("ids").tensor.size(0)) << what;
    return;
  }
  EXPECT_EQ(got.at("text").strings, want.at("text").strings) << what;
  EXPECT_TRUE(at::equal(got.at("ids").tensor, want.at("ids").tensor))
      << what << "\n" << got.at("ids").tensor << "\n" << want.at("ids").tensor;
  EXPECT_TRUE(at::equal(got.at("lengths").tensor, want.at("lengths").tensor)) << what;
}

// Requests join at steps 0, 3, 4 and 64 (the first, of 70 tokens, leaves at step 70 unless it
// draws </s>, and the columns before the last one's first step are then dropped): each answer
// equals its Run alone, bit for bit, under the
// batch-invariant plan; each request's first token comes on the step after it joined, whatever
// its prompt's length; the streamed tokens are the answer's ids.
TEST(LmGeneration, RequestsJoiningARunningBatchGetTheirAnswersAlone) {
  PredictorOptions o;
  o.batch_invariant = true;
  Predictor predictor(ExportedBundle(), o);
  std::unique_ptr<GenerationBatch> batch = predictor.StartGeneration("generate");
  ASSERT_NE(batch, nullptr);
  EXPECT_EQ(predictor.StartGeneration("default"), nullptr);  // scoring does not generate
  EXPECT_THROW(predictor.StartGeneration("nope"), NotFoundError);
  struct Planned {
    int64_t join_step;
    InferenceMap feeds;
  };
  const std::vector<Planned> plan = {
      {0, Feeds({"Elizabeth", "Mr. Darcy said that he"}, 70, 1.0, 5)},
      {3, Feeds({"It is a truth universally acknowledged that a single man"}, 6, 0.0, 0)},
      {4, Feeds({"She", "", "Her sister"}, 9, 0.8, 3, 20)},
      {64, Feeds({"The house"}, 40, 1.0, 11)},
      {64, Feeds({"Nothing"}, 0, 1.0, 1)},  // nothing to draw: finished at once
  };
  std::map<int64_t, size_t> which;        // request id -> plan index
  std::map<int64_t, int64_t> joined_at;   // request id -> step it joined before
  std::map<int64_t, int64_t> first_token; // request id -> the step of its first token
  std::map<int64_t, std::map<int64_t, std::vector<int64_t>>> streamed;
  std::map<int64_t, InferenceMap> answers;
  size_t next = 0;
  for (int64_t step = 0; step < 400 && (next < plan.size() || batch->busy()); ++step) {
    while (next < plan.size() && plan[next].join_step <= step) {
      const int64_t id = batch->Join(plan[next].feeds);
      which[id] = next;
      joined_at[id] = batch->steps();
      ++next;
    }
    const int64_t at_step = batch->steps();
    const GenerationStep s = batch->Step();
    for (const GenerationToken& t : s.tokens) {
      if (!first_token.count(t.request)) first_token[t.request] = at_step;
      streamed[t.request][t.row].push_back(t.id);
    }
    for (int64_t id : s.finished) answers[id] = batch->Finish(id);
  }
  EXPECT_FALSE(batch->busy());
  EXPECT_EQ(batch->rows(), 0);
  ASSERT_EQ(answers.size(), plan.size());
  for (const auto& [id, got] : answers) {
    const InferenceMap want = predictor.Run("generate", plan[which[id]].feeds);
    ExpectSameAnswer(got, want, StrCat("request ", id, " (plan ", which[id], ")"));
    const at::Tensor ids = got.at("ids").tensor;  // the streamed tokens are the answer's
    for (const auto& [row, tokens] : streamed[id]) {
      EXPECT_TRUE(at::equal(at::tensor(tokens, at::kLong), ids[row].narrow(0, 0, tokens.size())))
          << "request " << id << " row " << row;
    }
    if (plan[which[id]].feeds.at("max_new_tokens").tensor.item<int64_t>() > 0) {
      EXPECT_EQ(first_token.at(id), joined_at.at(id)) << "request " << id;
    }
  }
  EXPECT_THROW(batch->Finish(12345), NotFoundError);
  // A bad request is refused at Join, naming the feed; the batch goes on.
  EXPECT_ERROR_CONTAINS(batch->Join(Feeds({"x"}, 100000, 1.0, 1)), InvalidArgumentError,
                        "max_new_tokens");
  const int64_t id = batch->Join(Feeds({"Elizabeth"}, 3, 0.0, 0));
  while (batch->busy()) batch->Step();
  ExpectSameAnswer(batch->Finish(id), predictor.Run("generate", Feeds({"Elizabeth"}, 3, 0.0, 0)),
                   "after a refused join");
}

// A cancelled request's rows leave at once; the others' answers are unchanged.
TEST(LmGeneration, ACancelledRequestLeavesAndTheOthersGoOn) {
  PredictorOptions o;
  o.batch_invariant = true;
  Predictor predictor(ExportedBundle(), o);
  std::unique_ptr<GenerationBatch> batch = predictor.StartGeneration("generate");
  const InferenceMap a = Feeds({"Elizabeth", "She"}, 40, 1.0, 5);
  const InferenceMap b = Feeds({"Mr. Darcy", "It is", "Her"}, 300, 1.0, 6);
  const InferenceMap c = Feeds({"The"}, 30, 1.0, 7);
  const int64_t ia = batch->Join(a), ib = batch->Join(b);
  for (int i = 0; i < 5; ++i) batch->Step();
  const int64_t ic = batch->Join(c);
  batch->Step();
  EXPECT_EQ(batch->rows(), 6);
  batch->Cancel(ib);
  EXPECT_EQ(batch->rows(), 3);
  EXPECT_THROW(batch->Cancel(ib), NotFoundError);
  std::map<int64_t, InferenceMap> answers;
  while (batch->busy()) {
    const GenerationStep s = batch->Step();
    for (const GenerationToken& t : s.tokens) EXPECT_NE(t.request, ib);
    for (int64_t id : s.finished) answers[id] = batch->Finish(id);
  }
  EXPECT_EQ(answers.count(ib), 0u);
  ExpectSameAnswer(answers.at(ia), predictor.Run("generate", a), "a");
  ExpectSameAnswer(answers.at(ic), predictor.Run("generate", c), "c");
  // Cancelled before its first step: it never runs.
  const int64_t id = batch->Join(c);
  batch->Cancel(id);
  EXPECT_FALSE(batch->busy());
}

}  // namespace
}  // namespace glossa
