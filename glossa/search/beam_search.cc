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

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kMinScore = -1e36;  // Lingvo's best score before any hypothesis has ended

// NaN and -inf log-probs never make a candidate.
bool IsCandidate(float log_prob) {
  return !std::isnan(log_prob) && log_prob != -std::numeric_limits<float>::infinity();
}

// Removes `key` from `states` and returns its tensor (undefined when absent).
at::Tensor TakeTensor(NestedMap* states, const std::string& key) {
  if (!states->contains(key)) return {};
  at::Tensor v = states->GetTensor(key);
  states->erase(key);
  return v;
}

}  // namespace

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
           "End-of-chunk (epsilon) token of an epsilon-emitting model (RNN-T, NT); -1: none. "
           "Where the step function's is_last_chunk is set it ends a hypothesis as </s> does; "
           "merge_paths ignores it when comparing hypotheses.");
  p.Define("length_normalization", 0.0,
           "α of the length normalization score / ((5 + |Y|) / 5)^α, |Y| counting </s> "
           "(Lingvo's formula).");
  p.Define("coverage_penalty", 0.0,
           "β of the coverage penalty r·β·Σ_j log(clip(Σ_t attention_tj / r, 0.001, 0.5)); needs "
           "a step function that returns atten_probs.");
  p.Define("target_seq_length_ratio", 1.0, "r of the coverage penalty.");
  p.Define("valid_eos_max_logit_delta", 5.0,
           "</s> (or the last chunk's end-of-chunk) ends a hypothesis only when its log-prob is "
           "within this of the best extension of the same hypothesis.");
  p.Define("local_eos_threshold", -100.0,
           "</s> (or the last chunk's end-of-chunk) ends a hypothesis only when its own log-prob "
           "is above this.");
  p.Define("force_eos_in_last_step", false,
           "At the last step every hypothesis ends with </s>, whatever its log-prob.");
  p.Define("force_eos_in_top_k", false,
           "</s> always counts among a hypothesis' top extensions (in place of the last one), so "
           "that it can end the hypothesis; valid_eos_max_logit_delta and local_eos_threshold "
           "still apply.");
  p.Define("force_last_chunk_eoc_in_top_k", false,
           "Where is_last_chunk is set, target_eoc_id always counts among a hypothesis' top "
           "extensions (in place of the second-to-last one), so that it can end the hypothesis; "
           "the two thresholds still apply. Not with force_eos_in_top_k.");
  p.Define("ensure_full_beam", false,
           "A source is not done before num_hyps_per_beam hypotheses have finished.");
  p.Define("terminate_beams_independently", false,
           "Each source stops by itself once done (its hypotheses are no longer extended); "
           "False: every source runs until all are done.");
  p.Define("merge_paths", false,
           "Merge hypotheses equal once target_eoc_id tokens are removed (log-sum-exp of their "
           "scores); needs target_eoc_id >= 0.");
  p.Define("merged_topk_buffer_size_factor", 2,
           "merge_paths: a source's buffer holds this many times num_hyps_per_beam extensions "
           "before it keeps the best num_hyps_per_beam; a duplicate refused or dropped then is "
           "not merged. num_hyps_per_beam + 2 or more merges every pair.");
  p.Define("allow_empty_terminated_hyp", true,
           "A hypothesis of only end-of-chunk tokens may end at the last chunk.");
  p.Define("atten_vecs_in_hypothesis_protos", true,
           "Terminated hypotheses keep each step's attention (Hypothesis.atten_vecs); False saves "
           "memory and needs coverage_penalty 0.");
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
  target_seq_length_ratio_ = p.GetFloat("target_seq_length_ratio");
  valid_eos_max_logit_delta_ = p.GetFloat("valid_eos_max_logit_delta");
  local_eos_threshold_ = p.GetFloat("local_eos_threshold");
  force_eos_in_last_step_ = p.GetBool("force_eos_in_last_step");
  force_eos_in_top_k_ = p.GetBool("force_eos_in_top_k");
  force_last_chunk_eoc_in_top_k_ = p.GetBool("force_last_chunk_eoc_in_top_k");
  ensure_full_beam_ = p.GetBool("ensure_full_beam");
  terminate_beams_independently_ = p.GetBool("terminate_beams_independently");
  merge_paths_ = p.GetBool("merge_paths");
  merged_topk_buffer_size_factor_ = p.GetInt("merged_topk_buffer_size_factor");
  allow_empty_terminated_hyp_ = p.GetBool("allow_empty_terminated_hyp");
  atten_vecs_in_hypothesis_protos_ = p.GetBool("atten_vecs_in_hypothesis_protos");
  num_hyps_to_return_ = p.GetInt("num_hyps_to_return");
  auto fail = [&](const std::string& what) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': ", what));
  };
  if (num_hyps_per_beam_ < 1)
    fail(StrCat("num_hyps_per_beam must be >= 1, got ", num_hyps_per_beam_));
  if (target_seq_len_ < 1) fail(StrCat("target_seq_len must be >= 1, got ", target_seq_len_));
  if (length_normalization_ < 0) fail("length_normalization must be >= 0");
  if (coverage_penalty_ < 0) fail("coverage_penalty must be >= 0");
  if (merge_paths_ && eoc_id_ < 0) fail("merge_paths needs target_eoc_id >= 0");
  if (num_hyps_to_return_ < 0 || num_hyps_to_return_ > num_hyps_per_beam_) {
    fail(StrCat("num_hyps_to_return must be in [0, num_hyps_per_beam], got ", num_hyps_to_return_));
  }
  if (!(target_seq_length_ratio_ > 0)) fail("target_seq_length_ratio must be > 0");
  if (force_eos_in_top_k_ && force_last_chunk_eoc_in_top_k_) {
    fail("force_eos_in_top_k and force_last_chunk_eoc_in_top_k cannot both be set (as in Lingvo)");
  }
  if (merged_topk_buffer_size_factor_ < 2) {
    fail(StrCat("merged_topk_buffer_size_factor must be >= 2, got ",
                merged_topk_buffer_size_factor_));
  }
  if (!atten_vecs_in_hypothesis_protos_ && coverage_penalty_ != 0) {
    fail("atten_vecs_in_hypothesis_protos = False needs coverage_penalty 0");
  }
}

// One step's inputs, checked and in the layout the step reads.
struct BeamSearchHelper::StepInputs {
  int64_t t = 0, num_beams = 0, num_hyps = 0, vocab = 0, source_len = 0;
  bool first = false;            // step 0: only slot b of each source is extended
  bool last = false;             // force_eos_in_last_step's last step
  at::Tensor log_probs;          // [N, V] float32, contiguous
  at::Tensor atten;              // [N, S] float32, contiguous
  std::vector<bool> last_chunk;  // [N]
  const float* Row(int64_t i) const { return log_probs.data_ptr<float>() + i * vocab; }
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

BeamSearchHelper::StepInputs BeamSearchHelper::CheckStepInputs(int64_t t,
                                                               const at::Tensor& log_probs,
                                                               const at::Tensor& atten_probs,
                                                               const at::Tensor& is_last_chunk,
                                                               const BeamSearchState& state) const {
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
  if (log_probs.dim() != 2 || log_probs.size(0) != in.num_hyps) {
    fail(StrCat("expected log-probs [", in.num_hyps, ", V], got ", log_probs.sizes()));
  }
  in.log_probs = log_probs.to(at::kFloat).contiguous();
  in.vocab = in.log_probs.size(1);
  if (eos_id_ < 0 || eos_id_ >= in.vocab || eoc_id_ >= in.vocab) {
    fail(StrCat("target_eos_id ", eos_id_, " or target_eoc_id ", eoc_id_,
                " is outside the vocabulary of ", in.vocab));
  }
  if (atten_probs.defined()) {
    if (atten_probs.dim() != 2 || atten_probs.size(0) != in.num_hyps ||
        atten_probs.size(1) != in.source_len) {
      fail(StrCat("expected atten_probs [", in.num_hyps, ", ", in.source_len, "], got ",
                  atten_probs.sizes()));
    }
    in.atten = atten_probs.to(at::kFloat).contiguous();
  } else {
    in.atten = at::zeros({in.num_hyps, in.source_len}, at::kFloat);
  }
  in.last_chunk.assign(in.num_hyps, false);
  if (is_last_chunk.defined()) {
    if (is_last_chunk.numel() != in.num_hyps) {
      fail(StrCat("expected is_last_chunk [", in.num_hyps, "], got ", is_last_chunk.sizes()));
    }
    const at::Tensor flags = is_last_chunk.reshape({-1}).to(at::kBool).contiguous();
    for (int64_t i = 0; i < in.num_hyps; ++i) in.last_chunk[i] = flags.data_ptr<bool>()[i];
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
  const StepInputs in = CheckStepInputs(t, log_probs, atten_probs, is_last_chunk, *state);
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

HypothesisGrid BeamSearchHelper::TopKTerminatedHyps(const BeamSearchState& state,
                                                    const at::Tensor& source_lengths) const {
  const int64_t k = num_hyps_to_return_ > 0 ? num_hyps_to_return_ : num_hyps_per_beam_;
  return glossa::TopKTerminatedHyps(state.done_hyps, source_lengths, k, num_hyps_per_beam_,
                                    length_normalization_, coverage_penalty_,
                                    target_seq_length_ratio_);
}

NestedMap GatherStates(const NestedMap& states, const at::Tensor& index) {
  return states.TransformWithKey([&](const std::string& key, const NestedValue& v) -> NestedValue {
    if (!v.is_tensor()) return v;
    // Caches read through row tables (glossa/kernels/step_attention.h) stay where they are.
    const std::string path = "." + key + ".";
    if (path.find(".unordered.") != std::string::npos) return v;
    return v.AsTensor().index_select(0, index);
  });
}

BeamSearchDecodeOutput BeamSearchHelper::BeamSearchDecode(int64_t num_beams, NestedMap states,
                                                          const DecodeStepFn& step,
                                                          const at::Tensor& source_lengths) const {
  if (num_beams < 1) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': num_beams must be >= 1"));
  }
  const int64_t n = num_hyps_per_beam_ * num_beams;
  at::Tensor ids = at::full({n}, sos_id_, at::kLong);
  BeamSearchState state;
  for (int64_t t = 0; t < target_seq_len_; ++t) {
    auto [log_probs, new_states] = step(ids, t, states);
    const at::Tensor atten = TakeTensor(&new_states, "atten_probs");
    const at::Tensor last_chunk = TakeTensor(&new_states, "is_last_chunk");
    if (coverage_penalty_ > 0 && !atten.defined()) {
      throw FailedPreconditionError(StrCat(
          "layer '", path(), "': coverage_penalty needs a step function that returns atten_probs"));
    }
    if (t == 0) {
      state = InitState(num_beams, target_seq_len_,
                        atten.defined() && atten.dim() == 2 ? atten.size(1) : 0);
    }
    Step(t, log_probs, atten, last_chunk, &state);
    states = GatherStates(new_states, state.prev_hyps[t].clone());
    ids = state.hyps[t].clone();
    if (state.all_done) break;
  }
  BeamSearchDecodeOutput out;
  out.topk_hyps = TopKTerminatedHyps(state, source_lengths);
  int64_t longest = 1;
  for (const auto& row : out.topk_hyps) {
    for (const Hypothesis& h : row) longest = std::max<int64_t>(longest, h.ids.size());
  }
  static_cast<SearchResult&>(out) = UnpackHyp(out.topk_hyps, longest);
  out.other_states = std::move(states);
  out.search_state = std::move(state);
  return out;
}

SearchResult BeamSearchHelper::Search(int64_t num_beams, NestedMap states, const DecodeStepFn& step,
                                      const at::Tensor& source_lengths) const {
  BeamSearchDecodeOutput out = BeamSearchDecode(num_beams, std::move(states), step, source_lengths);
  return static_cast<SearchResult&>(out);
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
    TakeTensor(&new_states, "atten_probs");
    TakeTensor(&new_states, "is_last_chunk");
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
    scores = scores +
             (lp.gather(1, next.unsqueeze(1)).squeeze(1).to(at::kDouble) * live.to(at::kDouble));
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
