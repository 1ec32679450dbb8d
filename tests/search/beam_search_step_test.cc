// Lingvo's tests of its beam search step op (lingvo/core/ops/beam_search_step_op_test.py) and of
// its TopK buffer (beam_search_step_op_top_k_test.cc), ported: the same inputs and expected
// numbers, run through BeamSearchHelper::InitState / Step and HypTopK. Lingvo's test helper
// defaults are kept: </s> = 2, the end-of-chunk 0 under merge_paths (is_last_chunk all true unless
// a test says otherwise), valid_eos_max_logit_delta 0.1, beam_size 3, beam independence on.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/search/beam_search.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

using Matrix = std::vector<std::vector<double>>;
constexpr double kSmall = 1e-7;
constexpr double kMinScore = -1e36;

// Lingvo's _runBeamSearchOpHelper arguments.
struct OpCase {
  int64_t hyp_size = 2, num_beams = 1, seq_len = 3;
  double beam_size = 3.0;
  bool ensure_full_beam = false;
  bool force_eos_in_last_step = false;
  double local_eos_threshold = -100.0;
  bool independence = true;
  bool merge_paths = false;
  int64_t merged_topk_buffer_size_factor = 2;
  std::vector<std::vector<bool>> is_last_chunk;  // [step][hyp]; empty: merge_paths
  double valid_eos_max_logit_delta = 0.1;
};

Matrix Log(const Matrix& probs) {
  Matrix out = probs;
  for (auto& row : out) {
    for (double& v : row) v = std::log(v);
  }
  return out;
}

at::Tensor ToTensor(const Matrix& m) {
  std::vector<double> flat;
  for (const auto& row : m) flat.insert(flat.end(), row.begin(), row.end());
  return at::tensor(flat, at::kDouble)
      .view({static_cast<int64_t>(m.size()), static_cast<int64_t>(m[0].size())})
      .to(at::kFloat);
}

std::unique_ptr<BeamSearchHelper> MakeOpHelper(const OpCase& c) {
  Params p = BeamSearchHelper::Params();
  p.Set("name", "beam").Set("num_hyps_per_beam", c.hyp_size / c.num_beams);
  p.Set("target_seq_len", c.seq_len).Set("target_eos_id", 2);
  p.Set("target_eoc_id", c.merge_paths ? 0 : -1).Set("merge_paths", c.merge_paths);
  p.Set("merged_topk_buffer_size_factor", c.merged_topk_buffer_size_factor);
  p.Set("beam_size", c.beam_size).Set("ensure_full_beam", c.ensure_full_beam);
  p.Set("force_eos_in_last_step", c.force_eos_in_last_step);
  p.Set("local_eos_threshold", c.local_eos_threshold);
  p.Set("valid_eos_max_logit_delta", c.valid_eos_max_logit_delta);
  p.Set("terminate_beams_independently", c.independence);
  return InstantiateLayer<BeamSearchHelper>(p);
}

// Runs one Step per entry of `log_probs` ([N, V] each) on a fresh state of seq_len steps.
BeamSearchState RunOp(const OpCase& c, const std::vector<Matrix>& log_probs) {
  auto beam = MakeOpHelper(c);
  BeamSearchState state = beam->InitState(c.num_beams, c.seq_len);
  for (size_t t = 0; t < log_probs.size(); ++t) {
    at::Tensor last_chunk = at::full({c.hyp_size}, c.merge_paths, at::kBool);
    if (!c.is_last_chunk.empty()) {
      for (int64_t i = 0; i < c.hyp_size; ++i)
        last_chunk[i] = static_cast<bool>(c.is_last_chunk[t][i]);
    }
    beam->Step(static_cast<int64_t>(t), ToTensor(log_probs[t]), {}, last_chunk, &state);
  }
  return state;
}

void ExpectNear(const at::Tensor& got, const Matrix& want, double tol, const std::string& what) {
  const at::Tensor g = got.to(at::kDouble).reshape({static_cast<int64_t>(want.size()), -1});
  for (size_t i = 0; i < want.size(); ++i) {
    for (size_t j = 0; j < want[i].size(); ++j) {
      EXPECT_NEAR(g[i][j].item<double>(), want[i][j], tol) << what << "[" << i << "][" << j << "]";
    }
  }
}

void ExpectEq(const at::Tensor& got, const std::vector<std::vector<int64_t>>& want,
              const std::string& what) {
  const at::Tensor g = got.to(at::kLong);
  for (size_t i = 0; i < want.size(); ++i) {
    for (size_t j = 0; j < want[i].size(); ++j) {
      EXPECT_EQ(g[i][j].item<int64_t>(), want[i][j]) << what << "[" << i << "][" << j << "]";
    }
  }
}

std::vector<bool> BeamDone(const BeamSearchState& s) {
  std::vector<bool> out;
  for (int64_t b = 0; b < s.beam_done.size(0); ++b) out.push_back(s.beam_done[b].item<bool>());
  return out;
}

void ExpectHyp(const Hypothesis& h, int64_t beam_id, const std::vector<int64_t>& ids,
               const std::vector<double>& scores, const std::string& what) {
  ASSERT_FALSE(h.empty()) << what;
  EXPECT_EQ(h.beam_id, beam_id) << what;
  EXPECT_EQ(h.ids, ids) << what;
  ASSERT_EQ(h.scores.size(), scores.size()) << what;
  for (size_t i = 0; i < scores.size(); ++i) EXPECT_NEAR(h.scores[i], scores[i], 1e-5) << what;
  // Lingvo's protos carry one (here empty) attention vector per step.
  EXPECT_EQ(h.atten_vecs.size(), ids.size()) << what;
}

// Lingvo's _testBeamSearchOpHelper checks, on a search that is not done.
struct Expected {
  std::vector<double> best_scores, cum_scores;
  Matrix scores;
  std::vector<std::vector<int64_t>> hyps, prev_hyps;
};

void ExpectState(const BeamSearchState& s, const Expected& e) {
  ExpectNear(s.best_scores, {e.best_scores}, 1e-5, "best_scores");
  ExpectNear(s.cumulative_scores, {e.cum_scores}, 1e-5, "cumulative_scores");
  ExpectNear(s.scores, e.scores, 1e-5, "scores");
  ExpectEq(s.hyps, e.hyps, "hyps");
  ExpectEq(s.prev_hyps, e.prev_hyps, "prev_hyps");
  EXPECT_FALSE(s.all_done);
  for (bool d : BeamDone(s)) EXPECT_FALSE(d);
}

// The decoding tree of Lingvo's small-vocabulary tests: greedy would pick 0 then 0 (0.33), the
// beam finds 1 then 1 (0.38).
const Matrix kStep0 = Log({{0.6, 0.4, kSmall}, {0.6, 0.4, kSmall}});
const Matrix kStep1 = Log({{0.55, 0.45, kSmall}, {0.05, 0.95, kSmall}});

TEST(BeamSearchStep, TwoStepsSmallVocab3) {
  const BeamSearchState s = RunOp({}, {kStep0, kStep1});
  ExpectState(s,
              {.best_scores = {kMinScore},
               .cum_scores = {std::log(0.4 * 0.95), std::log(0.6 * 0.55)},
               .scores = {{std::log(0.6), std::log(0.4)}, {std::log(0.95), std::log(0.55)}, {0, 0}},
               .hyps = {{0, 1}, {1, 0}, {0, 0}},
               .prev_hyps = {{0, 0}, {1, 0}, {0, 0}}});
  for (const auto& row : s.done_hyps) {
    for (const Hypothesis& h : row) EXPECT_TRUE(h.empty());
  }
}

TEST(BeamSearchStep, ThreeStepsEos) {
  const BeamSearchState s =
      RunOp({}, {kStep0, kStep1, Log({{0.05, 0.05, 0.9}, {0.05, 0.05, 0.9}})});
  ExpectState(s, {.best_scores = {std::log(0.4 * 0.95 * 0.9)},
                  .cum_scores = {std::log(0.4 * 0.95 * 0.05), std::log(0.4 * 0.95 * 0.05)},
                  .scores = {{std::log(0.6), std::log(0.4)},
                             {std::log(0.95), std::log(0.55)},
                             {std::log(0.05), std::log(0.05)}},
                  .hyps = {{0, 1}, {1, 0}, {0, 1}},
                  .prev_hyps = {{0, 0}, {1, 0}, {0, 0}}});
  ExpectHyp(s.done_hyps[2][0], 0, {1, 1, 2}, {-0.916290700436, -0.0512933060527, -0.105360545218},
            "done_hyps[2][0]");
  ExpectHyp(s.done_hyps[2][1], 0, {0, 0, 2}, {-0.510825574398, -0.597836971283, -0.105360545218},
            "done_hyps[2][1]");
}

TEST(BeamSearchStep, ThreeStepsForceEos) {
  // </s> stays unlikely at the last step: only forcing it ends the hypotheses.
  const std::vector<Matrix> probs = {kStep0, kStep1, Log({{0.45, 0.44, 0.01}, {0.5, 0.5, 0.01}})};
  Expected e{.best_scores = {kMinScore},
             .cum_scores = {std::log(0.4 * 0.95 * 0.45), std::log(0.4 * 0.95 * 0.44)},
             .scores = {{std::log(0.6), std::log(0.4)},
                        {std::log(0.95), std::log(0.55)},
                        {std::log(0.45), std::log(0.44)}},
             .hyps = {{0, 1}, {1, 0}, {0, 1}},
             .prev_hyps = {{0, 0}, {1, 0}, {0, 0}}};
  BeamSearchState s = RunOp({}, probs);
  ExpectState(s, e);
  for (const auto& row : s.done_hyps) {
    for (const Hypothesis& h : row) EXPECT_TRUE(h.empty());
  }
  s = RunOp({.force_eos_in_last_step = true}, probs);
  e.best_scores = {std::log(0.4 * 0.95 * 0.01)};
  ExpectState(s, e);
  ExpectHyp(s.done_hyps[2][0], 0, {1, 1, 2}, {-0.916290700436, -0.0512933060527, -4.605170185988},
            "done_hyps[2][0]");
  ExpectHyp(s.done_hyps[2][1], 0, {0, 0, 2}, {-0.510825574398, -0.597836971283, -4.605170185988},
            "done_hyps[2][1]");
}

TEST(BeamSearchStep, V2SmokeTest) {
  EXPECT_EQ(BeamDone(RunOp({}, {kStep0})), std::vector<bool>{false});
}

// Issue 24: Lingvo raises InternalError ("No entries in TopK ... producing NaNs"); Glossa raises
// InvalidArgumentError, its error for bad input from the caller's model (beam_search.h,
// docs/mt.md).
TEST(BeamSearchStep, NanLogProbsAreInvalidArgumentNotInternal) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Matrix> probs = {{{nan, nan, nan}, {nan, nan, nan}}};
  EXPECT_ERROR_CONTAINS(RunOp({}, probs), InvalidArgumentError, "no finite log-prob");
  EXPECT_ERROR_CONTAINS(RunOp({}, probs), InvalidArgumentError, "producing NaNs");
  try {
    RunOp({}, probs);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.code(), StatusCode::kInternal);
  }
}

// Four steps: the third only extends with 1, so both hypotheses end at the fourth.
const std::vector<Matrix> kFourSteps = {kStep0, kStep1,
                                        Log({{kSmall, 1.0, kSmall}, {kSmall, 1.0, kSmall}}),
                                        Log({{0.05, 0.05, 0.9}, {0.05, 0.05, 0.9}})};

TEST(BeamSearchStep, V2ThreeSteps) {
  for (bool independence : {false, true}) {
    const BeamSearchState s = RunOp({.seq_len = 4, .independence = independence}, kFourSteps);
    ExpectHyp(s.done_hyps[3][0], 0, {1, 1, 1, 2}, {-0.91629070, -0.05129331, 0., -0.10536052},
              "done_hyps[3][0]");
    ExpectHyp(s.done_hyps[3][1], 0, {0, 0, 1, 2}, {-0.51082557, -0.59783697, 0., -0.10536052},
              "done_hyps[3][1]");
  }
}

// Two sources: source 0 as in V2ThreeSteps; source 1 ends [1, 2] at step 1, which with a beam_size
// of 0.1 makes it done; independent, it is not extended after that.
const std::vector<Matrix> kIndependence = {
    Log({{0.6, 0.4, kSmall}, {0.2, 0.8, kSmall}, {0.6, 0.4, kSmall}, {0.2, 0.8, kSmall}}),
    Log({{0.55, 0.45, kSmall}, {kSmall, 0.3, 0.6}, {0.05, 0.95, kSmall}, {0.05, 0.9, 0.05}}),
    Log({{kSmall, 1.0, kSmall},
         {kSmall, 1.0, kSmall},
         {kSmall, 1.0, kSmall},
         {kSmall, 1.0, kSmall}}),
    Log({{0.05, 0.05, 0.9}, {0.05, 0.05, 0.9}, {0.05, 0.05, 0.9}, {0.05, 0.05, 0.9}})};

TEST(BeamSearchStep, V2Independence) {
  for (bool independence : {false, true}) {
    const BeamSearchState s = RunOp({.hyp_size = 4,
                                     .num_beams = 2,
                                     .seq_len = 4,
                                     .beam_size = 0.1,
                                     .independence = independence},
                                    kIndependence);
    ExpectHyp(s.done_hyps[1][1], 1, {1, 2}, {-0.223144, -0.510826}, "done_hyps[1][1]");
    if (!independence) {
      ExpectHyp(s.done_hyps[3][1], 1, {1, 1, 1, 2}, {-0.22314355, -1.20397282, 0., -0.10536052},
                "done_hyps[3][1]");
      ExpectHyp(s.done_hyps[3][3], 1, {0, 1, 1, 2}, {-1.609438, -0.105361, 0., -0.105361},
                "done_hyps[3][3]");
    } else {
      for (int64_t t : {2, 3}) {
        for (int64_t i : {1, 3}) EXPECT_TRUE(s.done_hyps[t][i].empty()) << t << ", " << i;
      }
    }
    ExpectHyp(s.done_hyps[3][0], 0, {1, 1, 1, 2}, {-0.91629070, -0.05129331, 0., -0.10536052},
              "done_hyps[3][0]");
    ExpectHyp(s.done_hyps[3][2], 0, {0, 0, 1, 2}, {-0.51082557, -0.59783697, 0., -0.10536052},
              "done_hyps[3][2]");
    EXPECT_EQ(BeamDone(s), (std::vector<bool>{true, true}));
  }
  // Source 1 is done after two steps (which has no effect without independence).
  for (size_t steps = 1; steps <= 3; ++steps) {
    const std::vector<Matrix> first(kIndependence.begin(), kIndependence.begin() + steps);
    const BeamSearchState s = RunOp(
        {.hyp_size = 4, .num_beams = 2, .seq_len = 4, .beam_size = 0.1, .independence = false},
        first);
    EXPECT_EQ(BeamDone(s), (std::vector<bool>{false, steps >= 2})) << steps << " steps";
  }
}

// Lingvo's _testBeamSearchStoppingHelper: one step in which only the first hypothesis ends.
bool StoppingAllDone(double beam_size, bool ensure_full_beam, double local_eos_threshold = -100) {
  const BeamSearchState s = RunOp({.beam_size = beam_size,
                                   .ensure_full_beam = ensure_full_beam,
                                   .local_eos_threshold = local_eos_threshold},
                                  {Log({{0.05, 0.05, 0.9}, {0.05, 0.9, 0.05}})});
  EXPECT_EQ(BeamDone(s), std::vector<bool>{s.all_done});
  return s.all_done;
}

TEST(BeamSearchStep, BeamSizeLarge) {
  // A live hypothesis is within 3.0 of the terminated one.
  EXPECT_FALSE(StoppingAllDone(3.0, false));
}

TEST(BeamSearchStep, BeamSizeSmall) { EXPECT_TRUE(StoppingAllDone(0.1, false)); }

TEST(BeamSearchStep, EnsureFullBeam) {
  // Two terminated hypotheses are needed, whatever the beam size.
  EXPECT_FALSE(StoppingAllDone(0.1, true));
}

TEST(BeamSearchStep, SmallEosThreshold) { EXPECT_TRUE(StoppingAllDone(0.1, false, -100.0)); }

TEST(BeamSearchStep, LargeEosThreshold) {
  // </s> (log 0.9) is below -0.05: nothing terminates.
  EXPECT_FALSE(StoppingAllDone(0.1, false, -0.05));
}

TEST(BeamSearchStep, EnsureFullBeamMoreStrict) {
  const std::vector<Matrix> probs = {Log({{0.1, 0.1, 0.8}, {0.1, 0.1, 0.8}}),
                                     Log({{0.1, 0.1, 0.8}, {0.9, 0.05, 0.05}})};
  for (bool ensure_full_beam : {false, true}) {
    OpCase c{.seq_len = 4, .ensure_full_beam = ensure_full_beam};
    // Two terminated hypotheses after two steps; a beam_size of 3 keeps the search going.
    c.beam_size = 3.0;
    c.local_eos_threshold = -1.0;
    BeamSearchState s = RunOp(c, probs);
    EXPECT_EQ(BeamDone(s), std::vector<bool>{s.all_done});
    EXPECT_FALSE(s.all_done);
    c.beam_size = 0.1;
    EXPECT_TRUE(RunOp(c, probs).all_done);
    // Three terminated hypotheses: still not done with a beam_size of 3.
    c.beam_size = 3.0;
    c.local_eos_threshold = -100.0;
    EXPECT_FALSE(RunOp(c, probs).all_done);
  }
}

TEST(BeamSearchStep, EnsureFullBeamTwoBeams) {
  // Source 0 has one terminated hypothesis, source 1 three: only source 1 may be done.
  const std::vector<Matrix> probs = {
      Log({{0.1, 0.1, 0.8}, {0.1, 0.1, 0.8}, {0.1, 0.1, 0.8}, {0.1, 0.1, 0.8}}),
      Log({{0.1, 0.1, 0.1}, {0.1, 0.1, 0.8}, {0.1, 0.1, 0.1}, {0.1, 0.1, 0.8}})};
  const BeamSearchState s = RunOp({.hyp_size = 4,
                                   .num_beams = 2,
                                   .beam_size = 2.0,
                                   .ensure_full_beam = true,
                                   .local_eos_threshold = -1.0},
                                  probs);
  EXPECT_EQ(BeamDone(s), (std::vector<bool>{false, true}));
}

TEST(BeamSearchStep, MergePathsTerminateWithEoc) {
  // is_last_chunk everywhere: [3, 0] and [1, 0] end with the end-of-chunk at step 1; each step
  // score is the average of the hypothesis' score (merge_paths).
  const std::vector<Matrix> probs = {{{-10., -1., -10., 0.}, {-10., -10., -10., -10.}},
                                     {{-0.3, -1.5, -10., -10.}, {-0.5, -2., -10., -10.}}};
  const BeamSearchState s =
      RunOp({.seq_len = 2, .merge_paths = true, .valid_eos_max_logit_delta = 5.0}, probs);
  // Not done: [3, 1] is still within beam_size.
  EXPECT_EQ(BeamDone(s), std::vector<bool>{false});
  ExpectHyp(s.done_hyps[1][0], 0, {3, 0}, {-0.15, -0.15}, "done_hyps[1][0]");
  ExpectHyp(s.done_hyps[1][1], 0, {1, 0}, {-0.75, -0.75}, "done_hyps[1][1]");
}

// Issue 23. Step 1 proposes [3, 3] (-0.1), [3] = [3, eoc] (-0.6) and [3, 1] from the first
// hypothesis, then [] = [eoc, eoc] (-1.5) and [3] = [eoc, 3] (-2.31) from the second. With
// Lingvo's buffer of 2·K = 4 the fourth proposal fills it, it keeps the best two, and [eoc, 3]
// is refused (not better than the second) before it can merge into [3, eoc]: that hypothesis
// keeps -0.6 and ends at step 2 with the end-of-chunk at -0.6 - 2.4 = -3. With a buffer of K + 2
// extensions per slot (or more) every path merges first, as Glossa did before: log(e^-0.6 +
// e^-2.31) - 2.4.
TEST(BeamSearchStep, MergePathsEocVersusEos) {
  const std::vector<Matrix> probs = {
      {{-1., -10., -10., 0.}, {-10., -10., -10., -10.}},
      {{-0.6, -10, -10., -0.1}, {-.5, -10, -10., -1.31}},
      // Very unlikely to continue: for the first hypothesis the end-of-chunk is the likelier
      // terminal, for the second </s>. Both end, and the lower score is kept.
      {{-2.3, -10, -2.6, -9.7}, {-2.4, -10, -2.1, -9.}}};
  OpCase c{.merge_paths = true,
           .is_last_chunk = {{false, false}, {false, false}, {true, true}},
           .valid_eos_max_logit_delta = 5.0};
  BeamSearchState s = RunOp(c, probs);
  EXPECT_EQ(BeamDone(s), std::vector<bool>{true});
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t i = 0; i < 2; ++i) EXPECT_TRUE(s.done_hyps[t][i].empty());
  }
  ExpectHyp(s.done_hyps[2][0], 0, {3, 3, 2}, {-0.9, -0.9, -0.9}, "done_hyps[2][0]");  // -2.7 / 3
  ExpectHyp(s.done_hyps[2][1], 0, {3, 0, 0}, {-1.0, -1.0, -1.0}, "done_hyps[2][1]");  // -3 / 3

  c.merged_topk_buffer_size_factor = 4;  // K + 2
  s = RunOp(c, probs);
  const double merged = (LogSumExp(-0.6, -2.31) - 2.4) / 3;  // -0.94458
  ExpectHyp(s.done_hyps[2][0], 0, {3, 3, 2}, {-0.9, -0.9, -0.9}, "merge all: done_hyps[2][0]");
  ExpectHyp(s.done_hyps[2][1], 0, {3, 0, 0}, {merged, merged, merged},
            "merge all: done_hyps[2][1]");
}

// --- Lingvo's TopK tests (beam_search_step_op_top_k_test.cc) ---

// Lingvo's Populate: three distinct extensions, a fourth that fills the 2·k buffer (it keeps the
// best two), then a duplicate of the best: word 8 after labels {1, 7, 2} (or, with `epsilon`, the
// epsilon after {1, 7, 2, 8}).
void Populate(HypTopK* top_k, bool epsilon) {
  const double lowest = std::numeric_limits<double>::lowest();
  EXPECT_TRUE(top_k->Get().empty());
  EXPECT_EQ(top_k->Add({0, 2, 3, -0.4, -2.0, {1, 2, 3}}), lowest);
  ASSERT_EQ(top_k->Get().size(), 1u);
  EXPECT_EQ(top_k->Get()[0].hyp_id, 2);
  EXPECT_NEAR(top_k->Get()[0].global_score, -2.0, 1e-3);
  EXPECT_EQ(top_k->Add({0, 1, 8, -0.7, -1.3, {1, 7, 2}}), lowest);
  const std::vector<int64_t> third =
      epsilon ? std::vector<int64_t>{1, 3, 4, 9, 5} : std::vector<int64_t>{1, 9, 5};
  EXPECT_EQ(top_k->Add({0, 6, 2, -0.1, -1.7, third}), lowest);  // no shrink before 2·k
  const std::vector<int64_t> fourth =
      epsilon ? std::vector<int64_t>{1, 2, 4, 3} : std::vector<int64_t>{1, 2, 4};
  EXPECT_NEAR(top_k->Add({0, 4, 3, -0.5, -2.5, fourth}), -1.7, 1e-3);  // shrunk to the best two
  const std::vector<Hyp>& hyps = top_k->Get();
  ASSERT_EQ(hyps.size(), 2u);
  EXPECT_EQ(hyps[0].hyp_id, 1);
  EXPECT_NEAR(hyps[0].global_score, -1.3, 1e-3);
  EXPECT_EQ(hyps[1].hyp_id, 6);
  EXPECT_NEAR(hyps[1].global_score, -1.7, 1e-3);
  if (epsilon) {
    top_k->Add({0, 5, /*epsilon*/ 0, -0.7, -1.5, {1, 7, 2, 8}});
  } else {
    top_k->Add({0, 5, 8, -0.7, -1.5, {1, 7, 2}});
  }
}

bool IsDupe(const Hyp& a, const Hyp& b) {
  return a.word_id == b.word_id && a.prev_labels == b.prev_labels;
}

// Lingvo's TestInsertDefault and TestInsertNoDedupe (the default insert and the deduping one with
// a negative epsilon behave the same): the duplicate is kept beside the original.
TEST(BeamSearchTopK, InsertNoDedupe) {
  HypTopK top_k(2, /*epsilon_id=*/-1);
  Populate(&top_k, /*epsilon=*/false);
  const std::vector<Hyp>& hyps = top_k.Get();
  ASSERT_EQ(hyps.size(), 2u);
  EXPECT_EQ(hyps[0].hyp_id, 1);
  EXPECT_EQ(hyps[1].hyp_id, 5);
  EXPECT_TRUE(IsDupe(hyps[0], hyps[1]));
}

TEST(BeamSearchTopK, InsertWithDedupe) {
  HypTopK top_k(2, /*epsilon_id=*/0);
  Populate(&top_k, /*epsilon=*/false);
  const std::vector<Hyp>& hyps = top_k.Get();
  ASSERT_EQ(hyps.size(), 2u);
  EXPECT_EQ(hyps[0].hyp_id, 1);
  EXPECT_NEAR(hyps[0].global_score, -0.70186, 1e-3);  // log(e^-1.5 + e^-1.3)
  EXPECT_EQ(hyps[1].hyp_id, 6);
  EXPECT_NEAR(hyps[1].global_score, -1.7, 1e-3);
  EXPECT_FALSE(IsDupe(hyps[0], hyps[1]));
}

TEST(BeamSearchTopK, InsertWithDedupeEpsilon) {
  // The duplicate ends with the epsilon: its last label is compared with the other's word.
  HypTopK top_k(2, /*epsilon_id=*/0);
  Populate(&top_k, /*epsilon=*/true);
  const std::vector<Hyp>& hyps = top_k.Get();
  ASSERT_EQ(hyps.size(), 2u);
  EXPECT_EQ(hyps[0].hyp_id, 1);
  EXPECT_NEAR(hyps[0].global_score, -0.70186, 1e-3);
  EXPECT_EQ(hyps[1].hyp_id, 6);
  EXPECT_NEAR(hyps[1].global_score, -1.7, 1e-3);
  EXPECT_FALSE(IsDupe(hyps[0], hyps[1]));
}

TEST(BeamSearchTopK, IsDuplicateHypIgnoresEpsilons) {
  const Hyp a{0, 0, 3, 0, 0, {}};   // [3]
  const Hyp b{0, 1, 0, 0, 0, {3}};  // [3, eps]
  const Hyp c{0, 2, 3, 0, 0, {3}};  // [3, 3]
  EXPECT_TRUE(IsDuplicateHyp(a, b, 0));
  EXPECT_TRUE(IsDuplicateHyp(b, a, 0));
  EXPECT_FALSE(IsDuplicateHyp(a, c, 0));
  EXPECT_FALSE(IsDuplicateHyp(a, b, -1));
  EXPECT_THROW(HypTopK(0, -1), InvalidArgumentError);
  EXPECT_THROW(HypTopK(2, -1, 1), InvalidArgumentError);
}

}  // namespace
}  // namespace glossa
