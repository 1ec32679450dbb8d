// Decoding searches over a step function (Lingvo's beam_search_helper): BeamSearchHelper with
// Lingvo's Params and the semantics of its BeamSearchStep and TopKTerminatedHyps ops, and greedy
// and sampling decoders on the same interface.
//
//   auto p = BeamSearchHelper::Params();
//   p.Set("num_hyps_per_beam", 4).Set("target_seq_len", 64).Set("length_normalization", 0.6);
//   auto beam = InstantiateLayer<BeamSearchHelper>(p);
//   // step(ids [N], t, states) -> (log_probs [N, V], new states); N = num_hyps_per_beam · B and
//   // hypothesis h = i · B + b belongs to source b.
//   SearchResult r = beam->Search(B, decoder->InitDecodeStates(N), step);
//   r.topk_ids[b][k]  // the k-th best hypothesis of source b, </s> included
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "glossa/layers/base_layer.h"

namespace glossa {

// ids [N] int64 (the previous token of each hypothesis), step t, states -> (log-probs [N, V],
// new states). Every tensor of the states has the hypotheses along dim 0; a search reorders them.
using DecodeStepFn = std::function<std::pair<at::Tensor, NestedMap>(
    const at::Tensor& ids, int64_t step, const NestedMap& states)>;

struct SearchResult {
  at::Tensor topk_ids;     // [B, K, T] int64, T the longest hypothesis; past a length: 0
  at::Tensor topk_lens;    // [B, K] int64, </s> included when the hypothesis ended with it
  at::Tensor topk_scores;  // [B, K] float64: the normalized score (beam), or the log-prob sum
};

class BeamSearchHelper : public BaseLayer {
 public:
  // + num_hyps_per_beam, beam_size, target_seq_len, target_sos_id, target_eos_id,
  // length_normalization, coverage_penalty, valid_eos_max_logit_delta, local_eos_threshold,
  // force_eos_in_last_step, ensure_full_beam, merge_paths, allow_empty_terminated_hyp,
  // target_eoc_id (merge_paths' epsilon), num_hyps_to_return (0: num_hyps_per_beam).
  static glossa::Params Params();
  explicit BeamSearchHelper(const glossa::Params& p);

  // source_lengths [B] (optional): the coverage penalty sums over these source positions only.
  SearchResult Search(int64_t num_beams, NestedMap states, const DecodeStepFn& step,
                      const at::Tensor& source_lengths = {}) const;

  int64_t num_hyps_per_beam() const { return num_hyps_per_beam_; }

 private:
  int64_t num_hyps_per_beam_, target_seq_len_, sos_id_, eos_id_, eoc_id_, num_hyps_to_return_;
  double beam_size_, length_normalization_, coverage_penalty_, valid_eos_max_logit_delta_,
      local_eos_threshold_, target_seq_length_ratio_;
  bool force_eos_in_last_step_, ensure_full_beam_, merge_paths_, allow_empty_terminated_hyp_;
};

// Greedy (temperature 0) or sampling decoding of one hypothesis per source: at each step the
// argmax, or a draw from softmax(log_probs / temperature) restricted to the top_k tokens
// (top_k 0: all). Stops at </s> or max_len steps. Scores are the hypotheses' log-prob sums.
// Deterministic given `seed`.
SearchResult SampleSearch(int64_t num_beams, NestedMap states, const DecodeStepFn& step,
                          int64_t max_len, int64_t sos_id, int64_t eos_id, double temperature,
                          int64_t top_k, uint64_t seed);

// Reorders every tensor of `states` along dim 0 by `index` [N] (int64).
NestedMap GatherStates(const NestedMap& states, const at::Tensor& index);

}  // namespace glossa
