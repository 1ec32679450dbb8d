// What a beam search returns, and Lingvo's helpers over it: the terminated Hypothesis
// (hyps.proto), the per-step state a BeamSearchHelper::Step call updates (Lingvo's core beam
// search states), and the equivalents of the TopKTerminatedHyps, UnpackHyp,
// HypsFromBeamSearchOuts and TopKFromBeamSearchOuts ops and of MergeBeamSearchOutputs.
//
//   BeamSearchDecodeOutput a = beam_a->BeamSearchDecode(B, states_a, step_a);
//   BeamSearchDecodeOutput b = beam_b->BeamSearchDecode(B, states_b, step_b);
//   BeamSearchDecodeOutput best = MergeBeamSearchOutputs(/*max_hyps_per_beam=*/4, {a, b});
//
// Layout: hypothesis slot h = k·B + b belongs to source (beam) b; topk tensors are [B, K, ...].
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "glossa/core/nested_map.h"

namespace glossa {

struct SearchResult {
  at::Tensor topk_ids;     // [B, K, T] int64, T the longest hypothesis; past a length: 0
  at::Tensor topk_lens;    // [B, K] int64, </s> included when the hypothesis ended with it
  at::Tensor topk_scores;  // [B, K] float64: the normalized score (beam), or the log-prob sum
};

// One terminated hypothesis (Lingvo's Hypothesis proto). An empty one (beam_id -1) stands for
// Lingvo's empty string: no hypothesis ended there.
struct Hypothesis {
  int64_t beam_id = -1;
  std::vector<int64_t> ids;    // the tokens, the terminal one (</s> or the end-of-chunk) last
  std::vector<double> scores;  // each token's log-prob; under merge_paths each is the average,
                               // the hypothesis' score / its length (the merged paths differ)
  std::vector<std::vector<float>> atten_vecs;  // each token's attention over the source
  double normalized_score = 0;                 // set by TopKTerminatedHyps / TopKFromBeamSearchOuts
  bool empty() const { return beam_id < 0; }
};

// Rows [T][N] of hypotheses, or [B][K] of the best ones.
using HypothesisGrid = std::vector<std::vector<Hypothesis>>;

// The state carried from one beam search step to the next (Lingvo's core_bs_states), readable
// after each BeamSearchHelper::Step. B sources, N = K·B slots, T steps, S source positions.
struct BeamSearchState {
  at::Tensor best_scores;        // [B] float64: the best terminated score so far (-1e36: none)
  at::Tensor cumulative_scores;  // [N] float64: each live hypothesis' log-prob (-inf: dead slot)
  at::Tensor scores;             // [T, N] float64: the log-prob of the token chosen at each step
  at::Tensor hyps;               // [T, N] int64: the token of slot i at step t
  at::Tensor prev_hyps;          // [T, N] int64: the slot at step t-1 that slot i extended
  HypothesisGrid done_hyps;      // [T][N]: the hypothesis slot i (at t-1) ended at step t
  at::Tensor atten_probs;        // [T, N, S] float64: the attention that produced hyps[t][i]
  at::Tensor beam_done;          // [B] bool: the source has met the stopping test (sticky)
  bool all_done = false;         // every source is done
  int64_t num_steps = 0;         // steps run
};

struct BeamSearchDecodeOutput : SearchResult {
  HypothesisGrid topk_hyps;      // [B][K], best first; empty past the terminated ones
  NestedMap other_states;        // the step function's states after the last step
  BeamSearchState search_state;  // the per-step outputs of the search (not set by the helpers)
};

// The best k terminated hypotheses of each source, with normalized_score set: the sum of the
// scores / ((5 + |Y|) / 5)^length_normalization + r·β·Σ_j log(clip(Σ_t atten_tj / r, 0.001, 0.5))
// over the source's first src_seq_lengths[b] positions (a missing one counts 0); src_seq_lengths
// undefined: every position of the attention. Ordered by normalized score, then shorter, then by
// step and slot (Lingvo leaves that last tie to its threads).
HypothesisGrid TopKTerminatedHyps(const HypothesisGrid& done_hyps,
                                  const at::Tensor& src_seq_lengths, int64_t k,
                                  int64_t num_hyps_per_beam, double length_normalization,
                                  double coverage_penalty, double target_seq_length_ratio);

// [B][K] hypotheses -> ids [B, K, L], lens [B, K], scores (normalized_score) [B, K], truncated to
// max_seq_length tokens (0: the longest hypothesis).
SearchResult UnpackHyp(const HypothesisGrid& hyps, int64_t max_seq_length);

// The tensors a batched beam search keeps (the inputs of Lingvo's HypsFromBeamSearchOuts and
// TopKFromBeamSearchOuts), [T, N] unless noted. Slot j at step t holds token hyps[t][j] and
// extends slot prev_hyps[t][j] of step t-1; done_hyps[t][j] says that slot j (at t-1) ended at
// step t with </s> of log-prob eos_scores[t][j].
struct BeamSearchOuts {
  at::Tensor hyps, prev_hyps;    // int64
  at::Tensor done_hyps;          // bool
  at::Tensor cumulative_scores;  // slot j's score after step t (TopKFromBeamSearchOuts)
  at::Tensor eos_scores;
  at::Tensor scores;                  // each token's log-prob (for the Hypothesis scores)
  at::Tensor atten_probs;             // [T, N, S]: each token's attention
  at::Tensor eos_atten_probs;         // [T, N, S]: the attention of each </s>
  at::Tensor cumulative_atten_probs;  // [T, N, S]: the sum along the ended hypothesis
};

// A Hypothesis for every done (t, j) ([T][N], the rest empty): the path back through prev_hyps,
// </s> appended. normalized_score is left 0.
HypothesisGrid HypsFromBeamSearchOuts(const BeamSearchOuts& outs, int64_t eos_id,
                                      int64_t num_hyps_per_beam);

struct TopKFromBeamSearchOutsOptions {
  int64_t num_hyps_per_beam = 0;
  int64_t max_seq_length = 0;  // columns of topk_ids
  int64_t eos_id = 2;
  double length_normalization = 0;
  double coverage_penalty = 0;  // reads cumulative_atten_probs
  double target_seq_length_ratio = 1;
  bool populate_topk_hyps = false;  // also fill topk_hyps (reads scores and the attentions)
};

// The best K done hypotheses of each source straight from the tensors: score = eos_scores[t][j]
// + cumulative_scores[t-1][j], normalized as in TopKTerminatedHyps with |Y| = t + 1 and the
// coverage of cumulative_atten_probs[t][j]. Equals HypsFromBeamSearchOuts + TopKTerminatedHyps
// + UnpackHyp.
BeamSearchDecodeOutput TopKFromBeamSearchOuts(const BeamSearchOuts& outs,
                                              const TopKFromBeamSearchOutsOptions& options);

// The best max_hyps_per_beam hypotheses of each source over several searches of the same sources
// (e.g. several models), by topk_scores (a hypothesis of length 0 counts -1e6; ties: the earlier
// output and slot first). topk_hyps are merged when every output has them; other_states are the
// first output's.
BeamSearchDecodeOutput MergeBeamSearchOutputs(int64_t max_hyps_per_beam,
                                              const std::vector<BeamSearchDecodeOutput>& outputs);

}  // namespace glossa
