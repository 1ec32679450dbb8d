// BeamSearchHelper and SampleSearch: the PyTorch reference of Lingvo's search
// (tests/reference/beam_search_reference.py) on random Markov models, beam width 1 against
// greedy, an exhaustively enumerable model, hand-worked length-normalization and </s> cases, and
// Lingvo's BeamSearchHelper tests with deterministic inputs (beam_search_helper_test.py:
// force_eos_in_top_k, force_last_chunk_eoc_in_top_k). Lingvo's op-level tests are in
// beam_search_step_test.cc, its output helpers' in beam_search_outputs_test.cc.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/search/beam_search.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

using json = nlohmann::json;

// A Markov "model": log-probs [B, T, V(prev), V]; row r of the B' sources still running reads
// source per_source.source[r % B'] (one entry per source: a search that drops finished sources
// compacts them). The states
// carry each hypothesis' history, which the search reorders (tests/tasks/mt/mt_test.cc checks the
// reordering on a real decoder's caches). `rows` records how many rows each step ran on.
struct MarkovModel {
  at::Tensor logp;  // [B, T, V, V] float32
  std::shared_ptr<std::vector<int64_t>> rows = std::make_shared<std::vector<int64_t>>();
  int64_t num_beams() const { return logp.size(0); }
  DecodeStepFn Step() const {
    return [this](const at::Tensor& ids, int64_t t, const NestedMap& states) {
      const int64_t n = ids.size(0);
      rows->push_back(n);
      // Each hypothesis' history (reordered by the search with its states) has one entry per step.
      EXPECT_EQ(states.GetTensor("history").size(1), t);
      EXPECT_EQ(states.GetTensor("history").size(0), n);
      const at::Tensor sources = states.GetTensor("per_source.source");  // [B']
      EXPECT_EQ(n % sources.size(0), 0);
      const at::Tensor src = sources.repeat({n / sources.size(0)});
      at::Tensor lp = logp.index({src, at::full({n}, t, at::kLong), ids});
      NestedMap next;
      next.Put("prev", ids.clone());
      next.Put("history", at::cat({states.GetTensor("history"), ids.unsqueeze(1)}, 1));
      next.Put("per_source", states.GetItem("per_source"));
      return std::make_pair(lp, next);
    };
  }
  NestedMap Init(int64_t n) const {
    NestedMap s;
    s.Put("prev", at::zeros({n}, at::kLong));
    s.Put("history", at::zeros({n, 0}, at::kLong));
    NestedMap per_source;
    per_source.Put("source", at::arange(std::min(n, num_beams()), at::kLong));
    s.Put("per_source", per_source);
    return s;
  }
};

std::unique_ptr<BeamSearchHelper> MakeBeam(const std::function<void(Params&)>& set) {
  Params p = BeamSearchHelper::Params();
  p.Set("name", "beam");
  set(p);
  return InstantiateLayer<BeamSearchHelper>(p);
}

std::vector<int64_t> HypIds(const SearchResult& r, int64_t b, int64_t k) {
  const int64_t len = r.topk_lens[b][k].item<int64_t>();
  std::vector<int64_t> out;
  for (int64_t t = 0; t < len; ++t) out.push_back(r.topk_ids[b][k][t].item<int64_t>());
  return out;
}

TEST(BeamSearch, MatchesThePyTorchReference) {
  const json ref = json::parse(testing::ReadSourceFile("tests/reference/beam_search_reference.json"));
  ASSERT_GE(ref["cases"].size(), 15u);
  for (const json& c : ref["cases"]) {
    const std::string name = c["name"];
    const int64_t b = c["num_beams"], t = c["target_seq_len"], v = c["vocab"];
    std::vector<double> flat = c["log_probs"];
    MarkovModel model{at::tensor(flat, at::kDouble).view({b, t, v, v}).to(at::kFloat)};
    auto beam = MakeBeam([&](Params& p) {
      p.Set("num_hyps_per_beam", c["num_hyps_per_beam"].get<int64_t>());
      p.Set("target_seq_len", t);
      p.Set("length_normalization", c["length_normalization"].get<double>());
      p.Set("valid_eos_max_logit_delta", c["valid_eos_max_logit_delta"].get<double>());
      p.Set("local_eos_threshold", c["local_eos_threshold"].get<double>());
      p.Set("beam_size", c["beam_size"].get<double>());
      p.Set("force_eos_in_last_step", c["force_eos_in_last_step"].get<bool>());
      p.Set("ensure_full_beam", c["ensure_full_beam"].get<bool>());
      // Lingvo's newer options (cases 7 on).
      p.Set("force_eos_in_top_k", c.value("force_eos_in_top_k", false));
      p.Set("force_last_chunk_eoc_in_top_k", c.value("force_last_chunk_eoc_in_top_k", false));
      p.Set("terminate_beams_independently", c.value("terminate_beams_independently", false));
      p.Set("target_eoc_id", c.value("target_eoc_id", int64_t{-1}));
      p.Set("merge_paths", c.value("merge_paths", false));
      p.Set("merged_topk_buffer_size_factor",
            c.value("merged_topk_buffer_size_factor", int64_t{2}));
      p.Set("allow_empty_terminated_hyp", c.value("allow_empty_terminated_hyp", true));
    });
    const int64_t k = beam->num_hyps_per_beam();
    // Every hypothesis is at its last chunk from step last_chunk_from on (-1: never).
    const int64_t last_chunk_from = c.value("last_chunk_from", int64_t{-1});
    DecodeStepFn step = [&](const at::Tensor& ids, int64_t s, const NestedMap& states) {
      auto [lp, next] = model.Step()(ids, s, states);
      next.Put("is_last_chunk",
               at::full({ids.size(0)}, last_chunk_from >= 0 && s >= last_chunk_from, at::kBool));
      return std::make_pair(lp, next);
    };
    SearchResult r = beam->Search(b, model.Init(k * b), step);
    ASSERT_EQ(r.topk_ids.size(0), b) << name;
    ASSERT_EQ(r.topk_ids.size(1), k) << name;
    for (int64_t i = 0; i < b; ++i) {
      const json& want = c["expected"][i];
      for (int64_t j = 0; j < k; ++j) {
        if (j >= static_cast<int64_t>(want.size())) {
          EXPECT_EQ(r.topk_lens[i][j].item<int64_t>(), 0) << name << " source " << i << " hyp " << j;
          continue;
        }
        EXPECT_EQ(HypIds(r, i, j), want[j]["ids"].get<std::vector<int64_t>>())
            << name << " source " << i << " hyp " << j;
        EXPECT_NEAR(r.topk_scores[i][j].item<double>(), want[j]["score"].get<double>(), 1e-9)
            << name << " source " << i << " hyp " << j;
      }
    }
  }
}

// A random Markov model whose </s> gets likelier with the step, so that greedy decoding ends.
MarkovModel RandomModel(int64_t b, int64_t t, int64_t v, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor logits = at::randn({b, t, v, v}, at::kDouble) * 2;
  for (int64_t s = 0; s < t; ++s) logits.select(1, s).select(-1, 2) += 0.6 * s;
  return MarkovModel{at::log_softmax(logits, -1).to(at::kFloat)};
}

TEST(BeamSearch, WidthOneIsGreedy) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const int64_t b = 3, t = 12, v = 9;
    MarkovModel model = RandomModel(b, t, v, seed);
    // Beam width 1; </s> ends a hypothesis only when it is the best extension, the search stops
    // at the first finished hypothesis, and the last step forces </s>, as greedy stops at t_max.
    auto beam = MakeBeam([&](Params& p) {
      p.Set("num_hyps_per_beam", 1).Set("target_seq_len", t).Set("beam_size", 0.0);
      p.Set("valid_eos_max_logit_delta", 1e-7).Set("force_eos_in_last_step", true);
    });
    SearchResult r = beam->Search(b, model.Init(b), model.Step());
    SearchResult g = SampleSearch(b, model.Init(b), model.Step(), t, 1, 2, 0.0, 0, 0);
    for (int64_t i = 0; i < b; ++i) {
      std::vector<int64_t> greedy = HypIds(g, i, 0), bh = HypIds(r, i, 0);
      if (greedy.back() != 2) greedy.back() = 2;  // greedy ran out of steps: the beam forced </s>
      EXPECT_EQ(bh, greedy) << "seed " << seed << " source " << i;
    }
  }
}

TEST(BeamSearch, FindsTheBestSequenceOfAnExhaustivelyEnumerableModel) {
  // V = 4 (0, <s> 1, </s> 2, 3), 4 steps: with 27 hypotheses per beam every prefix stays live,
  // so the beam's best must be the true best over all sequences ending in </s>.
  const int64_t t = 4, v = 4;
  const double alpha = 0.6;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    MarkovModel model = RandomModel(1, t, v, 100 + seed);
    auto beam = MakeBeam([&](Params& p) {
      p.Set("num_hyps_per_beam", 27).Set("target_seq_len", t).Set("beam_size", 1e9);
      p.Set("valid_eos_max_logit_delta", 1e9).Set("local_eos_threshold", -1e9);
      p.Set("length_normalization", alpha);
    });
    SearchResult r = beam->Search(1, model.Init(27), model.Step());
    // Enumerate: sequences of non-</s> tokens then </s>, up to t tokens.
    auto lp = model.logp.to(at::kDouble);
    double best = -INFINITY;
    std::vector<int64_t> best_seq;
    std::function<void(std::vector<int64_t>&, double)> walk = [&](std::vector<int64_t>& seq,
                                                                  double raw) {
      const int64_t step = static_cast<int64_t>(seq.size());
      const int64_t prev = seq.empty() ? 1 : seq.back();
      const double eos = raw + lp[0][step][prev][2].item<double>();
      const double score = eos / std::pow((step + 1 + 5.0) / 5.0, alpha);
      if (score > best) {
        best = score;
        best_seq = seq;
        best_seq.push_back(2);
      }
      if (step + 1 == t) return;
      for (int64_t w : {0, 1, 3}) {
        seq.push_back(w);
        walk(seq, raw + lp[0][step][prev][w].item<double>());
        seq.pop_back();
      }
    };
    std::vector<int64_t> seq;
    walk(seq, 0.0);
    EXPECT_EQ(HypIds(r, 0, 0), best_seq) << "seed " << seed;
    EXPECT_NEAR(r.topk_scores[0][0].item<double>(), best, 1e-5) << "seed " << seed;
    // Scores are sorted, best first.
    for (int64_t j = 1; j < 27; ++j) {
      if (r.topk_lens[0][j].item<int64_t>() == 0) break;
      EXPECT_GE(r.topk_scores[0][j - 1].item<double>(), r.topk_scores[0][j].item<double>());
    }
  }
}

// Hand-worked: from <s>, </s> has log-prob -1.5 and token 3 has -0.5 (tokens 0 and 1 share the
// rest); after 3, </s> has -1.5 and token 0 the rest, log(1 - e^-1.5) = -0.2525. So
// B = [</s>] scores -1.5 (length 1) and A = [3, </s>] scores -2.0 (length 2); after 3 the best
// extension is [3, 0] at -0.7525, so A's </s> is 1.2475 below it.
MarkovModel HandModel() {
  const int64_t v = 4, t = 2;
  at::Tensor lp = at::full({1, t, v, v}, -20.0, at::kDouble);
  const double rest0 = std::log((1 - std::exp(-1.5) - std::exp(-0.5)) / 2);
  lp[0][0][1][2] = -1.5;
  lp[0][0][1][3] = -0.5;
  lp[0][0][1][0] = rest0;
  lp[0][0][1][1] = rest0;
  lp[0][1][3][0] = std::log(1 - std::exp(-1.5));
  lp[0][1][3][2] = -1.5;
  return MarkovModel{lp.to(at::kFloat)};
}

SearchResult RunHand(const std::function<void(Params&)>& set) {
  MarkovModel model = HandModel();
  auto beam = MakeBeam([&](Params& p) {
    p.Set("num_hyps_per_beam", 2).Set("target_seq_len", 2).Set("beam_size", 100.0);
    set(p);
  });
  return beam->Search(1, model.Init(2), model.Step());
}

TEST(BeamSearch, LengthNormalizationHandWorked) {
  // α = 1: A -2.0 / (7/5) = -1.428571, B -1.5 / (6/5) = -1.25: B first.
  SearchResult r = RunHand([](Params& p) { p.Set("length_normalization", 1.0); });
  EXPECT_EQ(HypIds(r, 0, 0), (std::vector<int64_t>{2}));
  EXPECT_NEAR(r.topk_scores[0][0].item<double>(), -1.25, 1e-6);
  EXPECT_EQ(HypIds(r, 0, 1), (std::vector<int64_t>{3, 2}));
  EXPECT_NEAR(r.topk_scores[0][1].item<double>(), -2.0 / 1.4, 1e-6);
  // α = 3: A -2.0 / 2.744 = -0.728863, B -1.5 / 1.728 = -0.868056: A first.
  r = RunHand([](Params& p) { p.Set("length_normalization", 3.0); });
  EXPECT_EQ(HypIds(r, 0, 0), (std::vector<int64_t>{3, 2}));
  EXPECT_NEAR(r.topk_scores[0][0].item<double>(), -2.0 / 2.744, 1e-6);
  EXPECT_NEAR(r.topk_scores[0][1].item<double>(), -1.5 / 1.728, 1e-6);
  // α = 0: raw log-probs.
  r = RunHand([](Params& p) { p.Set("length_normalization", 0.0); });
  EXPECT_NEAR(r.topk_scores[0][0].item<double>(), -1.5, 1e-6);
  EXPECT_NEAR(r.topk_scores[0][1].item<double>(), -2.0, 1e-6);
}

TEST(BeamSearch, EosThresholdsHandWorked) {
  // A's </s> is 1.2475 below the best extension of [3]: with a delta of 1.2 A does not end, only
  // B does; with 1.3 it does.
  SearchResult r = RunHand([](Params& p) { p.Set("valid_eos_max_logit_delta", 1.2); });
  EXPECT_EQ(HypIds(r, 0, 0), (std::vector<int64_t>{2}));
  // The runner-up is [0, </s>] (-22.46: every extension of 0 is equally unlikely), not A.
  EXPECT_EQ(HypIds(r, 0, 1), (std::vector<int64_t>{0, 2})) << "A must not end with delta 1.2";
  r = RunHand([](Params& p) { p.Set("valid_eos_max_logit_delta", 1.3); });
  EXPECT_EQ(HypIds(r, 0, 1), (std::vector<int64_t>{3, 2}));
  // local_eos_threshold -1.4: neither </s> (-1.5 each) may end a hypothesis: nothing finishes...
  r = RunHand([](Params& p) { p.Set("local_eos_threshold", -1.4); });
  EXPECT_EQ(r.topk_lens[0][0].item<int64_t>(), 0);
  // ...unless the last step forces </s>: then A and the other step-1 extensions end there.
  r = RunHand([](Params& p) {
    p.Set("local_eos_threshold", -1.4).Set("force_eos_in_last_step", true);
  });
  EXPECT_EQ(HypIds(r, 0, 0), (std::vector<int64_t>{3, 2}));
  EXPECT_NEAR(r.topk_scores[0][0].item<double>(), -2.0, 1e-6);
  // -1.6 lets both through.
  r = RunHand([](Params& p) { p.Set("local_eos_threshold", -1.6); });
  EXPECT_EQ(r.topk_lens[0][0].item<int64_t>() + r.topk_lens[0][1].item<int64_t>(), 3);
}

TEST(BeamSearch, BeamSizeStopsEarlyAndEnsureFullBeamWaits) {
  int64_t steps = 0;
  MarkovModel model = RandomModel(1, 10, 6, 7);
  DecodeStepFn counting = [&](const at::Tensor& ids, int64_t t, const NestedMap& s) {
    steps = t + 1;
    return model.Step()(ids, t, s);
  };
  auto narrow = MakeBeam([](Params& p) {
    p.Set("num_hyps_per_beam", 2).Set("target_seq_len", 10).Set("beam_size", 0.0);
  });
  narrow->Search(1, model.Init(2), counting);
  const int64_t narrow_steps = steps;
  auto wide = MakeBeam([](Params& p) {
    p.Set("num_hyps_per_beam", 2).Set("target_seq_len", 10).Set("beam_size", 1e9);
  });
  wide->Search(1, model.Init(2), counting);
  EXPECT_EQ(steps, 10) << "a window of 1e9 never stops early";
  EXPECT_LT(narrow_steps, 10) << "a window of 0 stops at the first finished hypothesis";
  auto full = MakeBeam([](Params& p) {
    p.Set("num_hyps_per_beam", 2).Set("target_seq_len", 10).Set("beam_size", 0.0);
    p.Set("ensure_full_beam", true);
  });
  SearchResult r = full->Search(1, model.Init(2), counting);
  EXPECT_GE(steps, narrow_steps);
  EXPECT_GT(r.topk_lens[0][1].item<int64_t>(), 0) << "ensure_full_beam: two finished hypotheses";
}

TEST(BeamSearch, CoveragePenaltyUsesAttention) {
  // Two sources positions; attention all on position 0: Σ log clip(cov/1) over j: position 1
  // stays at 0.001, position 0 clips at 0.5.
  MarkovModel model = HandModel();
  DecodeStepFn with_atten = [&](const at::Tensor& ids, int64_t t, const NestedMap& s) {
    auto [lp, next] = model.Step()(ids, t, s);
    at::Tensor a = at::zeros({ids.size(0), 2}, at::kFloat);
    a.select(1, 0).fill_(1.0);
    next.Put("atten_probs", a);
    return std::make_pair(lp, next);
  };
  auto beam = MakeBeam([](Params& p) {
    p.Set("num_hyps_per_beam", 2).Set("target_seq_len", 2).Set("beam_size", 100.0);
    p.Set("coverage_penalty", 0.2);
  });
  SearchResult r = beam->Search(1, model.Init(2), with_atten);
  const double cp = 0.2 * (std::log(0.5) + std::log(0.001));
  EXPECT_NEAR(r.topk_scores[0][0].item<double>(), -1.5 + cp, 1e-6);
  // Over the first source position only (source_lengths): log clip(1, ...) = log 0.5.
  r = beam->Search(1, model.Init(2), with_atten, at::tensor({int64_t{1}}));
  EXPECT_NEAR(r.topk_scores[0][0].item<double>(), -1.5 + 0.2 * std::log(0.5), 1e-6);
  // Without attention the penalty cannot be computed.
  EXPECT_THROW(beam->Search(1, model.Init(2), model.Step()), FailedPreconditionError);
}

TEST(BeamSearch, MergePathsMergesEpsilonEquivalentHypotheses) {
  // eoc = 0: [0, 3] and [3, 0] both read [3]; merged, their probabilities add up.
  const int64_t v = 4;
  at::Tensor lp = at::full({1, 3, v, v}, -30.0, at::kDouble);
  lp[0][0][1][0] = std::log(0.5);
  lp[0][0][1][3] = std::log(0.5);
  lp[0][1][0][3] = std::log(0.5);
  lp[0][1][0][2] = std::log(0.5);
  lp[0][1][3][0] = std::log(0.5);
  lp[0][1][3][2] = std::log(0.5);
  for (int64_t w = 0; w < v; ++w) lp[0][2][w][2] = 0.0;
  MarkovModel model{lp.to(at::kFloat)};
  auto beam = MakeBeam([](Params& p) {
    p.Set("num_hyps_per_beam", 2).Set("target_seq_len", 3).Set("beam_size", 100.0);
    p.Set("merge_paths", true).Set("target_eoc_id", 0);
  });
  SearchResult r = beam->Search(1, model.Init(2), model.Step());
  // [0,3] and [3,0] (each 0.25) merge into one hypothesis of probability 0.5 that ends at step 2.
  bool found = false;
  for (int64_t j = 0; j < 2; ++j) {
    std::vector<int64_t> h = HypIds(r, 0, j);
    if (h.size() == 3 && h[2] == 2 && (h[0] == 3 || h[1] == 3)) {
      found = true;
      EXPECT_NEAR(r.topk_scores[0][j].item<double>(), std::log(0.5), 1e-5);
    }
  }
  EXPECT_TRUE(found);
  EXPECT_THROW(MakeBeam([](Params& p) { p.Set("merge_paths", true).Set("target_seq_len", 3); }),
               InvalidArgumentError);
}

TEST(BeamSearch, BadParamsAndStepOutputsAreErrors) {
  EXPECT_THROW(MakeBeam([](Params& p) { p.Set("target_seq_len", 0); }), InvalidArgumentError);
  EXPECT_THROW(MakeBeam([](Params& p) { p.Set("num_hyps_per_beam", 0).Set("target_seq_len", 3); }),
               InvalidArgumentError);
  auto beam = MakeBeam([](Params& p) { p.Set("num_hyps_per_beam", 2).Set("target_seq_len", 3); });
  DecodeStepFn wrong = [](const at::Tensor& ids, int64_t, const NestedMap& s) {
    return std::make_pair(at::zeros({ids.size(0) + 1, 5}), s);
  };
  EXPECT_ERROR_CONTAINS(beam->Search(1, NestedMap(), wrong), InvalidArgumentError, "log-probs [2, V]");
  DecodeStepFn nan = [](const at::Tensor& ids, int64_t, const NestedMap& s) {
    return std::make_pair(at::full({ids.size(0), 5}, NAN), s);
  };
  EXPECT_ERROR_CONTAINS(beam->Search(1, NestedMap(), nan), InvalidArgumentError, "no finite log-prob");
  DecodeStepFn small = [](const at::Tensor& ids, int64_t, const NestedMap& s) {
    return std::make_pair(at::zeros({ids.size(0), 2}), s);
  };
  EXPECT_ERROR_CONTAINS(beam->Search(1, NestedMap(), small), InvalidArgumentError, "outside the vocabulary");
}

// Lingvo's testBeamSearchForceEosInTopK: every token 0 except </s> at -1, so </s> never makes the
// top num_hyps_per_beam + 1 on its own; forced in, it ends hypotheses if within the delta.
TEST(BeamSearch, ForceEosInTopK) {
  const int64_t vocab = 300, b = 2, k = 3, n = b * k;
  DecodeStepFn step = [&](const at::Tensor&, int64_t, const NestedMap& s) {
    at::Tensor lp = at::zeros({n, vocab});
    lp.select(1, 2).fill_(-1.0);
    return std::make_pair(lp, s);
  };
  for (double delta : {100.0, 0.5}) {
    for (bool force : {true, false}) {
      auto beam = MakeBeam([&](Params& p) {
        p.Set("target_seq_len", 100).Set("num_hyps_per_beam", k).Set("beam_size", 100000.0);
        p.Set("valid_eos_max_logit_delta", delta).Set("force_eos_in_top_k", force);
      });
      const SearchResult r = beam->Search(b, NestedMap(), step);
      const bool ends = force && delta >= 1.0;
      for (int64_t i = 0; i < b; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_EQ(r.topk_lens[i][j].item<int64_t>() > 0, ends)
              << "delta " << delta << " force " << force << " source " << i << " hyp " << j;
        }
      }
    }
  }
}

// Lingvo's testBeamSearchForceLastChunkEocInTopK: every token 0 except the end-of-chunk (0) at -1
// and </s> at eos_score; the step function says whether each hypothesis is at its last chunk.
TEST(BeamSearch, ForceLastChunkEocInTopK) {
  struct Case {
    const char* name;
    bool is_last_chunk, force;
    double eos_score;
    std::vector<int64_t> lens;
    double score;
  };
  const std::vector<Case> cases = {
      // </s> cannot end a hypothesis; the forced end-of-chunk ends one at step 0, then three.
      {"last_chunk_eoc_in_topk", true, true, -10., {1, 2, 2}, -1.},
      {"last_chunk_eoc_not_in_topk1", true, false, -10., {0, 0, 0}, 0.},
      {"last_chunk_eoc_not_in_topk2", false, true, -10., {0, 0, 0}, 0.},
      {"last_chunk_eoc_not_in_topk3", false, false, -10., {0, 0, 0}, 0.},
      {"last_chunk_eoc_not_in_topk_eos_in_top_k", false, false, 1., {1, 2, 2}, 1.},
      // Both end each hypothesis: the lower score (the end-of-chunk's) is kept.
      {"last_chunk_eoc_in_topk_eos_in_top_k", true, true, 1., {1, 2, 2}, -1.}};
  const int64_t vocab = 30, b = 2, k = 3, n = b * k;
  for (const Case& c : cases) {
    DecodeStepFn step = [&](const at::Tensor&, int64_t, const NestedMap& s) {
      at::Tensor lp = at::zeros({n, vocab});
      lp.select(1, 0).fill_(-1.0);
      lp.select(1, 2).fill_(c.eos_score);
      NestedMap next = s;
      next.Put("is_last_chunk", at::full({n}, c.is_last_chunk, at::kBool));
      return std::make_pair(lp, next);
    };
    auto beam = MakeBeam([&](Params& p) {
      p.Set("target_eoc_id", 0).Set("target_seq_len", 10).Set("num_hyps_per_beam", k);
      p.Set("beam_size", 100000.0).Set("force_last_chunk_eoc_in_top_k", c.force);
    });
    const SearchResult r = beam->Search(b, NestedMap(), step);
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(r.topk_lens[i][j].item<int64_t>(), c.lens[j]) << c.name << " " << i << ", " << j;
        EXPECT_NEAR(r.topk_scores[i][j].item<double>(), c.score, 1e-6) << c.name;
      }
    }
  }
}

// A step function that reads its log-probs from a table [step][N, V], whatever the ids.
DecodeStepFn TableStep(const std::vector<std::vector<std::vector<double>>>& table) {
  return [table](const at::Tensor& ids, int64_t t, const NestedMap& s) {
    std::vector<double> flat;
    for (const auto& row : table[t]) flat.insert(flat.end(), row.begin(), row.end());
    at::Tensor lp = at::tensor(flat, at::kDouble).view({ids.size(0), -1}).log().to(at::kFloat);
    return std::make_pair(lp, s);
  };
}

TEST(BeamSearch, DecodeReturnsHypothesesAndPerStepState) {
  // Lingvo's test_three_steps_eos through the whole search.
  auto beam = MakeBeam([](Params& p) { p.Set("num_hyps_per_beam", 2).Set("target_seq_len", 3); });
  const BeamSearchDecodeOutput out =
      beam->BeamSearchDecode(1, NestedMap(),
                             TableStep({{{0.6, 0.4, 1e-7}, {0.6, 0.4, 1e-7}},
                                        {{0.55, 0.45, 1e-7}, {0.05, 0.95, 1e-7}},
                                        {{0.05, 0.05, 0.9}, {0.05, 0.05, 0.9}}}));
  const BeamSearchState& s = out.search_state;
  EXPECT_EQ(s.num_steps, 3);
  EXPECT_NEAR(s.best_scores[0].item<double>(), std::log(0.4 * 0.95 * 0.9), 1e-5);
  EXPECT_NEAR(s.cumulative_scores[0].item<double>(), std::log(0.4 * 0.95 * 0.05), 1e-5);
  EXPECT_NEAR(s.cumulative_scores[1].item<double>(), std::log(0.4 * 0.95 * 0.05), 1e-5);
  EXPECT_FALSE(s.beam_done[0].item<bool>());
  ASSERT_EQ(out.topk_hyps.size(), 1u);
  const Hypothesis& best = out.topk_hyps[0][0];
  EXPECT_EQ(best.ids, (std::vector<int64_t>{1, 1, 2}));
  ASSERT_EQ(best.scores.size(), 3u);
  EXPECT_NEAR(best.scores[0], std::log(0.4), 1e-5);
  EXPECT_NEAR(best.scores[1], std::log(0.95), 1e-5);
  EXPECT_NEAR(best.scores[2], std::log(0.9), 1e-5);
  EXPECT_NEAR(best.normalized_score, std::log(0.4 * 0.95 * 0.9), 1e-5);
  EXPECT_EQ(out.topk_hyps[0][1].ids, (std::vector<int64_t>{0, 0, 2}));
  EXPECT_EQ(HypIds(out, 0, 0), (std::vector<int64_t>{1, 1, 2}));
  EXPECT_NEAR(out.topk_scores[0][1].item<double>(), std::log(0.6 * 0.55 * 0.9), 1e-5);
}

TEST(BeamSearch, TerminateBeamsIndependently) {
  // Lingvo's testBeamSearchOpV2Independence through the search: source 1 is done after step 1.
  const std::vector<std::vector<std::vector<double>>> table = {
      {{0.6, 0.4, 1e-7}, {0.2, 0.8, 1e-7}, {0.6, 0.4, 1e-7}, {0.2, 0.8, 1e-7}},
      {{0.55, 0.45, 1e-7}, {1e-7, 0.3, 0.6}, {0.05, 0.95, 1e-7}, {0.05, 0.9, 0.05}},
      {{1e-7, 1.0, 1e-7}, {1e-7, 1.0, 1e-7}, {1e-7, 1.0, 1e-7}, {1e-7, 1.0, 1e-7}},
      {{0.05, 0.05, 0.9}, {0.05, 0.05, 0.9}, {0.05, 0.05, 0.9}, {0.05, 0.05, 0.9}}};
  for (bool independent : {false, true}) {
    // The table's rows are hypotheses by index: every source stays in the batch.
    auto beam = MakeBeam([&](Params& p) {
      p.Set("num_hyps_per_beam", 2).Set("target_seq_len", 4).Set("beam_size", 0.1);
      p.Set("valid_eos_max_logit_delta", 0.1).Set("terminate_beams_independently", independent);
      p.Set("drop_finished_sources", false);
    });
    const BeamSearchDecodeOutput out = beam->BeamSearchDecode(2, NestedMap(), TableStep(table));
    EXPECT_EQ(HypIds(out, 0, 0), (std::vector<int64_t>{1, 1, 1, 2}));
    EXPECT_EQ(HypIds(out, 1, 0), (std::vector<int64_t>{1, 2}));
    EXPECT_NEAR(out.topk_scores[1][0].item<double>(), std::log(0.8 * 0.6), 1e-5);
    const BeamSearchState& s = out.search_state;
    if (independent) {
      EXPECT_EQ(out.topk_lens[1][1].item<int64_t>(), 0) << "source 1 stopped after step 1";
      for (int64_t t : {2, 3}) {
        for (int64_t i : {1, 3}) {
          EXPECT_EQ(s.prev_hyps[t][i].item<int64_t>(), i) << "a stopped slot stays in place";
          EXPECT_EQ(s.hyps[t][i].item<int64_t>(), 2);
        }
      }
    } else {
      EXPECT_EQ(HypIds(out, 1, 1), (std::vector<int64_t>{1, 1, 1, 2}));
      EXPECT_NEAR(out.topk_scores[1][1].item<double>(), std::log(0.8 * 0.3 * 0.9), 1e-5);
    }
  }
}

// drop_finished_sources: a source that finishes leaves the batch (the step function runs on
// fewer rows from then on, its states compacted), and the search is the same one: the same
// hypotheses, scores and per-step state as with every source kept to the end.
TEST(BeamSearch, FinishedSourcesLeaveTheBatch) {
  int64_t dropped_cases = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    const int64_t b = 5, k = 3, t_max = 9;
    MarkovModel kept = RandomModel(b, t_max, 7, seed), dropped = kept;
    dropped.rows = std::make_shared<std::vector<int64_t>>();
    auto make = [&](bool drop) {
      return MakeBeam([&](Params& p) {
        p.Set("num_hyps_per_beam", k).Set("target_seq_len", t_max).Set("beam_size", 1.0);
        p.Set("length_normalization", 0.6).Set("terminate_beams_independently", true);
        p.Set("drop_finished_sources", drop);
      });
    };
    const BeamSearchDecodeOutput a = make(false)->BeamSearchDecode(b, kept.Init(k * b), kept.Step());
    const BeamSearchDecodeOutput d =
        make(true)->BeamSearchDecode(b, dropped.Init(k * b), dropped.Step());
    ASSERT_TRUE(at::equal(a.topk_ids, d.topk_ids)) << "seed " << seed;
    ASSERT_TRUE(at::equal(a.topk_lens, d.topk_lens)) << "seed " << seed;
    ASSERT_TRUE(at::equal(a.topk_scores, d.topk_scores)) << "seed " << seed;
    const BeamSearchState &sa = a.search_state, &sd = d.search_state;
    EXPECT_EQ(sa.num_steps, sd.num_steps);
    EXPECT_TRUE(at::equal(sa.hyps, sd.hyps) && at::equal(sa.prev_hyps, sd.prev_hyps) &&
                at::equal(sa.scores, sd.scores) && at::equal(sa.beam_done, sd.beam_done))
        << "seed " << seed;
    // Kept: every step ran on all K·B rows. Dropped: the finished sources leave once a quarter
    // of those in the batch have finished (K rows fewer for each).
    for (int64_t n : *kept.rows) EXPECT_EQ(n, k * b);
    ASSERT_EQ(dropped.rows->size(), kept.rows->size());
    int64_t left = 0;
    for (size_t t = 1; t < dropped.rows->size(); ++t) {
      int64_t done_before = 0;
      for (int64_t i = 0; i < b; ++i) {
        // A source is done after step t - 1 if it has no live slot at step t (prev_hyps[t] = i).
        bool stayed = true;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t h = j * b + i;
          stayed = stayed && sd.prev_hyps[t][h].item<int64_t>() == h &&
                   sd.hyps[t][h].item<int64_t>() == 2 && sd.scores[t][h].item<double>() == 0;
        }
        done_before += stayed ? 1 : 0;
      }
      if (4 * (done_before - left) >= b - left) left = done_before;
      EXPECT_EQ((*dropped.rows)[t], k * (b - left)) << "seed " << seed << " step " << t;
      if ((*dropped.rows)[t] < k * b) ++dropped_cases;
    }
  }
  EXPECT_GT(dropped_cases, 5) << "the random models should finish some sources early";
}

// A step that returns fewer rows than the running sources have is refused.
TEST(BeamSearch, StepRowsOtherThanTheLiveSourcesAreAnError) {
  MarkovModel model = RandomModel(2, 4, 5, 3);
  auto beam = MakeBeam([](Params& p) {
    p.Set("num_hyps_per_beam", 2).Set("target_seq_len", 4).Set("terminate_beams_independently", true);
  });
  DecodeStepFn short_rows = [&](const at::Tensor& ids, int64_t t, const NestedMap& s) {
    auto [lp, next] = model.Step()(ids, t, s);
    return std::make_pair(lp.narrow(0, 0, 2), next);
  };
  try {
    beam->Search(2, model.Init(4), short_rows);
    FAIL() << "expected an error";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("expected log-probs [4, V]"), std::string::npos) << e.what();
  }
}

TEST(BeamSearch, LingvoParamsDefaultsAndConflicts) {
  const Params p = BeamSearchHelper::Params();
  EXPECT_FALSE(p.GetBool("terminate_beams_independently"));
  EXPECT_FALSE(p.GetBool("force_eos_in_top_k"));
  EXPECT_FALSE(p.GetBool("force_last_chunk_eoc_in_top_k"));
  EXPECT_EQ(p.GetInt("merged_topk_buffer_size_factor"), 2);
  EXPECT_TRUE(p.GetBool("atten_vecs_in_hypothesis_protos"));
  EXPECT_TRUE(p.GetBool("allow_empty_terminated_hyp"));
  EXPECT_EQ(p.GetInt("target_eoc_id"), -1);
  EXPECT_ERROR_CONTAINS(MakeBeam([](Params& q) {
                          q.Set("target_seq_len", 3).Set("force_eos_in_top_k", true);
                          q.Set("force_last_chunk_eoc_in_top_k", true);
                        }),
                        InvalidArgumentError, "cannot both be set");
  EXPECT_THROW(MakeBeam([](Params& q) {
                 q.Set("target_seq_len", 3).Set("merged_topk_buffer_size_factor", 1);
               }),
               InvalidArgumentError);
  EXPECT_THROW(MakeBeam([](Params& q) {
                 q.Set("target_seq_len", 3).Set("coverage_penalty", 0.2);
                 q.Set("atten_vecs_in_hypothesis_protos", false);
               }),
               InvalidArgumentError);
}

TEST(SampleSearch, IsDeterministicGivenTheSeedAndRespectsTopK) {
  MarkovModel model = RandomModel(4, 10, 8, 3);
  SearchResult a = SampleSearch(4, model.Init(4), model.Step(), 10, 1, 2, 1.0, 0, 42);
  SearchResult b = SampleSearch(4, model.Init(4), model.Step(), 10, 1, 2, 1.0, 0, 42);
  EXPECT_TRUE(at::equal(a.topk_ids, b.topk_ids));
  // top_k 1 is greedy whatever the temperature.
  SearchResult one = SampleSearch(4, model.Init(4), model.Step(), 10, 1, 2, 5.0, 1, 9);
  SearchResult greedy = SampleSearch(4, model.Init(4), model.Step(), 10, 1, 2, 0.0, 0, 0);
  EXPECT_TRUE(at::equal(one.topk_ids, greedy.topk_ids));
  // Scores are the sums of the chosen tokens' log-probs up to the length.
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<int64_t> h = HypIds(greedy, i, 0);
    double sum = 0;
    int64_t prev = 1;
    for (size_t t = 0; t < h.size(); ++t) {
      sum += model.logp[i][static_cast<int64_t>(t)][prev][h[t]].item<double>();
      prev = h[t];
    }
    EXPECT_NEAR(greedy.topk_scores[i][0].item<double>(), sum, 1e-5);
  }
  EXPECT_THROW(SampleSearch(1, model.Init(1), model.Step(), 0, 1, 2, 1.0, 0, 0),
               InvalidArgumentError);
}

}  // namespace
}  // namespace glossa
