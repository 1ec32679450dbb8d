#include "glossa/summary/summary.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(Summary, NoOpOutsideAContextAndNotReentrant) {
  summary::Scalar("ignored", 1.0);  // no context: nothing happens
  SummaryContext ctx;
  EXPECT_THROW(SummaryContext(), FailedPreconditionError);
  EXPECT_TRUE(ctx.MergeAll().empty());
}

TEST(Summary, ScopesAndKeyFormats) {
  SummaryContext ctx;
  summary::Scalar("loss", 2.0);
  {
    SummaryNameScope enc("enc");
    SummaryNameScope layer("layer_0");
    summary::Scalar("over_capacity", 0.25);
    summary::PerExampleTensor("scores", at::ones({3}));
  }
  summary::Tensor("probs", at::zeros({2}));
  summary::PerExampleTensor("ids", at::ones({3}));
  // Lingvo's merge_all: "<name>/<scope>", the scope a suffix ("name/" at the root), per-example
  // tensors included; merge_all_pw_tensor: "<scope>/<name>" with '/' as "__".
  auto all = ctx.MergeAll();
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all.at("loss/").item<double>(), 2.0);
  EXPECT_EQ(all.at("over_capacity/enc/layer_0").item<double>(), 0.25);
  EXPECT_TRUE(all.count("probs/"));
  EXPECT_TRUE(all.count("scores/enc/layer_0"));
  EXPECT_TRUE(all.count("ids/"));
  auto per = ctx.MergeAllPerExample();
  ASSERT_EQ(per.size(), 2u);
  EXPECT_TRUE(per.count("enc__layer_0__scores"));
  EXPECT_TRUE(per.count("__ids"));
  // scalar() takes rank-0 values only.
  EXPECT_ERROR_CONTAINS(summary::Scalar("v", at::ones({1})), InvalidArgumentError,
                        "summary::Scalar('v') takes a scalar (rank 0), got shape [1]: use "
                        "summary::Tensor() instead");
}

TEST(Summary, LoopsReduceByMeanSumAndStack) {
  SummaryContext ctx;
  {
    SummaryLoop loop;
    for (int i = 1; i <= 4; ++i) {
      summary::Scalar("mean_loss", static_cast<double>(i));
      summary::Scalar("total", static_cast<double>(i), SummaryReduce::kSum);
      summary::Tensor("per_step", at::full({2}, static_cast<double>(i)));
    }
  }
  auto all = ctx.MergeAll();
  EXPECT_DOUBLE_EQ(all.at("mean_loss/").item<double>(), 2.5);
  EXPECT_DOUBLE_EQ(all.at("total/").item<double>(), 10.0);
  EXPECT_EQ(all.at("per_step/").sizes(), (std::vector<int64_t>{4, 2}));
  EXPECT_DOUBLE_EQ(all.at("per_step/")[3][0].item<double>(), 4.0);
}

TEST(Summary, MaxLoopVarsDropsExtras) {
  SummaryContext ctx(/*max_loop_vars=*/2);
  {
    SummaryLoop loop;
    for (int i = 0; i < 3; ++i) {
      summary::Scalar("a", 1.0);
      summary::Scalar("b", 2.0);
      summary::Scalar("c", 3.0);  // the third distinct summary in the loop: dropped
    }
  }
  auto all = ctx.MergeAll();
  EXPECT_EQ(all.size(), 2u);
  EXPECT_FALSE(all.count("c/"));
  EXPECT_EQ(ctx.num_dropped_loop_vars(), 3);
  summary::Scalar("c", 3.0);  // outside the loop it is recorded
  EXPECT_TRUE(ctx.MergeAll().count("c/"));
}

TEST(Summary, PerExampleTensorsSkipLoopsAndAreTakenStepByStep) {
  SummaryContext ctx;
  SummaryLoop loop;
  for (int step = 0; step < 2; ++step) {
    {
      SummaryNameScope scope("enc");
      // Two towers record the same key: concatenated along dim 0.
      summary::PerExampleTensor("score", at::full({2}, static_cast<double>(step)));
      summary::PerExampleTensor("score", at::full({3}, 10.0 + step));
    }
    auto taken = ctx.TakePerExample();
    ASSERT_EQ(taken.size(), 1u);
    const at::Tensor score = taken.at("enc__score");
    ASSERT_EQ(score.sizes(), (std::vector<int64_t>{5}));
    EXPECT_EQ(score[0].item<double>(), step);
    EXPECT_EQ(score[4].item<double>(), 10.0 + step);
    EXPECT_TRUE(ctx.TakePerExample().empty());  // taken once
  }
  EXPECT_TRUE(ctx.MergeAll().empty());  // never loop-reduced into the context's summaries
}

TEST(Summary, TpuSummaryTensorsKeyByNameAndSanitizedScope) {
  summary::ClearTpuSummaryTensors();
  summary::AddTpuSummaryTensor("outside", at::ones({}));
  {
    TpuSummaryTensorContext context;
    {
      SummaryNameScope scope("_enc");
      SummaryNameScope layer("layer[2]");
      summary::AddTpuSummaryTensor("aux_loss", at::full({}, 0.5), 8.0);
    }
    summary::AddTpuSummaryTensor("acc", at::full({}, 0.25));
    summary::AddTpuSummaryTensor("acc", at::full({}, 0.75));  // the last value wins
    auto got = summary::GetTpuSummaryTensors();
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got.at("aux_loss/enc/layer_2").first.item<double>(), 0.5);
    EXPECT_EQ(got.at("aux_loss/enc/layer_2").second.item<double>(), 8.0);
    EXPECT_EQ(got.at("acc/").first.item<double>(), 0.75);
  }
  auto outer = summary::GetTpuSummaryTensors();  // the context's entries went with it
  ASSERT_EQ(outer.size(), 1u);
  EXPECT_TRUE(outer.count("outside/"));
  summary::ClearTpuSummaryTensors();
  EXPECT_TRUE(summary::GetTpuSummaryTensors().empty());
  EXPECT_THROW(summary::AddTpuSummaryTensor("v", at::ones({2})), InvalidArgumentError);
}

TEST(Summary, TensorsWhoseShapeChangesInALoopAreFlattenedAndConcatenated) {
  SummaryContext ctx;
  {
    SummaryLoop loop;
    summary::Tensor("activations", at::ones({2, 2}));
    summary::Tensor("activations", at::zeros({3}));
  }
  const at::Tensor a = ctx.MergeAll().at("activations/");
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{7}));
  EXPECT_EQ(a.sum().item<double>(), 4.0);
}

}  // namespace
}  // namespace glossa
