// One step of BeamSearchHelper (Lingvo's BeamSearchStepV2): the checked inputs, each parent's
// extensions, each source's top hypotheses, the terminated ones and the stopping test. The
// search around it (BeamSearchDecode, the states, dropping finished sources) is beam_search.cc.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/search/beam_search.h"

namespace glossa {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kMinScore = -1e36;  // Lingvo's best score before any hypothesis has ended

// NaN and -inf log-probs never make a candidate.
bool IsCandidate(float log_prob) {
  return !std::isnan(log_prob) && log_prob != -std::numeric_limits<float>::infinity();
}

}  // namespace

// One step's inputs, checked and in the layout the step reads.
struct BeamSearchHelper::StepInputs {
  int64_t t = 0, num_beams = 0, num_hyps = 0, vocab = 0, source_len = 0;
  bool first = false;            // step 0: only slot b of each source is extended
  bool last = false;             // force_eos_in_last_step's last step
  at::Tensor log_probs;          // [N, V] float32, contiguous
  at::Tensor atten;              // [N, S] float32, contiguous
  std::vector<bool> last_chunk;  // [N]
  // Hypothesis i's row of log_probs: i itself, or, when only some sources ran the step
  // (drop_finished_sources), row_of[i] (-1: a source that left the batch, never read).
  std::vector<int64_t> row_of;
  const float* Row(int64_t i) const {
    return log_probs.data_ptr<float>() + (row_of.empty() ? i : row_of[i]) * vocab;
  }
};

// The extension with which parent hyp.hyp_id ends at this step, and its terminal token.
struct BeamSearchHelper::Terminal {
  bool valid = false;
  Hyp hyp;
  int64_t symbol = -1;
};

BeamSearchState BeamSearchHelper::InitState(int64_t num_beams, int64_t max_steps,
                                            int64_t source_len) const {
  if (num_beams < 1 || max_steps < 1 || source_len < 0) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': InitState needs num_beams >= 1, ",
                                      "max_steps >= 1 and source_len >= 0, got ", num_beams, ", ",
                                      max_steps, ", ", source_len));
  }
  const int64_t n = num_hyps_per_beam_ * num_beams;
  BeamSearchState s;
  s.best_scores = at::full({num_beams}, kMinScore, at::kDouble);
  s.cumulative_scores = at::zeros({n}, at::kDouble);
  s.scores = at::zeros({max_steps, n}, at::kDouble);
  s.hyps = at::zeros({max_steps, n}, at::kLong);
  s.prev_hyps = at::zeros({max_steps, n}, at::kLong);
  s.done_hyps.assign(max_steps, std::vector<Hypothesis>(n));
  s.atten_probs = at::zeros({max_steps, n, source_len}, at::kFloat);
  s.beam_done = at::zeros({num_beams}, at::kBool);
  return s;
}

BeamSearchHelper::StepInputs BeamSearchHelper::CheckStepInputs(
    int64_t t, const at::Tensor& log_probs, const at::Tensor& atten_probs,
    const at::Tensor& is_last_chunk, const BeamSearchState& state,
    const std::vector<int64_t>* live) const {
  auto fail = [&](const std::string& what) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': step ", t, ": ", what));
  };
  if (!state.best_scores.defined() || state.hyps.dim() != 2 || state.atten_probs.dim() != 3) {
    fail("the state is not initialized (BeamSearchHelper::InitState)");
  }
  StepInputs in;
  in.t = t;
  in.num_beams = state.best_scores.size(0);
  in.num_hyps = num_hyps_per_beam_ * in.num_beams;
  in.source_len = state.atten_probs.size(2);
  const int64_t steps = state.hyps.size(0);
  if (state.cumulative_scores.size(0) != in.num_hyps || t < 0 || t >= steps) {
    fail(StrCat("the state has ", state.cumulative_scores.size(0), " hypotheses and ", steps,
                " steps; expected ", in.num_hyps, " and a step in [0, ", steps, ")"));
  }
  // The rows the step function ran: every hypothesis, or those of the live sources.
  const int64_t b_live = live != nullptr ? static_cast<int64_t>(live->size()) : in.num_beams;
  const int64_t rows = num_hyps_per_beam_ * b_live;
  if (log_probs.dim() != 2 || log_probs.size(0) != rows) {
    fail(StrCat("expected log-probs [", rows, ", V], got ", log_probs.sizes()));
  }
  in.log_probs = log_probs.to(at::kFloat).contiguous();
  // Row r = j·B' + q of the step is hypothesis j·B + live[q].
  std::vector<int64_t> full(rows);
  for (int64_t r = 0; r < rows; ++r) {
    full[r] = b_live == in.num_beams ? r : (r / b_live) * in.num_beams + (*live)[r % b_live];
  }
  if (b_live != in.num_beams) {
    // A source missing from the step is never read: it must be one the search skips.
    std::vector<bool> ran(in.num_beams, false);
    for (int64_t b : *live) ran[b] = true;
    const bool* done = state.beam_done.data_ptr<bool>();
    for (int64_t b = 0; b < in.num_beams; ++b) {
      if (!ran[b] && !(terminate_beams_independently_ && done[b])) {
        fail(StrCat("source ", b, " left the step but is not finished"));
      }
    }
    in.row_of.assign(in.num_hyps, -1);
    for (int64_t r = 0; r < rows; ++r) in.row_of[full[r]] = r;
  }
  in.vocab = in.log_probs.size(1);
  if (eos_id_ < 0 || eos_id_ >= in.vocab || eoc_id_ >= in.vocab) {
    fail(StrCat("target_eos_id ", eos_id_, " or target_eoc_id ", eoc_id_,
                " is outside the vocabulary of ", in.vocab));
  }
  if (atten_probs.defined()) {
    if (atten_probs.dim() != 2 || atten_probs.size(0) != rows ||
        atten_probs.size(1) != in.source_len) {
      fail(StrCat("expected atten_probs [", rows, ", ", in.source_len, "], got ",
                  atten_probs.sizes()));
    }
    in.atten = atten_probs.to(at::kFloat).contiguous();
    if (rows != in.num_hyps) {
      in.atten = at::zeros({in.num_hyps, in.source_len}, at::kFloat)
                     .index_copy_(0, at::tensor(full, at::kLong), in.atten);
    }
  } else {
    in.atten = at::zeros({in.num_hyps, in.source_len}, at::kFloat);
  }
  in.last_chunk.assign(in.num_hyps, false);
  if (is_last_chunk.defined()) {
    if (is_last_chunk.numel() != rows) {
      fail(StrCat("expected is_last_chunk [", rows, "], got ", is_last_chunk.sizes()));
    }
    const at::Tensor flags = is_last_chunk.reshape({-1}).to(at::kBool).contiguous();
    for (int64_t r = 0; r < rows; ++r) in.last_chunk[full[r]] = flags.data_ptr<bool>()[r];
  }
  in.first = t == 0;
  in.last = force_eos_in_last_step_ && t == steps - 1;
  return in;
}

namespace {

// The tokens of the path that ends at slot i of step t - 1 (rows t-1..0), `epsilon` removed.
std::vector<int64_t> PrevLabels(const BeamSearchState& state, int64_t t, int64_t i,
                                int64_t epsilon) {
  const int64_t n = state.hyps.size(1);
  const int64_t* hyps = state.hyps.data_ptr<int64_t>();
  const int64_t* prev = state.prev_hyps.data_ptr<int64_t>();
  std::vector<int64_t> out;
  for (int64_t s = t - 1; s >= 0; --s) {
    if (hyps[s * n + i] != epsilon) out.push_back(hyps[s * n + i]);
    i = prev[s * n + i];
  }
  std::reverse(out.begin(), out.end());
  return out;
}

// The empty slot of a source with fewer live extensions than slots: it can never end or win.
Hyp DeadHyp(int64_t beam, int64_t eos_id) {
  Hyp h;
  h.beam_id = h.hyp_id = beam;
  h.word_id = eos_id;
  h.local_score = h.global_score = kNegInf;
  return h;
}

}  // namespace

// Lingvo's per-hypothesis TopK: the num_hyps_per_beam + 1 (+ 1 with an end-of-chunk token) best
// extensions of parent i, sorted by HigherScore; at the forced last step </s> is always one of
// them. Then force_eos_in_top_k / force_last_chunk_eoc_in_top_k.
std::vector<Hyp> BeamSearchHelper::ParentExtensions(const StepInputs& in, int64_t i, double cum,
                                                    std::vector<int64_t> prev_labels) const {
  const float* row = in.Row(i);
  const size_t m = static_cast<size_t>(num_hyps_per_beam_ + 1 + (eoc_id_ >= 0 ? 1 : 0));
  auto better = [&](const Hyp& x, const Hyp& y) {
    if (in.last && (x.word_id == eos_id_) != (y.word_id == eos_id_)) return x.word_id == eos_id_;
    return HigherScore(x, y);
  };
  std::vector<Hyp> entries;
  entries.reserve(m + 1);
  Hyp c;
  c.beam_id = i % in.num_beams;
  c.hyp_id = i;
  for (int64_t w = 0; w < in.vocab; ++w) {
    if (!IsCandidate(row[w])) continue;
    c.word_id = w;
    c.local_score = row[w];
    c.global_score = cum + row[w];
    if (entries.size() == m && !better(c, entries.back())) continue;
    entries.insert(std::upper_bound(entries.begin(), entries.end(), c, better), c);
    if (entries.size() > m) entries.pop_back();
  }
  if (entries.empty()) {
    if (in.last) return entries;
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': step ", in.t, ": hypothesis ", i,
               " has no finite log-prob (NaN or -inf everywhere): is the model producing NaNs?"));
  }
  std::sort(entries.begin(), entries.end(), HigherScore);
  for (Hyp& e : entries) e.prev_labels = prev_labels;
  ForceTerminals(in, i, cum, &entries);
  return entries;
}

void BeamSearchHelper::ForceTerminals(const StepInputs& in, int64_t i, double cum,
                                      std::vector<Hyp>* entries) const {
  const float* row = in.Row(i);
  auto has = [&](int64_t w) {
    return std::any_of(entries->begin(), entries->end(),
                       [w](const Hyp& h) { return h.word_id == w; });
  };
  auto extension = [&](int64_t w) {
    Hyp h = entries->back();  // same source, parent and labels
    h.word_id = w;
    h.local_score = row[w];
    h.global_score = cum + row[w];
    return h;
  };
  if (force_eos_in_top_k_ && !has(eos_id_) && IsCandidate(row[eos_id_])) {
    entries->back() = extension(eos_id_);
  }
  if (force_last_chunk_eoc_in_top_k_ && eoc_id_ >= 0 && in.last_chunk[i] && !has(eoc_id_) &&
      IsCandidate(row[eoc_id_])) {
    // In place of the second-to-last entry (the last may be a forced </s>).
    const Hyp eoc = extension(eoc_id_);
    if (entries->size() >= 2) {
      (*entries)[entries->size() - 2] = eoc;
    } else {
      entries->insert(entries->begin(), eoc);
    }
  }
}

// Extends every live parent; a </s> (or last-chunk end-of-chunk) extension that passes the tests
// ends its parent (the last one in score order wins: the lower score, as in Lingvo), the others
// go to their source's HypTopK. Returns the new hypotheses [N] (slot j·B + b: the j-th of b).
std::vector<Hyp> BeamSearchHelper::ExtendAndSelect(const StepInputs& in,
                                                   const std::vector<bool>& skip,
                                                   const BeamSearchState& state,
                                                   std::vector<Terminal>* terminals) const {
  const int64_t b_n = in.num_beams, n = in.num_hyps, k = num_hyps_per_beam_;
  const double* cum = state.cumulative_scores.data_ptr<double>();
  std::vector<HypTopK> merged(
      b_n, HypTopK(k, merge_paths_ ? eoc_id_ : -1, merged_topk_buffer_size_factor_));
  terminals->assign(n, Terminal{});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i % b_n;
    if ((in.first && i >= b_n) || skip[b] || cum[i] == kNegInf) continue;
    std::vector<Hyp> entries = ParentExtensions(
        in, i, cum[i], eoc_id_ >= 0 ? PrevLabels(state, in.t, i, eoc_id_) : std::vector<int64_t>{});
    if (entries.empty()) continue;
    const double eos_threshold = entries.front().global_score - valid_eos_max_logit_delta_;
    for (const Hyp& e : entries) {
      const bool passes = e.global_score > eos_threshold && e.local_score > local_eos_threshold_;
      if (e.word_id == eos_id_) {
        if (in.last || passes) (*terminals)[i] = Terminal{true, e, eos_id_};
      } else if (eoc_id_ >= 0 && in.last_chunk[i] && e.word_id == eoc_id_) {
        if (passes && (allow_empty_terminated_hyp_ || !e.prev_labels.empty())) {
          (*terminals)[i] = Terminal{true, e, eoc_id_};
        }
      } else {
        merged[b].Add(e);
      }
    }
  }
  std::vector<Hyp> top_k(n);
  for (int64_t b = 0; b < b_n; ++b) {
    if (skip[b]) continue;
    std::vector<Hyp> items = merged[b].Get();
    std::sort(items.begin(), items.end(), HigherScore);
    for (int64_t j = 0; j < k; ++j) {
      top_k[j * b_n + b] = j < static_cast<int64_t>(items.size()) ? items[j] : DeadHyp(b, eos_id_);
    }
  }
  return top_k;
}

// Lingvo's AssembleDoneHypProto: the parent's path through rows t-1..0, then the terminal token.
Hypothesis BeamSearchHelper::AssembleDoneHyp(const Terminal& term, const StepInputs& in,
                                             const BeamSearchState& state) const {
  const int64_t t = in.t, n = in.num_hyps, s_len = in.source_len;
  const int64_t* hyps = state.hyps.data_ptr<int64_t>();
  const int64_t* prev = state.prev_hyps.data_ptr<int64_t>();
  const double* scores = state.scores.data_ptr<double>();
  const float* atten = state.atten_probs.data_ptr<float>();
  std::vector<int64_t> path(t);
  for (int64_t s = t - 1, slot = term.hyp.hyp_id; s >= 0; --s) {
    path[s] = slot;
    slot = prev[s * n + slot];
  }
  // Under merge_paths the hypothesis stands for several paths: each step gets the average.
  const double average = term.hyp.global_score / static_cast<double>(t + 1);
  Hypothesis h;
  h.beam_id = term.hyp.beam_id;
  for (int64_t s = 0; s < t; ++s) {
    const int64_t at_s = s * n + path[s];
    h.ids.push_back(hyps[at_s]);
    h.scores.push_back(merge_paths_ ? average : scores[at_s]);
    if (atten_vecs_in_hypothesis_protos_) {
      h.atten_vecs.emplace_back(atten + at_s * s_len, atten + (at_s + 1) * s_len);
    }
  }
  h.ids.push_back(term.symbol);
  h.scores.push_back(merge_paths_ ? average : term.hyp.local_score);
  if (atten_vecs_in_hypothesis_protos_) {
    const float* row = in.atten.data_ptr<float>() + term.hyp.hyp_id * s_len;
    h.atten_vecs.emplace_back(row, row + s_len);
  }
  return h;
}

void BeamSearchHelper::WriteStep(const StepInputs& in, const std::vector<bool>& skip,
                                 const std::vector<Hyp>& top_k,
                                 const std::vector<Terminal>& terminals,
                                 BeamSearchState* state) const {
  const int64_t t = in.t, n = in.num_hyps, s_len = in.source_len;
  double* best = state->best_scores.data_ptr<double>();
  double* cum = state->cumulative_scores.data_ptr<double>();
  double* scores = state->scores.data_ptr<double>() + t * n;
  int64_t* hyps = state->hyps.data_ptr<int64_t>() + t * n;
  int64_t* prev = state->prev_hyps.data_ptr<int64_t>() + t * n;
  float* atten = state->atten_probs.data_ptr<float>() + t * n * s_len;
  const float* atten_in = in.atten.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i % in.num_beams;
    if (skip[b]) {
      // A source terminate_beams_independently has finished: its slots stay where they are.
      hyps[i] = eos_id_;
      prev[i] = i;
      scores[i] = 0;
      std::fill(atten + i * s_len, atten + (i + 1) * s_len, 0.0f);
      continue;
    }
    const Hyp& h = top_k[i];
    scores[i] = h.local_score;
    cum[i] = h.global_score;
    hyps[i] = h.word_id;
    prev[i] = h.hyp_id;
    std::copy(atten_in + h.hyp_id * s_len, atten_in + (h.hyp_id + 1) * s_len, atten + i * s_len);
    if (terminals[i].valid) {
      best[b] = std::max(best[b], terminals[i].hyp.global_score);
      state->done_hyps[t][i] = AssembleDoneHyp(terminals[i], in, *state);
    }
  }
}

// Lingvo's UpdateAllDone (op version 2): a source is done (and stays done) once every live
// hypothesis is at least beam_size below its best terminated one, and, with ensure_full_beam,
// num_hyps_per_beam hypotheses have terminated.
void BeamSearchHelper::UpdateDone(int64_t t, BeamSearchState* state) const {
  const int64_t b_n = state->best_scores.size(0), k = num_hyps_per_beam_;
  const double* best = state->best_scores.data_ptr<double>();
  const double* cum = state->cumulative_scores.data_ptr<double>();
  bool* done = state->beam_done.data_ptr<bool>();
  for (int64_t b = 0; b < b_n; ++b) {
    if (done[b]) continue;
    if (ensure_full_beam_) {
      int64_t finished = 0;
      for (int64_t s = 0; s <= t; ++s) {
        for (int64_t j = 0; j < k; ++j)
          finished += state->done_hyps[s][j * b_n + b].empty() ? 0 : 1;
      }
      if (finished < k) continue;
    }
    bool below = true;
    for (int64_t j = 0; j < k; ++j) below = below && !(cum[j * b_n + b] > best[b] - beam_size_);
    done[b] = below;
  }
  state->all_done = std::all_of(done, done + b_n, [](bool d) { return d; });
}

void BeamSearchHelper::Step(int64_t t, const at::Tensor& log_probs, const at::Tensor& atten_probs,
                            const at::Tensor& is_last_chunk, BeamSearchState* state) const {
  StepLive(t, log_probs, atten_probs, is_last_chunk, nullptr, state);
}

void BeamSearchHelper::StepLive(int64_t t, const at::Tensor& log_probs,
                                const at::Tensor& atten_probs, const at::Tensor& is_last_chunk,
                                const std::vector<int64_t>* live, BeamSearchState* state) const {
  const StepInputs in = CheckStepInputs(t, log_probs, atten_probs, is_last_chunk, *state, live);
  std::vector<bool> skip(in.num_beams, false);
  if (terminate_beams_independently_) {
    for (int64_t b = 0; b < in.num_beams; ++b) skip[b] = state->beam_done[b].item<bool>();
  }
  std::vector<Terminal> terminals;
  const std::vector<Hyp> top_k = ExtendAndSelect(in, skip, *state, &terminals);
  WriteStep(in, skip, top_k, terminals, state);
  UpdateDone(t, state);
  state->num_steps = std::max(state->num_steps, t + 1);
}

}  // namespace glossa
