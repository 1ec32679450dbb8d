// CtcPrefixScorer: its prefix scores against ATen's ctc_loss (a whole transcript's CTC
// log-likelihood) and against brute-force sums over every alignment of a tiny model; the beam
// search layout (h = k·B + b) and reordering; and its errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/search/beam_search.h"
#include "glossa/search/ctc_prefix_score.h"

namespace glossa {
namespace {

constexpr int64_t kSos = 1, kEos = 2;

// Random CTC log-probs [B, T, V+1] (blank V).
at::Tensor RandomLogProbs(int64_t b, int64_t t, int64_t v, uint64_t seed) {
  at::manual_seed(seed);
  return at::log_softmax(at::randn({b, t, v + 1}, at::kDouble) * 2.0, -1).to(at::kFloat);
}

// The summed CTC terms of feeding `labels` then </s> to hypothesis slots h with source h % B.
std::vector<double> ScoreTranscripts(const CtcPrefixScorer& ctc, int64_t v,
                                     const std::vector<std::vector<int64_t>>& labels) {
  const int64_t n = static_cast<int64_t>(labels.size());
  NestedMap states = ctc.InitStates(n);
  std::vector<double> total(n, 0.0);
  at::Tensor ids = at::full({n}, kSos, at::kLong);
  size_t longest = 0;
  for (const auto& l : labels) longest = std::max(longest, l.size());
  std::vector<bool> done(n, false);
  for (size_t step = 0; step <= longest; ++step) {
    auto [joint, next] = ctc.Step(ids, at::zeros({n, v}), states);
    at::Tensor new_ids = ids.clone();
    for (int64_t h = 0; h < n; ++h) {
      if (done[h]) continue;
      const int64_t tok = step < labels[h].size() ? labels[h][step] : kEos;
      total[h] += joint[h][tok].item<double>();
      new_ids[h] = tok;
      if (tok == kEos) done[h] = true;
    }
    ids = new_ids;
    states = next;
  }
  return total;
}

TEST(CtcPrefixScorerTest, WholeTranscriptsScoreTheirCtcLikelihood) {
  const int64_t b = 3, t = 9, v = 7;
  const at::Tensor lp = RandomLogProbs(b, t, v, 11);
  const at::Tensor lens = at::tensor(std::vector<int64_t>{9, 6, 4});
  const CtcPrefixScorer ctc(lp, lens, /*weight=*/1.0, kSos, kEos);
  // Repeated labels need a blank between them; the third source's 4 frames fit 3 labels.
  const std::vector<std::vector<int64_t>> labels = {{3, 4, 4, 5}, {6, 3, 6}, {5, 5, 0}};
  const std::vector<double> got = ScoreTranscripts(ctc, v, labels);
  for (int64_t i = 0; i < b; ++i) {
    const at::Tensor tgt = at::tensor(labels[i]).unsqueeze(0);
    const double nll =
        at::ctc_loss(lp.narrow(0, i, 1).to(at::kDouble).transpose(0, 1), tgt,
                     lens.narrow(0, i, 1), at::tensor(std::vector<int64_t>{int64_t(labels[i].size())}),
                     /*blank=*/v, at::Reduction::Sum)
            .item<double>();
    EXPECT_NEAR(got[i], -nll, 1e-4) << "source " << i;
  }
}

// Every alignment of a 4-frame, 3-label + blank model, collapsed: the probability mass of all
// transcripts that start with each prefix, and of each whole transcript.
TEST(CtcPrefixScorerTest, PrefixScoresEqualSumsOverAlignments) {
  const int64_t t = 4, v = 4;  // labels 0..3 (sos 1, eos 2 are ordinary CTC labels too), blank 4
  const at::Tensor lp = RandomLogProbs(1, t, v, 5);
  const at::Tensor p = lp[0].to(at::kDouble).exp();
  std::map<std::vector<int64_t>, double> whole;
  std::vector<int64_t> a(t, 0);
  for (int64_t code = 0; code < 625; ++code) {
    double prob = 1.0;
    std::vector<int64_t> collapsed;
    int64_t prev = -1;
    for (int64_t i = 0, c = code; i < t; ++i, c /= 5) {
      const int64_t s = c % 5;
      prob *= p[i][s].item<double>();
      if (s != v && s != prev) collapsed.push_back(s);
      prev = s;
    }
    whole[collapsed] += prob;
  }
  auto prefix_mass = [&](const std::vector<int64_t>& g) {
    double m = 0.0;
    for (const auto& [seq, prob] : whole) {
      if (seq.size() >= g.size() && std::equal(g.begin(), g.end(), seq.begin())) m += prob;
    }
    return m;
  };
  const CtcPrefixScorer ctc(lp, at::tensor(std::vector<int64_t>{t}), 1.0, kSos, kEos);
  for (const std::vector<int64_t>& g : std::vector<std::vector<int64_t>>{{0}, {3}, {0, 3}, {3, 3}, {0, 3, 0}}) {
    NestedMap states = ctc.InitStates(1);
    at::Tensor ids = at::full({1}, kSos, at::kLong);
    double psi = 0.0;
    for (size_t i = 0; i < g.size(); ++i) {
      auto [delta, next] = ctc.PrefixScores(ids, states);
      psi += delta[0][g[i]].item<double>();
      // ψ(prefix ending here) and ψ(prefix + </s>) = the whole transcript's probability.
      std::vector<int64_t> pre(g.begin(), g.begin() + static_cast<int64_t>(i) + 1);
      EXPECT_NEAR(std::exp(psi), prefix_mass(pre), 1e-5) << "prefix of length " << i + 1;
      auto [delta2, unused] = ctc.PrefixScores(at::full({1}, g[i], at::kLong), next);
      (void)unused;
      EXPECT_NEAR(std::exp(psi + delta2[0][kEos].item<double>()), whole[pre], 1e-5)
          << "whole transcript of length " << i + 1;
      states = next;
      ids = at::full({1}, g[i], at::kLong);
    }
  }
}

TEST(CtcPrefixScorerTest, HypothesesReadTheirSourceAndFollowTheSearchsReordering) {
  const int64_t b = 2, t = 6, v = 6;
  const at::Tensor lp = RandomLogProbs(b, t, v, 3);
  const at::Tensor lens = at::tensor(std::vector<int64_t>{6, 5});
  const CtcPrefixScorer ctc(lp, lens, 1.0, kSos, kEos);
  // Slots h = k·B + b: (k=0, b=0), (0, 1), (1, 0), (1, 1) with different transcripts.
  const std::vector<std::vector<int64_t>> labels = {{3, 4}, {5}, {4, 4}, {3, 5, 3}};
  const std::vector<double> joint = ScoreTranscripts(ctc, v, labels);
  for (int64_t h = 0; h < 4; ++h) {
    const CtcPrefixScorer single(lp.narrow(0, h % b, 1), lens.narrow(0, h % b, 1), 1.0, kSos, kEos);
    EXPECT_NEAR(joint[h], ScoreTranscripts(single, v, {labels[h]})[0], 1e-5) << "slot " << h;
  }
  // Reordering the states (as the beam search does after picking parents) moves a prefix's
  // scores with it: slot 1 continuing slot 0's prefix scores as slot 0 would.
  NestedMap s = ctc.InitStates(2);
  auto [d0, s1] = ctc.PrefixScores(at::full({2}, kSos, at::kLong), s);
  const at::Tensor from_zero = at::tensor(std::vector<int64_t>{0, 0});
  NestedMap moved = GatherStates(s1, from_zero);
  auto [d1, s2] = ctc.PrefixScores(at::tensor(std::vector<int64_t>{3, 3}), moved);
  auto [d1_ref, s2_ref] = ctc.PrefixScores(at::tensor(std::vector<int64_t>{3, 3}), s1);
  EXPECT_TRUE(at::allclose(d1[0], d1_ref[0]));
  // Slot 1 reads source 1's frames with slot 0's prefix, which differs from both rows above.
  EXPECT_FALSE(at::allclose(d1[1], d1_ref[1]));
}

TEST(CtcPrefixScorerTest, JointScoresWeighTheDecoder) {
  const at::Tensor lp = RandomLogProbs(1, 5, 5, 9);
  const CtcPrefixScorer ctc(lp, at::tensor(std::vector<int64_t>{5}), 0.3, kSos, kEos);
  const at::Tensor ids = at::full({1}, kSos, at::kLong);
  const at::Tensor att = at::log_softmax(at::randn({1, 5}), -1);
  auto [joint, unused] = ctc.Step(ids, att, ctc.InitStates(1));
  auto [delta, unused2] = ctc.PrefixScores(ids, ctc.InitStates(1));
  EXPECT_TRUE(at::allclose(joint, att * 0.7 + delta * 0.3));
  // </s> before any label: the probability that the whole utterance is blank.
  EXPECT_NEAR(delta[0][kEos].item<double>(), lp[0].select(1, 5).sum().item<double>(), 1e-5);
}

TEST(CtcPrefixScorerTest, PrefixesLongerThanTheAudioAreFlooredNotNan) {
  const at::Tensor lp = RandomLogProbs(1, 2, 5, 4);
  const CtcPrefixScorer ctc(lp, at::tensor(std::vector<int64_t>{2}), 1.0, kSos, kEos);
  NestedMap s = ctc.InitStates(1);
  at::Tensor ids = at::full({1}, kSos, at::kLong);
  for (int64_t tok : {3, 3, 4}) {  // "3 3" needs 3 frames; 2 are there
    auto [delta, next] = ctc.PrefixScores(ids, s);
    EXPECT_FALSE(delta.isnan().any().item<bool>());
    s = next;
    ids = at::full({1}, tok, at::kLong);
  }
  // ψ("3 3 4"), kept among the candidates of "3 3", is the floor; its </s> adds nothing finite.
  EXPECT_EQ(s.GetTensor("psi")[0][4].item<double>(), -1e10);
  auto [delta, next] = ctc.PrefixScores(ids, s);
  EXPECT_EQ(delta[0][kEos].item<double>(), 0.0);
}

// A <s> that a search forced into a hypothesis after the first step is no empty prefix: what
// follows it scores no better than the floor (it used to restart the prefix, a +1e10 jump that a
// lexicon-constrained search then followed).
TEST(CtcPrefixScorerTest, ALaterSosDoesNotRestartThePrefix) {
  const at::Tensor lp = RandomLogProbs(1, 6, 5, 7);
  const CtcPrefixScorer ctc(lp, at::tensor(std::vector<int64_t>{6}), 1.0, kSos, kEos);
  NestedMap s = ctc.InitStates(1);
  auto [d0, s0] = ctc.PrefixScores(at::full({1}, kSos, at::kLong), s);
  EXPECT_EQ(d0[0][kSos].item<double>(), -1e10);  // <s> as a label: floored
  auto [d1, s1] = ctc.PrefixScores(at::full({1}, 3, at::kLong), s0);
  auto [d2, s2] = ctc.PrefixScores(at::full({1}, kSos, at::kLong), s1);  // "3 <s>": impossible
  EXPECT_LE(d2.max().item<double>(), 0.0) << d2;
  EXPECT_EQ(s2.GetTensor("psi").max().item<double>(), -1e10);
}

TEST(CtcPrefixScorerTest, RejectsBadShapesAndSettings) {
  const at::Tensor lp = RandomLogProbs(2, 4, 5, 1);
  const at::Tensor lens = at::tensor(std::vector<int64_t>{4, 3});
  EXPECT_THROW(CtcPrefixScorer(lp[0], lens, 0.3, kSos, kEos), InvalidArgumentError);
  EXPECT_THROW(CtcPrefixScorer(lp, lens.narrow(0, 0, 1), 0.3, kSos, kEos), InvalidArgumentError);
  EXPECT_THROW(CtcPrefixScorer(lp, lens, 1.5, kSos, kEos), InvalidArgumentError);
  EXPECT_THROW(CtcPrefixScorer(lp, lens, 0.3, kSos, kSos), InvalidArgumentError);
  EXPECT_THROW(CtcPrefixScorer(lp, lens, 0.3, kSos, 5), InvalidArgumentError);  // 5 is the blank
  const CtcPrefixScorer ctc(lp, lens, 0.3, kSos, kEos);
  EXPECT_THROW(ctc.InitStates(3), InvalidArgumentError);  // not a multiple of 2 sources
  EXPECT_THROW(ctc.Step(at::full({2}, kSos, at::kLong), at::zeros({2, 6}), ctc.InitStates(2)),
               InvalidArgumentError);  // the decoder's vocabulary is not the CTC head's
}

}  // namespace
}  // namespace glossa
