#include "glossa/search/beam_search.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"

namespace glossa {

glossa::Params BeamSearchHelper::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<BeamSearchHelper>());
  p.Define("num_hyps_per_beam", 8,
           "Live hypotheses kept per source, and hypotheses returned per source.");
  p.Define("beam_size", 3.0,
           "Score window of the stopping test: a source is done when every live hypothesis' "
           "log-prob is at most the best finished one's minus beam_size.");
  p.Define("target_seq_len", 0, "Maximum decoding steps (</s> included).");
  p.Define("target_sos_id", 1, "The first input token of every hypothesis.");
  p.Define("target_eos_id", 2, "The token that ends a hypothesis.");
  p.Define("target_eoc_id", -1,
           "End-of-chunk (epsilon) token for merge_paths; -1: none.");
  p.Define("length_normalization", 0.0,
           "α of the length normalization score / ((5 + |Y|) / 5)^α, |Y| counting </s> "
           "(Lingvo's formula).");
  p.Define("coverage_penalty", 0.0,
           "β of the coverage penalty r·β·Σ_j log(clip(Σ_t attention_tj / r, 0.001, 0.5)); needs "
           "a step function that returns atten_probs.");
  p.Define("target_seq_length_ratio", 1.0, "r of the coverage penalty.");
  p.Define("valid_eos_max_logit_delta", 5.0,
           "</s> ends a hypothesis only when its log-prob is within this of the best extension "
           "of the same hypothesis.");
  p.Define("local_eos_threshold", -100.0,
           "</s> ends a hypothesis only when its own log-prob is above this.");
  p.Define("force_eos_in_last_step", false,
           "At the last step every hypothesis ends with </s>, whatever its log-prob.");
  p.Define("ensure_full_beam", false,
           "A source is not done before num_hyps_per_beam hypotheses have finished.");
  p.Define("merge_paths", false,
           "Merge hypotheses equal once target_eoc_id tokens are removed (log-sum-exp of their "
           "scores); needs target_eoc_id >= 0.");
  p.Define("allow_empty_terminated_hyp", true,
           "merge_paths: a hypothesis of only epsilons may end.");
  p.Define("num_hyps_to_return", 0, "Hypotheses returned per source (0: num_hyps_per_beam).");
  return p;
}

BeamSearchHelper::BeamSearchHelper(const glossa::Params& p) : BaseLayer(p) {
  num_hyps_per_beam_ = p.GetInt("num_hyps_per_beam");
  beam_size_ = p.GetFloat("beam_size");
  target_seq_len_ = p.GetInt("target_seq_len");
  sos_id_ = p.GetInt("target_sos_id");
  eos_id_ = p.GetInt("target_eos_id");
  eoc_id_ = p.GetInt("target_eoc_id");
  length_normalization_ = p.GetFloat("length_normalization");
  coverage_penalty_ = p.GetFloat("coverage_penalty");
  valid_eos_max_logit_delta_ = p.GetFloat("valid_eos_max_logit_delta");
  local_eos_threshold_ = p.GetFloat("local_eos_threshold");
  force_eos_in_last_step_ = p.GetBool("force_eos_in_last_step");
  ensure_full_beam_ = p.GetBool("ensure_full_beam");
  merge_paths_ = p.GetBool("merge_paths");
  allow_empty_terminated_hyp_ = p.GetBool("allow_empty_terminated_hyp");
  num_hyps_to_return_ = p.GetInt("num_hyps_to_return");
  target_seq_length_ratio_ = p.GetFloat("target_seq_length_ratio");
  auto fail = [&](const std::string& what) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': ", what));
  };
  if (num_hyps_per_beam_ < 1) fail(StrCat("num_hyps_per_beam must be >= 1, got ", num_hyps_per_beam_));
  if (target_seq_len_ < 1) fail(StrCat("target_seq_len must be >= 1, got ", target_seq_len_));
  if (length_normalization_ < 0) fail("length_normalization must be >= 0");
  if (coverage_penalty_ < 0) fail("coverage_penalty must be >= 0");
  if (merge_paths_ && eoc_id_ < 0) fail("merge_paths needs target_eoc_id >= 0");
  if (num_hyps_to_return_ < 0 || num_hyps_to_return_ > num_hyps_per_beam_) {
    fail(StrCat("num_hyps_to_return must be in [0, num_hyps_per_beam], got ", num_hyps_to_return_));
  }
  if (!(p.GetFloat("target_seq_length_ratio") > 0)) fail("target_seq_length_ratio must be > 0");
}

namespace {

struct Cand {
  double global;
  float local;
  int64_t word;
  int64_t parent;
};

// Lingvo's HigherScore: global desc, then word asc, then parent asc.
bool Higher(const Cand& a, const Cand& b) {
  if (a.global != b.global) return a.global > b.global;
  if (a.word != b.word) return a.word < b.word;
  return a.parent < b.parent;
}

struct Finished {
  std::vector<int64_t> ids;     // </s> (or the epsilon) included, <s> excluded
  std::vector<int64_t> path;    // the hypothesis index at each step (for attention)
  double raw = 0;               // the sum of the tokens' log-probs
  double normalized = 0;
  int64_t step = 0, index = 0;  // tie-breaks
};

// Labels of the path ending at hypothesis i at step t (rows 0..t), epsilons removed.
std::vector<int64_t> PathLabels(const std::vector<std::vector<int64_t>>& hyps,
                                const std::vector<std::vector<int64_t>>& prev, int64_t t,
                                int64_t i, int64_t eoc) {
  std::vector<int64_t> out;
  for (int64_t s = t; s >= 0; --s) {
    if (hyps[s][i] != eoc) out.push_back(hyps[s][i]);
    i = prev[s][i];
  }
  std::reverse(out.begin(), out.end());
  return out;
}

double LogSumExp(double a, double b) {
  const double m = std::max(a, b);
  if (m == -std::numeric_limits<double>::infinity()) return m;
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

}  // namespace

NestedMap GatherStates(const NestedMap& states, const at::Tensor& index) {
  return states.Transform([&](const NestedValue& v) -> NestedValue {
    if (!v.is_tensor()) return v;
    return v.AsTensor().index_select(0, index);
  });
}

SearchResult BeamSearchHelper::Search(int64_t num_beams, NestedMap states,
                                      const DecodeStepFn& step,
                                      const at::Tensor& source_lengths) const {
  const int64_t b_n = num_beams, k = num_hyps_per_beam_, n = k * b_n, t_max = target_seq_len_;
  if (b_n < 1) throw InvalidArgumentError(StrCat("layer '", path(), "': num_beams must be >= 1"));
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  std::vector<double> cum(n, 0.0);
  std::vector<double> best(b_n, -1e36);
  std::vector<bool> beam_done(b_n, false);
  std::vector<int64_t> num_finished(b_n, 0);
  std::vector<std::vector<int64_t>> hyps, prev;  // [t][N]
  std::vector<std::vector<float>> local_scores;  // [t][N]
  std::vector<at::Tensor> atten;                 // [t] -> [N, S] (coverage penalty)
  std::vector<std::vector<Finished>> finished(b_n);
  at::Tensor ids = at::full({n}, sos_id_, at::kLong);
  const int64_t m = k + 1 + (eoc_id_ >= 0 ? 1 : 0);

  for (int64_t t = 0; t < t_max; ++t) {
    auto [log_probs_in, new_states] = step(ids, t, states);
    at::Tensor atten_t;
    if (new_states.contains("atten_probs")) {
      atten_t = new_states.GetTensor("atten_probs").to(at::kDouble).contiguous();
      new_states.erase("atten_probs");
    }
    if (coverage_penalty_ > 0 && !atten_t.defined()) {
      throw FailedPreconditionError(StrCat(
          "layer '", path(), "': coverage_penalty needs a step function that returns atten_probs"));
    }
    if (log_probs_in.dim() != 2 || log_probs_in.size(0) != n) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': the step function must return ",
                                        "log-probs [", n, ", V], got ", log_probs_in.sizes()));
    }
    const at::Tensor lp = log_probs_in.to(at::kFloat).contiguous();
    const int64_t vocab = lp.size(1);
    if (eos_id_ < 0 || eos_id_ >= vocab) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': target_eos_id ", eos_id_,
                                        " is outside the vocabulary of ", vocab));
    }
    const float* lpd = lp.data_ptr<float>();
    const bool first = t == 0;
    const bool last = force_eos_in_last_step_ && t == t_max - 1;
    std::vector<std::vector<Cand>> beam_cands(b_n);
    std::vector<bool> has_done(n, false);
    std::vector<Cand> done_cand(n);
    std::vector<Cand> list;
    list.reserve(m + 1);
    for (int64_t i = 0; i < n; ++i) {
      if (first && i >= b_n) continue;  // step 0: only slot 0 of each source is expanded
      if (cum[i] == kNegInf) continue;  // a dead slot (fewer live extensions than slots)
      const float* row = lpd + i * vocab;
      list.clear();
      // The top m extensions of parent i (in the forced last step: </s> and the top m - 1 others).
      const int64_t want = last ? m - 1 : m;
      for (int64_t w = 0; w < vocab; ++w) {
        if (last && w == eos_id_) continue;
        const float l = row[w];
        if (std::isnan(l) || l == -std::numeric_limits<float>::infinity()) continue;
        Cand c{cum[i] + l, l, w, i};
        if (static_cast<int64_t>(list.size()) == want && !Higher(c, list.back())) continue;
        auto pos = std::upper_bound(list.begin(), list.end(), c, Higher);
        list.insert(pos, c);
        if (static_cast<int64_t>(list.size()) > want) list.pop_back();
      }
      if (last && std::isfinite(row[eos_id_])) {
        Cand e{cum[i] + row[eos_id_], row[eos_id_], eos_id_, i};
        list.insert(std::upper_bound(list.begin(), list.end(), e, Higher), e);
      }
      if (list.empty() && !last) {
        throw InvalidArgumentError(StrCat("layer '", path(), "': step ", t, ": hypothesis ", i,
                                          " has no finite log-prob (NaN or -inf everywhere)"));
      }
      const double eos_thr = list.front().global - valid_eos_max_logit_delta_;
      for (const Cand& e : list) {
        if (e.word == eos_id_) {
          if (last || (e.global > eos_thr && e.local > local_eos_threshold_)) {
            has_done[i] = true;
            done_cand[i] = e;
          }
        } else {
          beam_cands[i % b_n].push_back(e);
        }
      }
    }
    // Per source: the best k live extensions become the new hypotheses (slot j: j·B + b).
    std::vector<int64_t> new_hyp(n), new_prev(n);
    std::vector<float> new_local(n);
    std::vector<double> new_cum(n);
    for (int64_t b = 0; b < b_n; ++b) {
      std::vector<Cand>& cands = beam_cands[b];
      if (merge_paths_) {
        // Merge candidates whose label sequences agree once epsilons are removed (parents in
        // index order, each parent's list in its order: deterministic).
        std::vector<Cand> merged;
        std::vector<std::vector<int64_t>> labels;
        for (const Cand& c : cands) {
          std::vector<int64_t> l =
              t == 0 ? std::vector<int64_t>{} : PathLabels(hyps, prev, t - 1, c.parent, eoc_id_);
          if (c.word != eoc_id_) l.push_back(c.word);
          bool dup = false;
          for (size_t j = 0; j < merged.size(); ++j) {
            if (labels[j] != l) continue;
            const double g = LogSumExp(merged[j].global, c.global);
            if (Higher(c, merged[j])) merged[j] = c;
            merged[j].global = g;
            dup = true;
            break;
          }
          if (!dup) {
            merged.push_back(c);
            labels.push_back(std::move(l));
          }
        }
        cands = std::move(merged);
      }
      std::sort(cands.begin(), cands.end(), Higher);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t idx = j * b_n + b;
        if (j < static_cast<int64_t>(cands.size())) {
          const Cand& c = cands[j];
          new_hyp[idx] = c.word;
          new_prev[idx] = c.parent;
          new_local[idx] = c.local;
          new_cum[idx] = c.global;
        } else {
          // Fewer live extensions than slots (a tiny vocabulary): a dead hypothesis that can
          // never finish or win (Lingvo fills zeros here).
          new_hyp[idx] = eos_id_;
          new_prev[idx] = b;
          new_local[idx] = -std::numeric_limits<float>::infinity();
          new_cum[idx] = kNegInf;
        }
      }
    }
    hyps.push_back(new_hyp);
    prev.push_back(new_prev);
    local_scores.push_back(new_local);
    if (atten_t.defined()) atten.push_back(atten_t);
    // Finished hypotheses, indexed by their parent.
    for (int64_t i = 0; i < n; ++i) {
      if (!has_done[i]) continue;
      const int64_t b = i % b_n;
      const Cand& e = done_cand[i];
      best[b] = std::max(best[b], e.global);
      Finished f;
      f.step = t;
      f.index = i;
      f.raw = e.global;
      // Back-track the parent's path through rows t-1..0.
      std::vector<int64_t> rev_ids, rev_path;
      int64_t h = i;
      for (int64_t s = t - 1; s >= 0; --s) {
        rev_ids.push_back(hyps[s][h]);
        h = prev[s][h];
        rev_path.push_back(h);  // the row of step s's input that produced the token
      }
      f.ids.assign(rev_ids.rbegin(), rev_ids.rend());
      f.ids.push_back(eos_id_);
      f.path.assign(rev_path.rbegin(), rev_path.rend());
      f.path.push_back(i);
      finished[b].push_back(std::move(f));
      ++num_finished[b];
    }
    // Done test (sticky).
    bool all_done = true;
    for (int64_t b = 0; b < b_n; ++b) {
      if (!beam_done[b]) {
        if (!(ensure_full_beam_ && num_finished[b] < k)) {
          bool done = true;
          for (int64_t j = 0; j < k; ++j) {
            if (new_cum[j * b_n + b] > best[b] - beam_size_) done = false;
          }
          beam_done[b] = done;
        }
      }
      all_done = all_done && beam_done[b];
    }
    cum = new_cum;
    const at::Tensor index = at::tensor(new_prev, at::kLong);
    states = GatherStates(new_states, index);
    ids = at::tensor(new_hyp, at::kLong);
    if (all_done) break;
  }

  // Final scores and the top hypotheses per source.
  const int64_t ret = num_hyps_to_return_ > 0 ? num_hyps_to_return_ : k;
  const double r = target_seq_length_ratio_;
  int64_t longest = 1;
  for (auto& fs : finished) {
    for (Finished& f : fs) {
      const double len = static_cast<double>(f.ids.size());
      const double lp = std::pow(len + 5.0, length_normalization_) /
                        std::pow(5.0, length_normalization_);
      double cp = 0;
      if (coverage_penalty_ > 0) {
        // Attention of each step of the path: the step's parent row (the query that produced it).
        const int64_t b = &fs - finished.data();
        const int64_t s_len =
            source_lengths.defined()
                ? std::min<int64_t>(source_lengths[b].item<int64_t>(), atten.front().size(1))
                : atten.front().size(1);
        std::vector<double> cov(s_len, 0.0);
        for (size_t s = 0; s < f.path.size(); ++s) {
          // At step s the hypothesis was row f.path[s] of that step's input.
          const at::Tensor row = atten[s][f.path[s]];
          const double* a = row.data_ptr<double>();
          for (int64_t j = 0; j < s_len; ++j) cov[j] += a[j];
        }
        for (int64_t j = 0; j < s_len; ++j) {
          cp += std::log(std::min(0.5, std::max(0.001, cov[j] / r)));
        }
        cp *= r * coverage_penalty_;
      }
      f.normalized = f.raw / lp + cp;
      longest = std::max<int64_t>(longest, static_cast<int64_t>(f.ids.size()));
    }
  }
  SearchResult out;
  out.topk_ids = at::zeros({b_n, ret, longest}, at::kLong);
  out.topk_lens = at::zeros({b_n, ret}, at::kLong);
  out.topk_scores = at::zeros({b_n, ret}, at::kDouble);
  auto ids_a = out.topk_ids.accessor<int64_t, 3>();
  auto lens_a = out.topk_lens.accessor<int64_t, 2>();
  auto scores_a = out.topk_scores.accessor<double, 2>();
  for (int64_t b = 0; b < b_n; ++b) {
    std::vector<Finished>& fs = finished[b];
    std::sort(fs.begin(), fs.end(), [](const Finished& x, const Finished& y) {
      if (x.normalized != y.normalized) return x.normalized > y.normalized;
      if (x.ids.size() != y.ids.size()) return x.ids.size() < y.ids.size();
      if (x.step != y.step) return x.step < y.step;
      return x.index < y.index;
    });
    for (int64_t j = 0; j < std::min<int64_t>(ret, static_cast<int64_t>(fs.size())); ++j) {
      const Finished& f = fs[j];
      for (size_t s = 0; s < f.ids.size(); ++s) ids_a[b][j][s] = f.ids[s];
      lens_a[b][j] = static_cast<int64_t>(f.ids.size());
      scores_a[b][j] = f.normalized;
    }
  }
  (void)allow_empty_terminated_hyp_;
  return out;
}

SearchResult SampleSearch(int64_t num_beams, NestedMap states, const DecodeStepFn& step,
                          int64_t max_len, int64_t sos_id, int64_t eos_id, double temperature,
                          int64_t top_k, uint64_t seed) {
  if (num_beams < 1 || max_len < 1) {
    throw InvalidArgumentError(StrCat("SampleSearch: num_beams (", num_beams, ") and max_len (",
                                      max_len, ") must be >= 1"));
  }
  if (temperature < 0) {
    throw InvalidArgumentError(StrCat("SampleSearch: temperature must be >= 0, got ", temperature));
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor ids = at::full({num_beams}, sos_id, at::kLong);
  at::Tensor done = at::zeros({num_beams}, at::kBool);
  at::Tensor lens = at::zeros({num_beams}, at::kLong);
  at::Tensor scores = at::zeros({num_beams}, at::kDouble);
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t < max_len; ++t) {
    auto [log_probs, new_states] = step(ids, t, states);
    if (new_states.contains("atten_probs")) new_states.erase("atten_probs");
    at::Tensor lp = log_probs.to(at::kFloat);
    at::Tensor next;
    if (temperature == 0) {
      next = lp.argmax(-1);
    } else {
      at::Tensor logits = lp / temperature;
      if (top_k > 0 && top_k < logits.size(-1)) {
        at::Tensor kth = std::get<0>(logits.topk(top_k, -1)).select(-1, top_k - 1).unsqueeze(-1);
        logits = logits.masked_fill(logits < kth, -INFINITY);
      }
      next = at::multinomial(at::softmax(logits, -1), 1, /*replacement=*/false, gen).squeeze(1);
    }
    const at::Tensor live = ~done;
    next = next.masked_fill(done, 0);
    scores = scores + (lp.gather(1, next.unsqueeze(1)).squeeze(1).to(at::kDouble) *
                       live.to(at::kDouble));
    lens = lens + live.to(at::kLong);
    out.push_back(next);
    done = done | (next == eos_id);
    states = std::move(new_states);
    ids = next;
    if (done.all().item<bool>()) break;
  }
  SearchResult r;
  r.topk_ids = at::stack(out, 1).unsqueeze(1);
  r.topk_lens = lens.unsqueeze(1);
  r.topk_scores = scores.unsqueeze(1);
  return r;
}

GLOSSA_REGISTER_CLASS(BeamSearchHelper, "glossa.search.BeamSearchHelper");

}  // namespace glossa
