#include "glossa/search/fusion.h"

#include <ATen/ATen.h>

namespace glossa {

FusedScorer CtcJoin(const CtcPrefixScorer& ctc) {
  return {"ctc_prefix", [&ctc](int64_t n) { return ctc.InitStates(n); },
          [&ctc](const at::Tensor& ids, int64_t, const at::Tensor& log_probs,
                 const NestedMap& states) { return ctc.Step(ids, log_probs, states); }};
}

FusedScorer LmShallowFusion(std::function<NestedMap(int64_t)> lm_init_states, LmStepFn lm_step,
                            double weight) {
  return {"lm_fusion", std::move(lm_init_states),
          [lm_step = std::move(lm_step), weight](const at::Tensor& ids, int64_t step,
                                                 const at::Tensor& log_probs,
                                                 const NestedMap& states) {
            auto [lm_log_probs, lm_states] = lm_step(ids, step, states);
            return std::make_pair(log_probs + weight * lm_log_probs, std::move(lm_states));
          }};
}

FusedScorer LexiconMask(const LexiconConstraint& lexicon) {
  return {"lexicon", [&lexicon](int64_t n) { return lexicon.InitStates(n); },
          [&lexicon](const at::Tensor& ids, int64_t, const at::Tensor& log_probs,
                     const NestedMap& states) { return lexicon.Step(ids, log_probs, states); }};
}

DecodeStepFn FuseScorers(DecodeStepFn decoder_step, std::vector<FusedScorer> scorers) {
  if (scorers.empty()) return decoder_step;
  return [decoder_step = std::move(decoder_step), scorers = std::move(scorers)](
             const at::Tensor& ids, int64_t step, const NestedMap& states) {
    NestedMap dec_states = states;
    for (const auto& s : scorers) dec_states.erase(s.key);
    auto [log_probs, new_states] = decoder_step(ids, step, dec_states);
    for (const auto& s : scorers) {
      auto [adjusted, scorer_states] =
          s.adjust(ids, step, log_probs, states.GetItem(s.key).AsMap());
      log_probs = adjusted;
      new_states.Put(s.key, std::move(scorer_states));
    }
    return std::make_pair(log_probs, new_states);
  };
}

NestedMap FuseInitStates(NestedMap decoder_states, const std::vector<FusedScorer>& scorers,
                         int64_t num_hyps) {
  for (const auto& s : scorers) decoder_states.Put(s.key, s.init_states(num_hyps));
  return decoder_states;
}

}  // namespace glossa
