// The output helpers of a beam search: Lingvo's TopKOpTest (beam_search_step_op_test.py:
// hyps_from_beam_search_outs, top_k_from_beam_search_outs and their equivalence with
// top_k_terminated_hyps) and MergeBeamSearchOutputsTest (beam_search_helper_test.py), ported with
// their inputs and expected values.
#include "glossa/search/beam_search_outputs.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "glossa/base/errors.h"

namespace glossa {
namespace {

using IntMatrix = std::vector<std::vector<int64_t>>;

at::Tensor Ints(const IntMatrix& m) {
  std::vector<int64_t> flat;
  for (const auto& row : m) flat.insert(flat.end(), row.begin(), row.end());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(m.size()), -1});
}

at::Tensor Doubles(const std::vector<std::vector<double>>& m) {
  std::vector<double> flat;
  for (const auto& row : m) flat.insert(flat.end(), row.begin(), row.end());
  return at::tensor(flat, at::kDouble).view({static_cast<int64_t>(m.size()), -1});
}

std::vector<int64_t> Row(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(BeamSearchOutputs, HypsFromBeamSearchOuts) {
  const int64_t hyp_size = 4, src_len = 2, tgt_len = 3;
  BeamSearchOuts outs;
  outs.hyps = Ints({{3, 4, 5, 6}, {7, 8, 9, 10}, {0, 0, 0, 0}});
  outs.prev_hyps = Ints({{4, 4, 4, 4}, {2, 3, 0, 1}, {4, 4, 4, 4}});  // rows 0 and 2 unused
  outs.done_hyps = at::ones({tgt_len, hyp_size}, at::kBool);
  outs.scores = at::zeros({tgt_len, hyp_size});
  outs.eos_scores = at::zeros({tgt_len, hyp_size});
  // Step 0: [[0, 1], [2, 3], [4, 5], [6, 7]], step 1: [[8, 9], ..., [14, 15]].
  outs.atten_probs =
      at::arange(tgt_len * hyp_size * src_len, at::kFloat).view({tgt_len, hyp_size, src_len});
  outs.eos_atten_probs = at::ones({tgt_len, hyp_size, src_len});
  const HypothesisGrid done = HypsFromBeamSearchOuts(outs, /*eos_id=*/2, /*num_hyps_per_beam=*/2);
  ASSERT_EQ(done.size(), 3u);
  ASSERT_EQ(done[2].size(), 4u);
  // Slot 0 at step 2: </s> after slot 0 at step 1 (7), which extended slot 2 at step 0 (5).
  const IntMatrix ids = {{5, 7, 2}, {6, 8, 2}, {3, 9, 2}, {4, 10, 2}};
  const std::vector<std::vector<std::vector<float>>> atten = {{{4, 5}, {8, 9}, {1, 1}},
                                                              {{6, 7}, {10, 11}, {1, 1}},
                                                              {{0, 1}, {12, 13}, {1, 1}},
                                                              {{2, 3}, {14, 15}, {1, 1}}};
  for (int64_t j = 0; j < hyp_size; ++j) {
    EXPECT_EQ(done[2][j].ids, ids[j]) << "hyp " << j;
    EXPECT_EQ(done[2][j].atten_vecs, atten[j]) << "hyp " << j;
    EXPECT_EQ(done[2][j].beam_id, j % 2);
  }
}

BeamSearchOuts TopKOuts() {
  BeamSearchOuts outs;
  outs.hyps = Ints({{0, 1, 0, 1, 0, 1}, {1, 0, 0, 1, 1, 0}, {0, 1, 0, 1, 0, 0}});
  outs.prev_hyps = Ints({{0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}});
  outs.done_hyps = at::ones({3, 6}, at::kBool);
  outs.cumulative_scores = Doubles({{1., 1., 5., 2., 3., 6.},
                                    {1., 4., 2., 5., 6., 3.},
                                    {10., 10., 10., 10., 10., 10.}});  // the last row is not read
  outs.eos_scores = Doubles({{6., 0., 0., 0., 0., 0.}, {0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0}});
  return outs;
}

TEST(BeamSearchOutputs, TopKFromBeamSearchOuts) {
  // Source 0's best: [0, 0] (its </s>), [1, 4] and [0, 2] (the cumulative scores before </s>):
  // [2], [0, 1, 2], [0, 2]. Source 1's: [0, 5], [1, 3], [1, 1]: [1, 2], [1, 1, 2], [1, 0, 2].
  const IntMatrix ids = {{2, 0, 0}, {0, 1, 2}, {0, 2, 0}, {1, 2, 0}, {1, 1, 2}, {1, 0, 2}};
  const std::vector<int64_t> lens = {1, 3, 2, 2, 3, 3};
  const std::vector<double> scores = {6., 6., 5., 6., 5., 4.};
  for (double alpha : {0.0, 0.5}) {
    const BeamSearchDecodeOutput out = TopKFromBeamSearchOuts(
        TopKOuts(), {.num_hyps_per_beam = 3, .max_seq_length = 3, .length_normalization = alpha});
    ASSERT_EQ(out.topk_ids.sizes(), (std::vector<int64_t>{2, 3, 3}));
    ASSERT_EQ(out.topk_lens.sizes(), (std::vector<int64_t>{2, 3}));
    for (int64_t i = 0; i < 6; ++i) {
      const int64_t b = i / 3, k = i % 3;
      EXPECT_EQ(Row(out.topk_ids[b][k]), ids[i]) << "alpha " << alpha << " hyp " << i;
      EXPECT_EQ(out.topk_lens[b][k].item<int64_t>(), lens[i]) << "alpha " << alpha << " hyp " << i;
      const double norm = std::pow(lens[i] + 5.0, alpha) / std::pow(5.0, alpha);
      EXPECT_NEAR(out.topk_scores[b][k].item<double>(), scores[i] / norm, 1e-6)
          << "alpha " << alpha << " hyp " << i;
    }
    EXPECT_TRUE(out.topk_hyps.empty());  // populate_topk_hyps is off
  }
}

// Lingvo's testTopKEquivalent: on random tensors, TopKFromBeamSearchOuts equals
// HypsFromBeamSearchOuts + TopKTerminatedHyps + UnpackHyp (ids, lengths, scores and, when
// populated, the hypotheses).
struct EquivalentCase {
  const char* name;
  double length_normalization, coverage_penalty, length_ratio;
  bool populate_hyps;
};

TEST(BeamSearchOutputs, TopKFromBeamSearchOutsEqualsTopKTerminatedHyps) {
  const std::vector<EquivalentCase> cases = {{"Base", 0., 0.0, 1.0, false},
                                             {"LengthNorm", .5, 0.0, 1.0, false},
                                             {"LengthNormHalfAndHyp", 0.5, 0.0, 1.0, true},
                                             {"LengthNormOneAndHyp", 1., 0.0, 1.0, true},
                                             {"Coverage", 0.0, 1.0, 1.0, false},
                                             {"Coverage2", 0.0, .1, 1.3, false},
                                             {"CoverageAndHyp", 0.0, .1, 1.3, true},
                                             {"All", 0.5, .2, 1.1, true}};
  const int64_t hyp_size = 32, num_beams = 8, k = hyp_size / num_beams, seq_len = 10;
  at::manual_seed(12345);
  for (const EquivalentCase& c : cases) {
    BeamSearchOuts outs;
    outs.hyps = at::randint(3, 100, {seq_len, hyp_size}, at::kLong);
    // Aligned hypotheses (slot j extends slot j), so the cumulative scores are plain sums.
    outs.prev_hyps = at::arange(hyp_size, at::kLong).repeat({seq_len, 1});
    outs.done_hyps = at::ones({seq_len, hyp_size}, at::kBool);
    outs.scores = at::rand({seq_len, hyp_size}, at::kDouble) * 1.5 - 0.5;
    outs.cumulative_scores = outs.scores.cumsum(0);
    outs.eos_scores = at::rand({seq_len, hyp_size}, at::kDouble) * 1.5 - 0.5;
    outs.atten_probs = at::rand({seq_len, hyp_size, seq_len}) * 0.05;
    outs.eos_atten_probs = at::rand({seq_len, hyp_size, seq_len}) * 0.05;
    const at::Tensor before = at::cat(
        {at::zeros({1, hyp_size, seq_len}), outs.atten_probs.cumsum(0).slice(0, 0, seq_len - 1)});
    outs.cumulative_atten_probs = before + outs.eos_atten_probs;
    const BeamSearchDecodeOutput fast =
        TopKFromBeamSearchOuts(outs, {.num_hyps_per_beam = k,
                                      .max_seq_length = seq_len,
                                      .length_normalization = c.length_normalization,
                                      .coverage_penalty = c.coverage_penalty,
                                      .target_seq_length_ratio = c.length_ratio,
                                      .populate_topk_hyps = c.populate_hyps});
    const HypothesisGrid done = HypsFromBeamSearchOuts(outs, /*eos_id=*/2, k);
    const HypothesisGrid topk =
        TopKTerminatedHyps(done, at::full({num_beams}, seq_len, at::kLong), k, k,
                           c.length_normalization, c.coverage_penalty, c.length_ratio);
    const SearchResult slow = UnpackHyp(topk, seq_len);
    EXPECT_TRUE(at::equal(fast.topk_ids, slow.topk_ids)) << c.name;
    EXPECT_TRUE(at::equal(fast.topk_lens, slow.topk_lens)) << c.name;
    EXPECT_TRUE(at::allclose(fast.topk_scores, slow.topk_scores, 1e-5, 1e-5)) << c.name;
    if (!c.populate_hyps) continue;
    ASSERT_EQ(fast.topk_hyps.size(), static_cast<size_t>(num_beams)) << c.name;
    for (int64_t b = 0; b < num_beams; ++b) {
      ASSERT_EQ(fast.topk_hyps[b].size(), static_cast<size_t>(k)) << c.name;
      for (int64_t j = 0; j < k; ++j) {
        const Hypothesis &x = fast.topk_hyps[b][j], &y = topk[b][j];
        EXPECT_EQ(x.beam_id, y.beam_id) << c.name;
        EXPECT_EQ(x.ids, y.ids) << c.name;
        EXPECT_NEAR(x.normalized_score, y.normalized_score, 1e-5) << c.name;
        ASSERT_EQ(x.scores.size(), y.scores.size()) << c.name;
        for (size_t s = 0; s < x.scores.size(); ++s) EXPECT_NEAR(x.scores[s], y.scores[s], 1e-9);
        EXPECT_EQ(x.atten_vecs, y.atten_vecs) << c.name;
      }
    }
  }
}

// A search output with named hypotheses (Lingvo's test uses strings for topk_hyps).
BeamSearchDecodeOutput Output(const std::vector<std::vector<double>>& scores,
                              const std::vector<IntMatrix>& ids, const IntMatrix& lens,
                              const IntMatrix& names) {
  BeamSearchDecodeOutput o;
  o.topk_scores = Doubles(scores);
  std::vector<at::Tensor> per_beam;
  for (const IntMatrix& m : ids) per_beam.push_back(Ints(m));
  o.topk_ids = at::stack(per_beam);
  o.topk_lens = Ints(lens);
  for (size_t b = 0; b < names.size(); ++b) {
    o.topk_hyps.emplace_back();
    for (int64_t name : names[b]) {
      Hypothesis h;
      if (name != 0) {
        h.beam_id = static_cast<int64_t>(b);
        h.ids = {name};
      }
      o.topk_hyps.back().push_back(h);
    }
  }
  return o;
}

TEST(BeamSearchOutputs, MergeBeamSearchOutputs) {
  // Names: 1 "one", 3 "three", -2 "minus two", 0 the empty hypothesis.
  const BeamSearchDecodeOutput a =
      Output({{1., 3., 5.}, {-2., -1., 0.}},
             {{{10, 11, 12}, {30, 31, 32}, {50, 51, 52}}, {{20, 21, 22}, {10, 11, 12}, {0, 0, 0}}},
             {{3, 3, 2}, {3, 3, 0}}, {{1, 3, 5}, {-2, -1, 0}});
  const BeamSearchDecodeOutput b =
      Output({{2., 4.}, {-3., 0.}}, {{{20, 21, 22}, {40, 41, 42}}, {{30, 31, 33}, {0, 0, 0}}},
             {{3, 2}, {3, 0}}, {{2, 4}, {-3, 0}});
  const BeamSearchDecodeOutput top = MergeBeamSearchOutputs(3, {a, b});
  EXPECT_EQ(Row(top.topk_scores.to(at::kLong)), (std::vector<int64_t>{5, 4, 3, -1, -2, -3}));
  EXPECT_EQ(Row(top.topk_lens), (std::vector<int64_t>{2, 2, 3, 3, 3, 3}));
  EXPECT_EQ(Row(top.topk_ids), (std::vector<int64_t>{50, 51, 52, 40, 41, 42, 30, 31, 32,  //
                                                     10, 11, 12, 20, 21, 22, 30, 31, 33}));
  const IntMatrix names = {{5, 4, 3}, {-1, -2, -3}};
  ASSERT_EQ(top.topk_hyps.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(top.topk_hyps[i].size(), 3u);
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(top.topk_hyps[i][j].ids, std::vector<int64_t>{names[i][j]}) << i << ", " << j;
    }
  }
  EXPECT_THROW(MergeBeamSearchOutputs(6, {a, b}), InvalidArgumentError);
  EXPECT_THROW(MergeBeamSearchOutputs(3, {}), InvalidArgumentError);
}

TEST(BeamSearchOutputs, UnpackHypTruncatesAndPads) {
  Hypothesis h;
  h.beam_id = 0;
  h.ids = {4, 5, 2};
  h.normalized_score = -1.5;
  const SearchResult r = UnpackHyp({{h, Hypothesis{}}}, 2);
  EXPECT_EQ(Row(r.topk_ids), (std::vector<int64_t>{4, 5, 0, 0}));
  EXPECT_EQ(Row(r.topk_lens), (std::vector<int64_t>{2, 0}));
  EXPECT_DOUBLE_EQ(r.topk_scores[0][0].item<double>(), -1.5);
  EXPECT_EQ(UnpackHyp({{h}}, 0).topk_ids.size(2), 3);
}

}  // namespace
}  // namespace glossa
