// CTC prefix scores for joint CTC/attention beam search (Watanabe et al. 2017, "Hybrid
// CTC/Attention Architecture for End-to-End Speech Recognition", Algorithm 2; ESPnet's
// CTCPrefixScore): the log-probability under a CTC head that the transcript *starts with* a
// hypothesis, updated one token at a time alongside the attention decoder.
//
//   CtcPrefixScorer ctc(log_probs /*[B, T, V+1], blank V*/, lengths, /*weight=*/0.3, sos, eos);
//   SearchResult r = beam->Search(B, {decoder states + ctc.InitStates(N)}, [&](ids, t, s) {
//     auto [att, dec_states] = decoder step;
//     auto [joint, ctc_states] = ctc.Step(ids, att, s.ctc_prefix);   // (1-w)·att + w·Δctc
//   });
//
// Summed over a hypothesis ending in </s>, the CTC terms equal log p_ctc(transcript | audio), the
// negative of at::ctc_loss; a hypothesis that stops early pays for the speech left unexplained.
#pragma once

#include <cstdint>
#include <map>
#include <utility>

#include "glossa/core/nested_map.h"

namespace glossa {

class CtcPrefixScorer {
 public:
  // log_probs [B, T, V+1]: the CTC head's log-softmax over V labels and the blank (id V) for B
  // sources; lengths [B]: valid frames of each; weight in [0, 1]: of the CTC term; sos_id and
  // eos_id: the decoder's </s>-less start token and its end token.
  CtcPrefixScorer(const at::Tensor& log_probs, const at::Tensor& lengths, double weight,
                  int64_t sos_id, int64_t eos_id);

  // The scorer's states for num_hyps = K·B hypotheses laid out h = k·B + b (the beam search's
  // layout), every one the empty prefix: {r [N, V, 2, T], psi [N, V]} (per candidate extension,
  // so that the search's reordering along dim 0 carries them and the next step's ids picks one).
  NestedMap InitStates(int64_t num_hyps) const;

  // ids [N]: the token each hypothesis last appended (sos at step 0); att_log_probs [N, V]: the
  // decoder's log-probs of the next token -> ((1 - w)·att + w·(ψ(g·c) − ψ(g)) [N, V], new states).
  std::pair<at::Tensor, NestedMap> Step(const at::Tensor& ids, const at::Tensor& att_log_probs,
                                        const NestedMap& states) const;

  // ψ(g·c) − ψ(g) alone ([N, V], float32; −1e10 floors an impossible prefix).
  std::pair<at::Tensor, NestedMap> PrefixScores(const at::Tensor& ids, const NestedMap& states) const;

 private:
  // The frames of N hypotheses (hypothesis h reads source h % B), time-major, computed on the
  // first step of each N: labels xs [T, N, V], blank xb [T, N, 1], lengths [N].
  struct Frames {
    at::Tensor xs, xb, lens;
  };
  const Frames& FramesFor(int64_t num_hyps) const;

  at::Tensor log_probs_;  // [B, T, V+1] float32
  at::Tensor lengths_;    // [B] int64, clamped to [1, T]
  double weight_;
  int64_t sos_id_, eos_id_, vocab_, blank_, frames_;
  mutable std::map<int64_t, Frames> frames_for_;  // by N; a scorer serves one search at a time
};

}  // namespace glossa
