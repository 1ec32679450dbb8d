// Joint scoring and shallow fusion in a decoder's search (Lingvo's asr fusion, ESPnet's
// scorers): each step's decoder log-probs are adjusted by the scorers in order, and each
// scorer's states ride with the decoder's under its own key.
//
//   std::vector<FusedScorer> scorers = {CtcJoin(ctc),                           // "ctc_prefix"
//                                       LmShallowFusion(lm_init, lm_step, 0.3),  // "lm_fusion"
//                                       LexiconMask(lexicon)};                   // "lexicon"
//   DecodeStepFn step = FuseScorers(decoder_step, scorers);
//   NestedMap states = FuseInitStates(decoder.InitDecodeStates(n), scorers, n);
//   SearchResult r = beam.Search(batch, states, step, ...);
//
// CTC first (joint CTC/attention decoding: (1 − w)·log p_att + w·Δctc), then the language model
// (log p + weight·log p_lm; Gulcehre et al. 2015), then the lexicon (tokens that would spell a
// word outside the word list masked), as the speech model orders them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "glossa/core/nested_map.h"
#include "glossa/search/beam_search.h"
#include "glossa/search/ctc_prefix_score.h"
#include "glossa/search/lexicon.h"

namespace glossa {

struct FusedScorer {
  std::string key;  // where its states ride in the search states
  std::function<NestedMap(int64_t num_hyps)> init_states;
  // (ids [N] of the last step, step, the log-probs so far [N, V], its states) -> (the adjusted
  // log-probs, its new states).
  std::function<std::pair<at::Tensor, NestedMap>(const at::Tensor&, int64_t, const at::Tensor&,
                                                 const NestedMap&)>
      adjust;
};

// The CTC prefix scores joined with the attention log-probs (CtcPrefixScorer::Step).
FusedScorer CtcJoin(const CtcPrefixScorer& ctc);
// A language model's next-token log-probs times `weight`, added (shallow fusion): `lm_step` is
// the model's incremental step (ids, step, states) -> (log-probs [N, V], states).
using LmStepFn = std::function<std::pair<at::Tensor, NestedMap>(const at::Tensor&, int64_t,
                                                                const NestedMap&)>;
FusedScorer LmShallowFusion(std::function<NestedMap(int64_t)> lm_init_states, LmStepFn lm_step,
                            double weight);
// Tokens that would spell a word outside the lexicon masked (LexiconConstraint::Step).
FusedScorer LexiconMask(const LexiconConstraint& lexicon);

// The decoder's step with the scorers applied in order (the step itself without scorers).
DecodeStepFn FuseScorers(DecodeStepFn decoder_step, std::vector<FusedScorer> scorers);
// The decoder's initial states with each scorer's under its key.
NestedMap FuseInitStates(NestedMap decoder_states, const std::vector<FusedScorer>& scorers,
                         int64_t num_hyps);

}  // namespace glossa
