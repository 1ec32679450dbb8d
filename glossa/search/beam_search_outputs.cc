#include "glossa/search/beam_search_outputs.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {

namespace {

double LengthNorm(int64_t length, double alpha) {
  return std::pow(length + 5.0, alpha) / std::pow(5.0, alpha);
}

// r·β·Σ_j log(clip(coverage_j / r, 0.001, 0.5)).
double CoveragePenalty(const std::vector<double>& coverage, double beta, double ratio) {
  double sum = 0;
  for (double c : coverage) sum += std::log(std::min(0.5, std::max(0.001, c / ratio)));
  return ratio * beta * sum;
}

// Lingvo's TopKTerminatedHyps score of one hypothesis over src_len source positions (-1: all of
// its attention).
double NormalizedScore(const Hypothesis& h, int64_t src_len, double alpha, double beta,
                       double ratio) {
  const double sum = std::accumulate(h.scores.begin(), h.scores.end(), 0.0);
  double penalty = 0;
  if (beta > 0) {
    size_t width = 0;
    for (const auto& v : h.atten_vecs) width = std::max(width, v.size());
    std::vector<double> coverage(src_len >= 0 ? static_cast<size_t>(src_len) : width, 0.0);
    for (const auto& v : h.atten_vecs) {
      for (size_t j = 0; j < coverage.size() && j < v.size(); ++j) coverage[j] += v[j];
    }
    penalty = CoveragePenalty(coverage, beta, ratio);
  }
  return sum / LengthNorm(static_cast<int64_t>(h.scores.size()), alpha) + penalty;
}

std::vector<int64_t> SourceLengths(const at::Tensor& src_seq_lengths, int64_t num_beams) {
  std::vector<int64_t> out(num_beams, -1);
  if (!src_seq_lengths.defined()) return out;
  if (src_seq_lengths.numel() != num_beams) {
    throw InvalidArgumentError(StrCat("TopKTerminatedHyps: src_seq_lengths must have ", num_beams,
                                      " entries (one per source), got ", src_seq_lengths.sizes()));
  }
  const at::Tensor lens = src_seq_lengths.reshape({-1}).to(at::kLong).contiguous();
  for (int64_t b = 0; b < num_beams; ++b) out[b] = lens.data_ptr<int64_t>()[b];
  return out;
}

}  // namespace

HypothesisGrid TopKTerminatedHyps(const HypothesisGrid& done_hyps,
                                  const at::Tensor& src_seq_lengths, int64_t k,
                                  int64_t num_hyps_per_beam, double length_normalization,
                                  double coverage_penalty, double target_seq_length_ratio) {
  const int64_t n = done_hyps.empty() ? 0 : static_cast<int64_t>(done_hyps.front().size());
  if (k < 1 || num_hyps_per_beam < 1 || n % num_hyps_per_beam != 0) {
    throw InvalidArgumentError(StrCat("TopKTerminatedHyps: needs k >= 1 and rows of a multiple of ",
                                      "num_hyps_per_beam (", num_hyps_per_beam, "), got k ", k,
                                      " and ", n, " hypotheses per row"));
  }
  const int64_t b_n = n / num_hyps_per_beam;
  const std::vector<int64_t> src_lens = SourceLengths(src_seq_lengths, b_n);
  HypothesisGrid per_beam(b_n);
  for (const auto& row : done_hyps) {  // step by step, then slot by slot: the last tie-break
    for (int64_t j = 0; j < static_cast<int64_t>(row.size()); ++j) {
      if (row[j].empty()) continue;
      Hypothesis h = row[j];
      h.normalized_score = NormalizedScore(h, src_lens[j % b_n], length_normalization,
                                           coverage_penalty, target_seq_length_ratio);
      per_beam[j % b_n].push_back(std::move(h));
    }
  }
  HypothesisGrid out(b_n, std::vector<Hypothesis>(k));
  for (int64_t b = 0; b < b_n; ++b) {
    std::vector<Hypothesis>& hs = per_beam[b];
    std::stable_sort(hs.begin(), hs.end(), [](const Hypothesis& x, const Hypothesis& y) {
      if (x.normalized_score != y.normalized_score) return x.normalized_score > y.normalized_score;
      return x.ids.size() < y.ids.size();
    });
    for (int64_t j = 0; j < std::min<int64_t>(k, hs.size()); ++j) out[b][j] = std::move(hs[j]);
  }
  return out;
}

SearchResult UnpackHyp(const HypothesisGrid& hyps, int64_t max_seq_length) {
  const int64_t b_n = static_cast<int64_t>(hyps.size());
  int64_t k = 0, len = max_seq_length;
  for (const auto& row : hyps) {
    k = std::max<int64_t>(k, row.size());
    for (const Hypothesis& h : row) {
      if (max_seq_length <= 0) len = std::max<int64_t>(len, h.ids.size());
    }
  }
  len = std::max<int64_t>(len, 0);
  SearchResult r;
  r.topk_ids = at::zeros({b_n, k, len}, at::kLong);
  r.topk_lens = at::zeros({b_n, k}, at::kLong);
  r.topk_scores = at::zeros({b_n, k}, at::kDouble);
  auto ids = r.topk_ids.accessor<int64_t, 3>();
  auto lens = r.topk_lens.accessor<int64_t, 2>();
  auto scores = r.topk_scores.accessor<double, 2>();
  for (int64_t b = 0; b < b_n; ++b) {
    for (int64_t j = 0; j < static_cast<int64_t>(hyps[b].size()); ++j) {
      const Hypothesis& h = hyps[b][j];
      if (h.ids.empty()) continue;
      const int64_t n = std::min<int64_t>(len, h.ids.size());
      for (int64_t t = 0; t < n; ++t) ids[b][j][t] = h.ids[t];
      lens[b][j] = n;
      scores[b][j] = h.normalized_score;
    }
  }
  return r;
}

namespace {

// BeamSearchOuts checked and converted (contiguous; int64, bool, float64, float32 attention).
struct OutsView {
  int64_t steps = 0, num_hyps = 0, source_len = 0;
  at::Tensor hyps, prev_hyps, done, cum, eos_scores, scores, atten, eos_atten, cum_atten;

  static at::Tensor Matrix(const at::Tensor& x, const char* name, int64_t t, int64_t n,
                           at::ScalarType type) {
    if (!x.defined()) return {};
    if (x.dim() != 2 || x.size(0) != t || x.size(1) != n) {
      throw InvalidArgumentError(StrCat("beam search outs: ", name, " must be [", t, ", ", n,
                                        "] like hyps, got ", x.sizes()));
    }
    return x.to(type).contiguous();
  }
  at::Tensor Cube(const at::Tensor& x, const char* name) {
    if (!x.defined()) return {};
    if (x.dim() != 3 || x.size(0) != steps || x.size(1) != num_hyps ||
        (source_len >= 0 && x.size(2) != source_len)) {
      throw InvalidArgumentError(StrCat("beam search outs: ", name, " must be [", steps, ", ",
                                        num_hyps, ", S], S the same for every attention, got ",
                                        x.sizes()));
    }
    source_len = x.size(2);
    return x.to(at::kFloat).contiguous();
  }
  explicit OutsView(const BeamSearchOuts& o) {
    if (!o.hyps.defined() || o.hyps.dim() != 2) {
      throw InvalidArgumentError("beam search outs: hyps must be [T, N]");
    }
    steps = o.hyps.size(0);
    num_hyps = o.hyps.size(1);
    hyps = o.hyps.to(at::kLong).contiguous();
    prev_hyps = Matrix(o.prev_hyps, "prev_hyps", steps, num_hyps, at::kLong);
    done = Matrix(o.done_hyps, "done_hyps", steps, num_hyps, at::kBool);
    if (!prev_hyps.defined() || !done.defined()) {
      throw InvalidArgumentError("beam search outs: prev_hyps and done_hyps are required");
    }
    cum = Matrix(o.cumulative_scores, "cumulative_scores", steps, num_hyps, at::kDouble);
    eos_scores = Matrix(o.eos_scores, "eos_scores", steps, num_hyps, at::kDouble);
    scores = Matrix(o.scores, "scores", steps, num_hyps, at::kDouble);
    source_len = -1;
    atten = Cube(o.atten_probs, "atten_probs");
    eos_atten = Cube(o.eos_atten_probs, "eos_atten_probs");
    cum_atten = Cube(o.cumulative_atten_probs, "cumulative_atten_probs");
    source_len = std::max<int64_t>(source_len, 0);
  }
  int64_t I(const at::Tensor& m, int64_t t, int64_t j) const {
    return m.data_ptr<int64_t>()[t * num_hyps + j];
  }
  double D(const at::Tensor& m, int64_t t, int64_t j) const {
    return m.defined() ? m.data_ptr<double>()[t * num_hyps + j] : 0.0;
  }
  bool Done(int64_t t, int64_t j) const { return done.data_ptr<bool>()[t * num_hyps + j]; }
  std::vector<float> AttenVec(const at::Tensor& a, int64_t t, int64_t j) const {
    if (!a.defined()) return {};
    const float* p = a.data_ptr<float>() + (t * num_hyps + j) * source_len;
    return std::vector<float>(p, p + source_len);
  }
};

// The hypothesis that slot j (at step t-1) ended with </s> at step t: ids, scores, attention.
Hypothesis PathHypothesis(const OutsView& v, int64_t t, int64_t j, int64_t eos_id,
                          int64_t num_beams) {
  std::vector<int64_t> ids{eos_id};
  std::vector<double> scores{v.D(v.eos_scores, t, j)};
  std::vector<std::vector<float>> atten{v.AttenVec(v.eos_atten, t, j)};
  int64_t prev = j;
  for (int64_t s = t - 1; s >= 0; --s) {
    if (prev < 0 || prev >= v.num_hyps) {
      throw InvalidArgumentError(StrCat("beam search outs: prev_hyps leads to slot ", prev,
                                        " at step ", s, ", outside [0, ", v.num_hyps, ")"));
    }
    ids.push_back(v.I(v.hyps, s, prev));
    scores.push_back(v.D(v.scores, s, prev));
    atten.push_back(v.AttenVec(v.atten, s, prev));
    prev = v.I(v.prev_hyps, s, prev);
  }
  Hypothesis h;
  h.beam_id = j % num_beams;
  h.ids.assign(ids.rbegin(), ids.rend());
  h.scores.assign(scores.rbegin(), scores.rend());
  if (v.atten.defined() || v.eos_atten.defined()) h.atten_vecs.assign(atten.rbegin(), atten.rend());
  return h;
}

int64_t NumBeams(int64_t num_hyps, int64_t num_hyps_per_beam) {
  if (num_hyps_per_beam < 1 || num_hyps % num_hyps_per_beam != 0) {
    throw InvalidArgumentError(StrCat("beam search outs: ", num_hyps,
                                      " hypotheses are not a multiple of num_hyps_per_beam ",
                                      num_hyps_per_beam));
  }
  return num_hyps / num_hyps_per_beam;
}

}  // namespace

HypothesisGrid HypsFromBeamSearchOuts(const BeamSearchOuts& outs, int64_t eos_id,
                                      int64_t num_hyps_per_beam) {
  const OutsView v(outs);
  const int64_t b_n = NumBeams(v.num_hyps, num_hyps_per_beam);
  HypothesisGrid out(v.steps, std::vector<Hypothesis>(v.num_hyps));
  for (int64_t t = 0; t < v.steps; ++t) {
    for (int64_t j = 0; j < v.num_hyps; ++j) {
      if (v.Done(t, j)) out[t][j] = PathHypothesis(v, t, j, eos_id, b_n);
    }
  }
  return out;
}

namespace {

struct DoneEntry {
  int64_t t, j;
  double normalized;
};

// The best K done entries of each source by normalized score, then earlier step, then slot.
std::vector<std::vector<DoneEntry>> BestDoneEntries(const OutsView& v,
                                                    const TopKFromBeamSearchOutsOptions& o,
                                                    int64_t num_beams) {
  if (!v.cum.defined() || !v.eos_scores.defined()) {
    throw InvalidArgumentError(
        "TopKFromBeamSearchOuts: cumulative_scores and eos_scores are required");
  }
  if (o.coverage_penalty > 0 && !v.cum_atten.defined()) {
    throw InvalidArgumentError(
        "TopKFromBeamSearchOuts: coverage_penalty needs cumulative_atten_probs");
  }
  std::vector<std::vector<DoneEntry>> per_beam(num_beams);
  for (int64_t j = 0; j < v.num_hyps; ++j) {
    for (int64_t t = 0; t < v.steps; ++t) {
      if (!v.Done(t, j)) continue;
      const double score = v.D(v.eos_scores, t, j) + (t > 0 ? v.D(v.cum, t - 1, j) : 0.0);
      double penalty = 0;
      if (o.coverage_penalty > 0) {
        const std::vector<float> a = v.AttenVec(v.cum_atten, t, j);
        penalty = CoveragePenalty(std::vector<double>(a.begin(), a.end()), o.coverage_penalty,
                                  o.target_seq_length_ratio);
      }
      per_beam[j % num_beams].push_back(
          {t, j, score / LengthNorm(t + 1, o.length_normalization) + penalty});
    }
  }
  for (auto& entries : per_beam) {
    std::sort(entries.begin(), entries.end(), [](const DoneEntry& x, const DoneEntry& y) {
      if (x.normalized != y.normalized) return x.normalized > y.normalized;
      if (x.t != y.t) return x.t < y.t;
      return x.j < y.j;
    });
    if (static_cast<int64_t>(entries.size()) > o.num_hyps_per_beam) {
      entries.resize(o.num_hyps_per_beam);
    }
  }
  return per_beam;
}

}  // namespace

BeamSearchDecodeOutput TopKFromBeamSearchOuts(const BeamSearchOuts& outs,
                                              const TopKFromBeamSearchOutsOptions& options) {
  if (options.length_normalization < 0 || options.coverage_penalty < 0) {
    throw InvalidArgumentError(StrCat(
        "TopKFromBeamSearchOuts: length_normalization and ", "coverage_penalty must be >= 0, got ",
        options.length_normalization, ", ", options.coverage_penalty));
  }
  const OutsView v(outs);
  const int64_t b_n = NumBeams(v.num_hyps, options.num_hyps_per_beam),
                k = options.num_hyps_per_beam;
  const int64_t len = options.max_seq_length > 0 ? options.max_seq_length : v.steps;
  BeamSearchDecodeOutput out;
  out.topk_ids = at::zeros({b_n, k, len}, at::kLong);
  out.topk_lens = at::zeros({b_n, k}, at::kLong);
  out.topk_scores = at::zeros({b_n, k}, at::kDouble);
  if (options.populate_topk_hyps) out.topk_hyps.assign(b_n, std::vector<Hypothesis>(k));
  auto ids = out.topk_ids.accessor<int64_t, 3>();
  const std::vector<std::vector<DoneEntry>> best = BestDoneEntries(v, options, b_n);
  for (int64_t b = 0; b < b_n; ++b) {
    for (int64_t j = 0; j < static_cast<int64_t>(best[b].size()); ++j) {
      const DoneEntry& e = best[b][j];
      Hypothesis h = PathHypothesis(v, e.t, e.j, options.eos_id, b_n);
      for (int64_t s = 0; s < std::min<int64_t>(len, h.ids.size()); ++s) ids[b][j][s] = h.ids[s];
      out.topk_lens[b][j] = std::min<int64_t>(len, e.t + 1);
      out.topk_scores[b][j] = e.normalized;
      if (options.populate_topk_hyps) {
        h.normalized_score = e.normalized;
        out.topk_hyps[b][j] = std::move(h);
      }
    }
  }
  return out;
}

namespace {

// The outputs' topk tensors side by side along K (ids padded to the longest).
SearchResult ConcatOutputs(const std::vector<BeamSearchDecodeOutput>& outputs) {
  const int64_t b_n = outputs.front().topk_scores.size(0);
  int64_t len = 0;
  for (const BeamSearchDecodeOutput& o : outputs) {
    if (o.topk_scores.dim() != 2 || o.topk_scores.size(0) != b_n || o.topk_ids.dim() != 3 ||
        o.topk_ids.size(1) != o.topk_scores.size(1) ||
        !o.topk_lens.sizes().equals(o.topk_scores.sizes())) {
      throw InvalidArgumentError(
          StrCat("MergeBeamSearchOutputs: every output must hold ", b_n,
                 " sources: topk_ids [B, K, T], topk_lens and topk_scores [B, ",
                 "K]; got topk_scores ", o.topk_scores.sizes()));
    }
    len = std::max<int64_t>(len, o.topk_ids.size(2));
  }
  std::vector<at::Tensor> ids, lens, scores;
  for (const BeamSearchDecodeOutput& o : outputs) {
    ids.push_back(at::constant_pad_nd(o.topk_ids.to(at::kLong), {0, len - o.topk_ids.size(2)}));
    lens.push_back(o.topk_lens.to(at::kLong));
    scores.push_back(o.topk_scores.to(at::kDouble));
  }
  return SearchResult{at::cat(ids, 1), at::cat(lens, 1), at::cat(scores, 1)};
}

// Per source, the columns of the best `keep` by score (length 0: -1e6), ties in column order.
std::vector<std::vector<int64_t>> MergedOrder(const SearchResult& all, int64_t keep) {
  const at::Tensor key =
      at::where(all.topk_lens == 0, at::full_like(all.topk_scores, -1e6), all.topk_scores)
          .contiguous();
  const int64_t b_n = key.size(0), total = key.size(1);
  std::vector<std::vector<int64_t>> out(b_n);
  for (int64_t b = 0; b < b_n; ++b) {
    const double* kp = key.data_ptr<double>() + b * total;
    std::vector<int64_t> order(total);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [kp](int64_t x, int64_t y) { return kp[x] > kp[y]; });
    out[b].assign(order.begin(), order.begin() + keep);
  }
  return out;
}

}  // namespace

BeamSearchDecodeOutput MergeBeamSearchOutputs(int64_t max_hyps_per_beam,
                                              const std::vector<BeamSearchDecodeOutput>& outputs) {
  if (outputs.empty()) throw InvalidArgumentError("MergeBeamSearchOutputs: no outputs");
  const SearchResult all = ConcatOutputs(outputs);
  const int64_t b_n = all.topk_scores.size(0), total = all.topk_scores.size(1);
  if (max_hyps_per_beam < 1 || max_hyps_per_beam > total) {
    throw InvalidArgumentError(StrCat("MergeBeamSearchOutputs: max_hyps_per_beam must be in [1, ",
                                      total, "], got ", max_hyps_per_beam));
  }
  const std::vector<std::vector<int64_t>> order = MergedOrder(all, max_hyps_per_beam);
  at::Tensor index = at::zeros({b_n, max_hyps_per_beam}, at::kLong);
  for (int64_t b = 0; b < b_n; ++b) {
    for (int64_t j = 0; j < max_hyps_per_beam; ++j) index[b][j] = order[b][j];
  }
  BeamSearchDecodeOutput out;
  const int64_t len = all.topk_ids.size(2);
  out.topk_ids = all.topk_ids.gather(1, index.unsqueeze(2).expand({b_n, max_hyps_per_beam, len}));
  out.topk_lens = all.topk_lens.gather(1, index);
  out.topk_scores = all.topk_scores.gather(1, index);
  out.other_states = outputs.front().other_states;
  // topk_hyps, when every output has them for every slot.
  std::vector<std::vector<const Hypothesis*>> hyps(b_n);
  for (const BeamSearchDecodeOutput& o : outputs) {
    for (int64_t b = 0; b < b_n; ++b) {
      const int64_t k = o.topk_scores.size(1);
      if (static_cast<int64_t>(o.topk_hyps.size()) != b_n ||
          static_cast<int64_t>(o.topk_hyps[b].size()) != k) {
        return out;
      }
      for (const Hypothesis& h : o.topk_hyps[b]) hyps[b].push_back(&h);
    }
  }
  out.topk_hyps.assign(b_n, {});
  for (int64_t b = 0; b < b_n; ++b) {
    for (int64_t col : order[b]) out.topk_hyps[b].push_back(*hyps[b][col]);
  }
  return out;
}

}  // namespace glossa
