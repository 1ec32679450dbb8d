#include "glossa/search/beam_search.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"

namespace glossa {

namespace {

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
  p.Define("drop_finished_sources", true,
           "With terminate_beams_independently, a finished source leaves the batch: the step "
           "function then runs on the hypotheses of the sources still in the batch only "
           "(hypothesis j·B' + b' of those B', in source order): finished sources leave once a "
           "quarter of the batch's have finished, the states compacted (GatherStates with "
           "source_index). The step function must then read every per-source input from "
           "its states (one row per source, read by row j·B' + q), as CTranslate2's and Marian's "
           "decoders do. "
           "False: every source's hypotheses are computed until all sources are done. (The MT "
           "and speech decoders' search joined with CTC prefix scores keeps every source: the "
           "scorer reads its frames by hypothesis index.)");
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
  drop_finished_sources_ = p.GetBool("drop_finished_sources");
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


HypothesisGrid BeamSearchHelper::TopKTerminatedHyps(const BeamSearchState& state,
                                                    const at::Tensor& source_lengths) const {
  const int64_t k = num_hyps_to_return_ > 0 ? num_hyps_to_return_ : num_hyps_per_beam_;
  return glossa::TopKTerminatedHyps(state.done_hyps, source_lengths, k, num_hyps_per_beam_,
                                    length_normalization_, coverage_penalty_,
                                    target_seq_length_ratio_);
}

NestedMap GatherStates(const NestedMap& states, const at::Tensor& index,
                       const at::Tensor& source_index) {
  return states.TransformWithKey([&](const std::string& key, const NestedValue& v) -> NestedValue {
    if (!v.is_tensor()) return v;
    // Caches read through row tables (glossa/kernels/step_attention.h) stay where they are.
    const std::string path = "." + key + ".";
    if (path.find(".unordered.") != std::string::npos) return v;
    if (path.find(".per_source.") != std::string::npos) {
      return source_index.defined() ? v.AsTensor().index_select(0, source_index) : v;
    }
    return v.AsTensor().index_select(0, index);
  });
}

namespace {

// The next step's rows after step t: for each row r = j·B'' + q of the sources `next` (B'' of
// them), the row of its parent among the rows the step ran on (`live`, B' sources) and its token;
// and for each source q of `next`, its place in `live` (the row of its per_source copy).
struct NextRows {
  at::Tensor parents, sources, ids;
};
NextRows Rows(const BeamSearchState& state, int64_t t, int64_t num_beams,
              const std::vector<int64_t>& live, const std::vector<int64_t>& next) {
  const int64_t n = state.hyps.size(1), k = n / num_beams;
  const int64_t b_live = static_cast<int64_t>(live.size()), b_next = static_cast<int64_t>(next.size());
  std::vector<int64_t> place(num_beams, -1);
  for (int64_t q = 0; q < b_live; ++q) place[live[q]] = q;
  const int64_t* prev = state.prev_hyps.data_ptr<int64_t>() + t * n;
  const int64_t* hyps = state.hyps.data_ptr<int64_t>() + t * n;
  NextRows out;
  out.parents = at::empty({k * b_next}, at::kLong);
  out.sources = at::empty({b_next}, at::kLong);
  out.ids = at::empty({k * b_next}, at::kLong);
  int64_t* parents = out.parents.data_ptr<int64_t>();
  int64_t* sources = out.sources.data_ptr<int64_t>();
  int64_t* ids = out.ids.data_ptr<int64_t>();
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t q = 0; q < b_next; ++q) {
      const int64_t b = next[q], h = j * num_beams + b, r = j * b_next + q;
      const int64_t parent = prev[h];  // a hypothesis of source b: parent % B == b
      parents[r] = (parent / num_beams) * b_live + place[b];
      if (j == 0) sources[q] = place[b];
      ids[r] = hyps[h];
    }
  }
  return out;
}

}  // namespace

BeamSearchDecodeOutput BeamSearchHelper::BeamSearchDecode(int64_t num_beams, NestedMap states,
                                                          const DecodeStepFn& step,
                                                          const at::Tensor& source_lengths) const {
  if (num_beams < 1) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': num_beams must be >= 1"));
  }
  const int64_t n = num_hyps_per_beam_ * num_beams;
  const bool drop = terminate_beams_independently_ && drop_finished_sources_;
  at::Tensor ids = at::full({n}, sos_id_, at::kLong);
  // The sources the step function runs on, in order: all of them until one finishes (drop).
  std::vector<int64_t> live(num_beams);
  std::iota(live.begin(), live.end(), 0);
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
    StepLive(t, log_probs, atten, last_chunk, &live, &state);
    std::vector<int64_t> next = live;
    if (drop) {
      // Sources leave once a quarter of those in the batch have finished: each compaction copies
      // the states' rows, and this way the copies add up to about 4/3 of one batch's states
      // (a geometric series) while at most a quarter of the rows computed are finished ones.
      const bool* done = state.beam_done.data_ptr<bool>();
      const auto finished = std::count_if(live.begin(), live.end(), [&](int64_t b) { return done[b]; });
      if (finished > 0 && 4 * finished >= static_cast<int64_t>(live.size())) {
        next.erase(std::remove_if(next.begin(), next.end(), [&](int64_t b) { return done[b]; }),
                   next.end());
      }
    }
    if (next.size() == live.size()) {
      // Every source that ran stays: the parents of the rows, as Lingvo's search reorders.
      const NextRows rows = Rows(state, t, num_beams, live, live);
      states = GatherStates(new_states, rows.parents);
      ids = rows.ids;
    } else if (!next.empty()) {
      const NextRows rows = Rows(state, t, num_beams, live, next);
      states = GatherStates(new_states, rows.parents, rows.sources);
      ids = rows.ids;
      live = std::move(next);
    } else {
      states = std::move(new_states);
    }
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
