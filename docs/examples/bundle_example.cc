// docs/inference.md's snippets: a bundle loaded by hand, and the Predictor reloading weights.
// Compiled into the test binary (tests/CMakeLists.txt); the docs test checks that the guide's C++
// blocks are slices of this file.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "glossa/inference/bundle.h"
#include "glossa/inference/predictor.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/checkpoint/saver.h"
#include "tests/inference/test_bundle.h"  // ExportedBundle(): a bundle of a small Austen LM

TEST(DocsExample, BundleLoadedByHandAndPredictorReload) {
  const std::string dir = glossa::ExportedBundle();  // e.g. "/models/austen_tiny"
  const std::string checkpoint = *glossa::Saver::LatestCheckpoint(glossa::TrainedLogdir() + "/train");
  {
    glossa::LoadedBundle b = glossa::LoadBundle(dir);
    auto& lm = dynamic_cast<glossa::TransformerLmTask&>(b.model->task());
    std::vector<int64_t> ids = b.tokenizer->StringToIds("It is a truth universally acknowledged");
    EXPECT_GT(ids.size(), 3u);
    EXPECT_EQ(&lm.params(), &b.model->task().params());
  }
  glossa::Predictor predictor(dir);   // PredictorOptions: subgraphs, checkpoint,
                                      // max_batch_size, max_input_tokens
  glossa::InferenceMap out = predictor.Run(
      "default", {{"text", glossa::InferenceValue::Strings({"It is a truth universally acknowledged"})}});
  double log_prob = out.at("total_log_prob").tensor[0].item<double>();
  predictor.Load(checkpoint);  // new weights (their EMA), atomically
  EXPECT_LT(log_prob, 0);
  // The bundle holds the EMA of the same checkpoint: reloading it gives the same scores.
  EXPECT_EQ(predictor
                .Run("default", {{"text", glossa::InferenceValue::Strings(
                                              {"It is a truth universally acknowledged"})}})
                .at("total_log_prob")
                .tensor[0]
                .item<double>(),
            log_prob);
}
