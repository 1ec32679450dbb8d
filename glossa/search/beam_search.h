// Decoding searches over a step function (Lingvo's beam_search_helper): BeamSearchHelper with
// Lingvo's Params and the semantics of its BeamSearchStepV2 and TopKTerminatedHyps ops, and greedy
// and sampling decoders on the same interface.
//
//   auto p = BeamSearchHelper::Params();
//   p.Set("num_hyps_per_beam", 4).Set("target_seq_len", 64).Set("length_normalization", 0.6);
//   auto beam = InstantiateLayer<BeamSearchHelper>(p);
//   // step(ids [N], t, states) -> (log_probs [N, V], new states); N = num_hyps_per_beam · B and
//   // hypothesis h = i · B + b belongs to source b.
//   SearchResult r = beam->Search(B, decoder->InitDecodeStates(N), step);
//   r.topk_ids[b][k]  // the k-th best hypothesis of source b, </s> included
//
// BeamSearchDecode returns more: the best hypotheses with their per-step scores and attention
// (Hypothesis), and the search's per-step state (BeamSearchState: best_scores, the cumulative
// scores, beam_done, every terminated hypothesis). Step runs one step on a state the caller holds,
// as Lingvo's op does. The step function may add to its new states "atten_probs" [N, S] (the
// attention that produced the log-probs: needed by coverage_penalty) and "is_last_chunk" [N] bool
// (an epsilon-emitting model at the end of its input: there the end-of-chunk token target_eoc_id
// ends a hypothesis, as </s> does); the search removes both before reordering the states.
//
// Where Glossa differs from Lingvo's op (tests in tests/search/beam_search_step_test.cc and
// beam_search_test.cc; docs/mt.md):
// - A hypothesis whose every log-prob is NaN is InvalidArgumentError ("no finite log-prob ... is the
//   model producing NaNs?"); Lingvo raises InternalError ("No entries in TopK"). The fault is in
//   the caller's model, which Glossa's errors (base/errors.h) report as bad input, not as a bug of
//   the search. NaN and -inf log-probs are never candidates (Lingvo lets -inf ones in).
// - A source with fewer live extensions than slots gets dead slots (score -inf, token </s>) where
//   Lingvo writes zeros (a score of 0 that looks like the best); a finished source that
//   terminate_beams_independently skips keeps its slots in place (prev_hyps[t][i] = i, token </s>).
// - Scores accumulate in float64 (Lingvo: float32), and merge_paths fills its merging buffer in a
//   fixed order, parents by index; Lingvo's threads make the order, and so which duplicates its
//   buffer drops, vary from run to run.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "glossa/layers/base_layer.h"
#include "glossa/search/beam_search_outputs.h"
#include "glossa/search/beam_search_top_k.h"

namespace glossa {

// ids [N] int64 (the previous token of each hypothesis), step t, states -> (log-probs [N, V],
// new states). Every tensor of the states has the hypotheses along dim 0; a search reorders them.
// Under drop_finished_sources (with terminate_beams_independently) N shrinks as sources finish:
// the step function then reads its sources from its states (a "per_source" entry, GatherStates:
// one row per source still running, row j·B' + q reading source q), never from a fixed batch.
using DecodeStepFn = std::function<std::pair<at::Tensor, NestedMap>(
    const at::Tensor& ids, int64_t step, const NestedMap& states)>;

class BeamSearchHelper : public BaseLayer {
 public:
  // + num_hyps_per_beam, beam_size, target_seq_len, target_sos_id, target_eos_id, target_eoc_id,
  // length_normalization, coverage_penalty, target_seq_length_ratio, valid_eos_max_logit_delta,
  // local_eos_threshold, force_eos_in_last_step, force_eos_in_top_k,
  // force_last_chunk_eoc_in_top_k, ensure_full_beam, terminate_beams_independently, merge_paths,
  // merged_topk_buffer_size_factor, allow_empty_terminated_hyp, atten_vecs_in_hypothesis_protos,
  // num_hyps_to_return (0: num_hyps_per_beam).
  static glossa::Params Params();
  explicit BeamSearchHelper(const glossa::Params& p);

  // source_lengths [B] (optional): the coverage penalty sums over these source positions only.
  SearchResult Search(int64_t num_beams, NestedMap states, const DecodeStepFn& step,
                      const at::Tensor& source_lengths = {}) const;

  // Search's result, plus topk_hyps [B][K], the step function's last states and the search state.
  BeamSearchDecodeOutput BeamSearchDecode(int64_t num_beams, NestedMap states,
                                          const DecodeStepFn& step,
                                          const at::Tensor& source_lengths = {}) const;

  // A state for num_beams sources over max_steps steps (the last one is where
  // force_eos_in_last_step applies) and source_len attention positions (0: none).
  BeamSearchState InitState(int64_t num_beams, int64_t max_steps, int64_t source_len = 0) const;

  // Step t (Lingvo's BeamSearchStepV2): extends the live hypotheses of `state` by log_probs
  // [N, V]; atten_probs [N, S] and is_last_chunk [N] bool may be undefined (zeros, false). Writes
  // row t of scores, hyps, prev_hyps, atten_probs and done_hyps, and updates best_scores,
  // cumulative_scores, beam_done and all_done.
  void Step(int64_t t, const at::Tensor& log_probs, const at::Tensor& atten_probs,
            const at::Tensor& is_last_chunk, BeamSearchState* state) const;

  // The best num_hyps_to_return (0: num_hyps_per_beam) terminated hypotheses of each source in
  // `state`, normalized with this helper's length_normalization and coverage_penalty.
  HypothesisGrid TopKTerminatedHyps(const BeamSearchState& state,
                                    const at::Tensor& source_lengths = {}) const;

  int64_t num_hyps_per_beam() const { return num_hyps_per_beam_; }

 private:
  struct StepInputs;
  struct Terminal;
  // live: the sources whose hypotheses the step ran on (log_probs [K·|live|, V]; null: all).
  StepInputs CheckStepInputs(int64_t t, const at::Tensor& log_probs, const at::Tensor& atten_probs,
                             const at::Tensor& is_last_chunk, const BeamSearchState& state,
                             const std::vector<int64_t>* live) const;
  void StepLive(int64_t t, const at::Tensor& log_probs, const at::Tensor& atten_probs,
                const at::Tensor& is_last_chunk, const std::vector<int64_t>* live,
                BeamSearchState* state) const;
  std::vector<Hyp> ParentExtensions(const StepInputs& in, int64_t i, double cum,
                                    std::vector<int64_t> prev_labels) const;
  void ForceTerminals(const StepInputs& in, int64_t i, double cum, std::vector<Hyp>* entries) const;
  std::vector<Hyp> ExtendAndSelect(const StepInputs& in, const std::vector<bool>& skip,
                                   const BeamSearchState& state,
                                   std::vector<Terminal>* terminals) const;
  Hypothesis AssembleDoneHyp(const Terminal& term, const StepInputs& in,
                             const BeamSearchState& state) const;
  void WriteStep(const StepInputs& in, const std::vector<bool>& skip, const std::vector<Hyp>& top_k,
                 const std::vector<Terminal>& terminals, BeamSearchState* state) const;
  void UpdateDone(int64_t t, BeamSearchState* state) const;

  int64_t num_hyps_per_beam_, target_seq_len_, sos_id_, eos_id_, eoc_id_, num_hyps_to_return_,
      merged_topk_buffer_size_factor_;
  double beam_size_, length_normalization_, coverage_penalty_, valid_eos_max_logit_delta_,
      local_eos_threshold_, target_seq_length_ratio_;
  bool force_eos_in_last_step_, force_eos_in_top_k_, force_last_chunk_eoc_in_top_k_,
      ensure_full_beam_, terminate_beams_independently_, merge_paths_, allow_empty_terminated_hyp_,
      atten_vecs_in_hypothesis_protos_, drop_finished_sources_;
};

// Greedy (temperature 0) or sampling decoding of one hypothesis per source: at each step the
// argmax, or a draw from softmax(log_probs / temperature) restricted to the top_k tokens
// (top_k 0: all). Stops at </s> or max_len steps. Scores are the hypotheses' log-prob sums.
// Deterministic given `seed`.
SearchResult SampleSearch(int64_t num_beams, NestedMap states, const DecodeStepFn& step,
                          int64_t max_len, int64_t sos_id, int64_t eos_id, double temperature,
                          int64_t top_k, uint64_t seed);

// Reorders every tensor of `states` along dim 0 by `index` [N] (int64), except those under a key
// named "unordered": caches every hypothesis reads through its own row table, which is reordered
// instead (MultiHeadedAttention's k/v caches, glossa/kernels/step_attention.h); and those under a
// key named "per_source": one row per source (an encoder's keys and values, one copy that each
// hypothesis h of the N = K·B reads as row h % B), which a search's reordering within each source
// leaves valid. They take `source_index` [B''] (the sources that stay, as rows of the B) when
// given (a search dropping finished sources), else stay.
NestedMap GatherStates(const NestedMap& states, const at::Tensor& index,
                       const at::Tensor& source_index = {});

}  // namespace glossa
