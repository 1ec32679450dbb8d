#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/tasks/lm/unigram_baseline.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/input/input_generator.h"
#include "glossa/input/tokenizers.h"
#include "glossa/runtime/jobs.h"
#include "glossa/tasks/data_dir.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

Params TinyLmParams() {
  Params p = TransformerLmTask::CommonParams(/*vocab_size=*/11, /*model_dim=*/8,
                                             /*hidden_dim=*/16, /*num_heads=*/2, /*num_layers=*/2);
  p.Set("name", "lm").Set("random_seed", 7);
  return p;
}

std::unique_ptr<TransformerLmTask> TinyLm() {
  return InstantiateLayer<TransformerLmTask>(TinyLmParams());
}

NestedMap Batch() {
  at::Tensor ids = at::tensor({1, 5, 6, 7, 3, 1, 8, 9, 2, 2}, at::kLong).view({2, 5});
  at::Tensor labels = at::tensor({5, 6, 7, 3, 2, 8, 9, 2, 2, 2}, at::kLong).view({2, 5});
  at::Tensor paddings = at::tensor({0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, at::kFloat).view({2, 5});
  return NestedMap{{"ids", ids}, {"labels", labels}, {"paddings", paddings}};
}

TEST(TransformerLm, MetricsAreTokenWeightedCrossEntropyAndAccuracy) {
  auto lm = TinyLm();
  NestedMap batch = Batch();
  auto out = lm->FPropDefaultTheta(batch);
  // Independent: log-softmax of the logits, gathered per token, averaged over unpadded tokens.
  at::Tensor logits =
      lm->Logits(lm->theta(), batch.GetTensor("ids"), batch.GetTensor("paddings")).to(at::kDouble);
  at::Tensor lp =
      at::log_softmax(logits, -1).gather(-1, batch.GetTensor("labels").unsqueeze(-1)).squeeze(-1);
  at::Tensor w = 1 - batch.GetTensor("paddings").to(at::kDouble);
  const double want = (-(lp * w).sum() / w.sum()).item<double>();
  EXPECT_NEAR(out.metrics.at("log_pplx").value.item<double>(), want, 1e-5);
  EXPECT_NEAR(out.metrics.at("loss").value.item<double>(), want, 1e-5);
  EXPECT_EQ(out.metrics.at("loss").weight.item<double>(), 8.0);
  const at::Tensor correct = (logits.argmax(-1) == batch.GetTensor("labels")).to(at::kDouble);
  EXPECT_NEAR(out.metrics.at("fraction_of_correct_next_step_preds").value.item<double>(),
              ((correct * w).sum() / w.sum()).item<double>(), 1e-9);
}

// Packed rows (the input's packed_input): two sentences in one row with segment_ids and
// segment_pos give the metrics the same sentences give in rows of their own, each counted as a
// sample; without the segment ids (attention across the sentences, positions running on) the
// log-perplexity differs.
TEST(TransformerLm, APackedRowScoresItsSentencesAsSeparateRows) {
  auto lm = TinyLm();
  const NestedMap unpacked{
      {"ids", at::tensor({1, 5, 6, 7, 1, 8, 9, 2}, at::kLong).view({2, 4})},
      {"labels", at::tensor({5, 6, 7, 2, 8, 9, 2, 2}, at::kLong).view({2, 4})},
      {"paddings", at::tensor({0, 0, 0, 0, 0, 0, 0, 1}, at::kFloat).view({2, 4})}};
  NestedMap packed{{"ids", at::tensor({1, 5, 6, 7, 1, 8, 9, 2}, at::kLong).view({1, 8})},
                   {"labels", at::tensor({5, 6, 7, 2, 8, 9, 2, 2}, at::kLong).view({1, 8})},
                   {"paddings", at::tensor({0, 0, 0, 0, 0, 0, 0, 1}, at::kFloat).view({1, 8})}};
  const auto plain = lm->FPropDefaultTheta(packed).metrics;
  packed.Put("segment_ids", at::tensor({1, 1, 1, 1, 2, 2, 2, 0}, at::kLong).view({1, 8}));
  packed.Put("segment_pos", at::tensor({0, 1, 2, 3, 0, 1, 2, 0}, at::kLong).view({1, 8}));
  const auto want = lm->FPropDefaultTheta(unpacked).metrics;
  const auto got = lm->FPropDefaultTheta(packed).metrics;
  for (const char* m : {"log_pplx", "fraction_of_correct_next_step_preds", "num_predictions",
                        "num_samples_in_batch"}) {
    EXPECT_NEAR(got.at(m).value.item<double>(), want.at(m).value.item<double>(), 1e-5) << m;
  }
  EXPECT_EQ(got.at("num_samples_in_batch").value.item<double>(), 2.0);
  EXPECT_GT(std::abs(plain.at("log_pplx").value.item<double>() -
                     want.at("log_pplx").value.item<double>()),
            1e-4);
  EXPECT_ERROR_CONTAINS(lm->Decode(packed), InvalidArgumentError, "cannot decode packed rows");
  packed.erase("segment_pos");
  EXPECT_ERROR_CONTAINS(lm->FPropDefaultTheta(packed), InvalidArgumentError,
                        "needs both segment_ids and segment_pos");
}

TEST(TransformerLm, IsCausal) {
  auto lm = TinyLm();
  NestedMap batch = Batch();
  at::Tensor a = lm->Logits(lm->theta(), batch.GetTensor("ids"), {});
  at::Tensor ids2 = batch.GetTensor("ids").clone();
  ids2.index_put_({0, 4}, 10);  // change the last token only
  at::Tensor b = lm->Logits(lm->theta(), ids2, {});
  EXPECT_TRUE(at::allclose(a.slice(1, 0, 4), b.slice(1, 0, 4), 1e-5, 1e-6));
  EXPECT_FALSE(at::allclose(a.slice(1, 4), b.slice(1, 4)));
}

TEST(TransformerLm, SamplingMatchesFullForwardAndIsDeterministic) {
  auto lm = TinyLm();
  at::Tensor prompts = at::tensor({1, 5, 6, 1, 8, 9}, at::kLong).view({2, 3});
  // Greedy (temperature 0) incremental decoding must pick the argmax of a full forward pass.
  at::Tensor greedy = lm->Sample(lm->theta(), prompts, 4, 0.0, 0, 1);
  ASSERT_EQ(greedy.size(0), 2);
  for (int64_t t = 3; t < greedy.size(1); ++t) {
    at::Tensor logits = lm->Logits(lm->theta(), greedy.slice(1, 0, t), {});
    at::Tensor want = logits.select(1, t - 1).argmax(-1);
    for (int64_t r = 0; r < 2; ++r) {
      if (greedy.slice(1, 3, t).index({r}).eq(2).any().item<bool>())
        continue;  // finished rows hold </s>
      EXPECT_EQ(greedy.index({r, t}).item<int64_t>(), want.index({r}).item<int64_t>())
          << "row " << r << " t " << t;
    }
  }
  // top_k = 1 sampling is greedy; sampling is a function of the seed.
  EXPECT_TRUE(at::equal(lm->Sample(lm->theta(), prompts, 4, 1.0, 1, 99), greedy));
  EXPECT_TRUE(at::equal(lm->Sample(lm->theta(), prompts, 6, 1.0, 0, 5),
                        lm->Sample(lm->theta(), prompts, 6, 1.0, 0, 5)));
}

TEST(TransformerLm, RejectsBadConfigs) {
  Params p = TransformerLmTask::Params();
  p.Set("name", "lm");
  EXPECT_THROW(InstantiateLayer<TransformerLmTask>(p), InvalidArgumentError);
  // Sub-Params whose dimensions disagree: the error names both fields.
  Params q = TinyLmParams();
  q.Set("softmax.input_dim", 9);
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerLmTask>(q), InvalidArgumentError,
                        "softmax.input_dim (9) must equal emb.embedding_dim (8)");
  q = TinyLmParams();
  q.Set("softmax.num_classes", 12);
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerLmTask>(q), InvalidArgumentError,
                        "softmax.num_classes (12) must equal emb.vocab_size (11)");
}

// A tokenizer whose size differs from the model's is refused when the task is built, naming every
// Params that must agree and the override that fixes them (not "ids must be in [0, N)" at step 1).
TEST(TransformerLm, AVocabularyMismatchIsRefusedAtBuildNamingEveryParams) {
  const std::string dir = glossa::testing::TempDir("lm_vocab");
  AtomicWriteFile(dir + "/t.txt", "a line of text\n");
  const std::string spm = FindDataDir("austen", "scripts/prepare_austen.sh") + "/spm_2k.model";
  Params p = TinyLmParams();
  p.Set("input",
        TextLmInput::Params()
            .Set("name", "input")
            .Set("file_pattern", "text:" + dir + "/t.txt")
            .Set("tokenizer", SentencePieceTokenizer::Params().Set("spm_model_file", spm)));
  EXPECT_ERROR_CONTAINS(
      InstantiateLayer<TransformerLmTask>(p), InvalidArgumentError,
      spm +
          " has 2000 ids, but input.tokenizer.vocab_size is 64, emb.vocab_size is 11, "
          "softmax.num_classes is 11: the vocabulary sizes must agree. Set them all: "
          "--model_params_override=\"task.input.tokenizer.vocab_size : 2000; "
          "task.emb.vocab_size : 2000; task.softmax.num_classes : 2000\"");
  // Only the disagreeing keys are named.
  p.Set("input.tokenizer.vocab_size", 2000);
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerLmTask>(p), InvalidArgumentError,
                        "has 2000 ids, but emb.vocab_size is 11, softmax.num_classes is 11:");
  p.Set("emb.vocab_size", 2000).Set("softmax.num_classes", 2000);
  EXPECT_NO_THROW(InstantiateLayer<TransformerLmTask>(p));
}

// Every field of every sublayer is reachable by its path: the feed-forward activation deep in the
// LM changes the output, and a misspelled path names the near keys.
TEST(TransformerLm, DeepOverridesReachEverySublayer) {
  const NestedMap batch = Batch();
  auto base = TinyLm();
  const at::Tensor logits = base->Logits(base->theta(), batch.GetTensor("ids"),
                                         batch.GetTensor("paddings"));
  Params p = TinyLmParams();
  p.FromText("stack.transformer_layer_params_tpl.tr_fflayer_tpl.activation : 'GELU'\n");
  auto gelu = InstantiateLayer<TransformerLmTask>(p);
  // Same weights (same seed and names), another non-linearity.
  EXPECT_TRUE(at::equal(gelu->vars().GetTensor("stack.x_layers[0].fflayer.fc0.w"),
                        base->vars().GetTensor("stack.x_layers[0].fflayer.fc0.w")));
  const at::Tensor gelu_logits =
      gelu->Logits(gelu->theta(), batch.GetTensor("ids"), batch.GetTensor("paddings"));
  EXPECT_FALSE(at::allclose(gelu_logits, logits, 1e-4, 1e-4));
  EXPECT_EQ(gelu->GetDescendant("stack.x_layers[1].fflayer.fc0").params().GetString("activation"),
            "GELU");
  // Post-layer-norm attention, reached the same way.
  p = TinyLmParams();
  p.FromText("stack.transformer_layer_params_tpl.tr_atten_tpl.pre_layer_norm : False\n");
  auto post = InstantiateLayer<TransformerLmTask>(p);
  EXPECT_FALSE(at::allclose(
      post->Logits(post->theta(), batch.GetTensor("ids"), batch.GetTensor("paddings")), logits,
      1e-4, 1e-4));
  // A misspelled path: did-you-mean.
  p = TinyLmParams();
  EXPECT_ERROR_CONTAINS(
      p.FromText("stack.transformer_layer_params_tpl.tr_fflayer_tpl.activaton : 'GELU'\n"),
      NotFoundError, "did you mean: [activation]");
}

TEST(UnigramBaseline, AddOneSmoothedLogPerplexity) {
  UnigramBaseline u(4);
  NestedMap b{{"labels", at::tensor({0, 1, 1, 3}, at::kLong).view({1, 4})},
              {"paddings", at::tensor({0, 0, 0, 1}, at::kFloat).view({1, 4})}};
  u.Count(b);  // counts 1+[1, 2, 0, 0] over a total of 4 + 3
  EXPECT_DOUBLE_EQ(u.counts[1], 3.0);
  EXPECT_DOUBLE_EQ(u.total, 7.0);
  auto [nll, n] = u.Score(b);
  EXPECT_EQ(n, 3.0);
  EXPECT_NEAR(nll, -(std::log(2.0 / 7) + 2 * std::log(3.0 / 7)), 1e-12);
  NestedMap bad{{"labels", at::tensor({9}, at::kLong).view({1, 1})},
                {"paddings", at::zeros({1, 1})}};
  EXPECT_THROW(u.Count(bad), InvalidArgumentError);
}

TEST(CheckpointJob, BacksOffWhileWaitingForCheckpoints) {
  // This process's own directory: unit_tests and unit_tests_reference_kernels run at once.
  const std::string logdir = glossa::testing::TempDir("job_backoff") + "/logdir";
  std::vector<double> sleeps;
  std::atomic<bool> stop{false};
  JobOptions o;
  o.logdir = logdir;
  o.dataset = "Dev";
  std::vector<std::string> lines;
  o.log = [&](const std::string& l) { lines.push_back(l); };
  o.sleep = [&](double s) {
    sleeps.push_back(s);
    if (sleeps.size() == 10) stop.store(true);
  };
  o.stop = &stop;
  o.wait_for_train = true;  // no run has started in logdir yet
  Params mp = SingleTaskModel::Params();
  Params tp = TransformerLmTask::CommonParams(5, 4, 8, 1, 1);
  tp.Set("name", "lm");
  mp.Set("task", tp);
  EXPECT_EQ(RunCheckpointJob(JobKind::kEval, mp, o), 0);
  EXPECT_EQ(sleeps, (std::vector<double>{1, 2, 4, 8, 16, 32, 64, 128, 256, 300}));
  EXPECT_FALSE(std::filesystem::exists(logdir + "/train"));  // the job only read
  // What it waits for, then a heartbeat after each poll once 30 s have passed since the last line:
  // after 31 s (1+2+4+8+16), 63, 127, 255, 511 and 811 s of waiting.
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0], "evaler: waiting for a new checkpoint in " + logdir +
                          "/train (none yet; the job ends after the checkpoint at step 4000000)");
  EXPECT_EQ(lines[1], "still waiting for a new checkpoint in " + logdir +
                          "/train (0:31 so far; none yet)");
  EXPECT_EQ(lines[6], "still waiting for a new checkpoint in " + logdir +
                          "/train (13:31 so far; none yet)");
}

}  // namespace
}  // namespace glossa
