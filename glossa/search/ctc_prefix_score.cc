#include "glossa/search/ctc_prefix_score.h"

#include <ATen/ATen.h>

#include <limits>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// ψ of a prefix CTC cannot produce (longer than the audio allows) is floored here, so that score
// differences stay finite and the search can still rank such hypotheses by their other scores.
constexpr double kFloor = -1e10;

}  // namespace

CtcPrefixScorer::CtcPrefixScorer(const at::Tensor& log_probs, const at::Tensor& lengths,
                                 double weight, int64_t sos_id, int64_t eos_id)
    : weight_(weight), sos_id_(sos_id), eos_id_(eos_id) {
  if (log_probs.dim() != 3 || log_probs.size(2) < 2 || log_probs.size(1) < 1) {
    throw InvalidArgumentError(StrCat("CtcPrefixScorer: log_probs must be [B, T >= 1, V+1 >= 2], got ",
                                      log_probs.sizes()));
  }
  if (lengths.dim() != 1 || lengths.size(0) != log_probs.size(0)) {
    throw InvalidArgumentError(StrCat("CtcPrefixScorer: lengths must be [", log_probs.size(0),
                                      "], got ", lengths.sizes()));
  }
  if (!(weight >= 0 && weight <= 1)) {
    throw InvalidArgumentError(StrCat("CtcPrefixScorer: weight must be in [0, 1], got ", weight));
  }
  log_probs_ = log_probs.detach().to(at::kFloat).contiguous();
  frames_ = log_probs_.size(1);
  vocab_ = log_probs_.size(2) - 1;
  blank_ = vocab_;
  if (sos_id < 0 || sos_id >= vocab_ || eos_id < 0 || eos_id >= vocab_ || sos_id == eos_id) {
    throw InvalidArgumentError(StrCat("CtcPrefixScorer: sos_id ", sos_id, " and eos_id ", eos_id,
                                      " must be distinct labels below ", vocab_));
  }
  // An utterance of no frames scores like one of a single frame (its remainder is all padding).
  lengths_ = lengths.to(at::kLong).clamp(1, frames_).contiguous();
}

NestedMap CtcPrefixScorer::InitStates(int64_t num_hyps) const {
  const int64_t b = log_probs_.size(0);
  if (num_hyps < 1 || num_hyps % b != 0) {
    throw InvalidArgumentError(StrCat("CtcPrefixScorer: ", num_hyps,
                                      " hypotheses are not a multiple of the ", b, " sources"));
  }
  const at::Tensor src = at::arange(num_hyps, at::kLong).remainder(b);
  // The empty prefix (kept under sos): r^n_t = -inf, r^b_t = Σ_{τ<=t} log x_τ(blank).
  at::Tensor r = at::full({num_hyps, vocab_, 2, frames_}, kNegInf, at::kFloat);
  r.select(1, sos_id_).select(1, 1).copy_(log_probs_.select(2, blank_).cumsum(1).index_select(0, src));
  at::Tensor psi = at::full({num_hyps, vocab_}, kNegInf, at::kFloat);
  psi.select(1, sos_id_).fill_(0.0);
  return NestedMap{{"r", r}, {"psi", psi}};
}

const CtcPrefixScorer::Frames& CtcPrefixScorer::FramesFor(int64_t n) const {
  auto it = frames_for_.find(n);
  if (it != frames_for_.end()) return it->second;
  const at::Tensor src = at::arange(n, at::kLong).remainder(log_probs_.size(0));
  const at::Tensor x = log_probs_.index_select(0, src);  // [N, T, V+1]
  Frames f{x.narrow(2, 0, vocab_).transpose(0, 1).contiguous(),
           x.select(2, blank_).transpose(0, 1).unsqueeze(2).contiguous(),
           lengths_.index_select(0, src)};
  return frames_for_.emplace(n, std::move(f)).first->second;
}

std::pair<at::Tensor, NestedMap> CtcPrefixScorer::PrefixScores(const at::Tensor& ids_in,
                                                               const NestedMap& states) const {
  const at::Tensor ids = ids_in.to(at::kLong).reshape({-1});
  const int64_t n = ids.size(0), t_n = frames_, v = vocab_, b = log_probs_.size(0);
  const at::Tensor& r_all = states.GetTensor("r");
  const at::Tensor& psi_all = states.GetTensor("psi");
  if (r_all.dim() != 4 || r_all.size(0) != n || psi_all.size(0) != n) {
    throw InvalidArgumentError(StrCat("CtcPrefixScorer: states of ", r_all.size(0),
                                      " hypotheses for ", n, " ids"));
  }
  if (n % b != 0) {
    throw InvalidArgumentError(StrCat("CtcPrefixScorer: ", n, " hypotheses for ", b, " sources"));
  }
  const Frames& frames = FramesFor(n);
  const at::Tensor& xs = frames.xs;  // [T, N, V]
  const at::Tensor& xb = frames.xb;  // [T, N, 1]
  const at::Tensor& lens = frames.lens;

  // The prefix g of each hypothesis: its r (picked among its parent's candidates by ids) and ψ.
  const at::Tensor r_g =
      r_all.gather(1, ids.view({n, 1, 1, 1}).expand({n, 1, 2, t_n})).squeeze(1);  // [N, 2, T]
  const at::Tensor psi_g = psi_all.gather(1, ids.view({n, 1})).squeeze(1);      // [N]
  const at::Tensor rn_g = r_g.select(1, 0).t().unsqueeze(2);  // [T, N, 1]
  const at::Tensor rb_g = r_g.select(1, 1).t().unsqueeze(2);

  // φ_t: paths that have finished g by frame t and may start c at t+1; when c repeats g's last
  // label, only those ending in a blank.
  const at::Tensor repeat = at::one_hot(ids, v).to(at::kBool).unsqueeze(0);  // [1, N, V]
  const at::Tensor phi = at::where(repeat, rb_g, at::logaddexp(rn_g, rb_g)).expand({t_n, n, v})
                             .contiguous();  // [T, N, V]
  at::Tensor rn = at::empty({t_n, n, v}, at::kFloat);
  at::Tensor rb = at::empty({t_n, n, v}, at::kFloat);
  // Only the initial <s> is the empty prefix (ψ = 0); a <s> a search appended later has the
  // floor for ψ and starts nothing.
  const at::Tensor empty_prefix = ((ids == sos_id_) & (psi_g > kFloor / 2)).view({n, 1});
  rn[0].copy_(at::where(empty_prefix, xs[0], at::full({}, kNegInf, at::kFloat)));
  rb[0].fill_(kNegInf);
  for (int64_t t = 1; t < t_n; ++t) {
    at::Tensor rn_t = rn[t], rb_t = rb[t];
    at::logaddexp_out(rn_t, rn[t - 1], phi[t - 1]);
    rn_t.add_(xs[t]);
    at::logaddexp_out(rb_t, rb[t - 1], rn[t - 1]);
    rb_t.add_(xb[t]);
  }
  // ψ(g·c) = r^n_0(h) + Σ_{1<=t<len} φ_{t-1}(g) · x_t(c): every path that emits c's first frame at t.
  at::Tensor terms = at::empty({t_n, n, v}, at::kFloat);
  terms[0].copy_(rn[0]);
  if (t_n > 1) {
    at::Tensor rest = terms.narrow(0, 1, t_n - 1);
    at::add_out(rest, phi.narrow(0, 0, t_n - 1), xs.narrow(0, 1, t_n - 1));
  }
  const at::Tensor beyond = (at::arange(t_n, at::kLong).view({t_n, 1}) >= lens.view({1, n})).unsqueeze(2);
  terms.masked_fill_(beyond, kNegInf);
  at::Tensor psi = at::logsumexp(terms, 0);  // [N, V]
  // ψ(g·</s>) = p(g is the whole transcript) = r^n_len(g) + r^b_len(g).
  const at::Tensor last = (lens - 1).view({1, n, 1});
  psi.select(1, eos_id_).copy_(at::logaddexp(rn_g.gather(0, last), rb_g.gather(0, last)).view({n}));
  psi.select(1, sos_id_).fill_(kNegInf);
  // <s> is no label: a prefix that contains one (a search may still append it, at the floor)
  // has no CTC paths, and neither have its extensions.
  rn.select(2, sos_id_).fill_(kNegInf);
  rb.select(2, sos_id_).fill_(kNegInf);
  psi.clamp_min_(kFloor);
  const at::Tensor delta = psi - psi_g.clamp_min(kFloor).unsqueeze(1);
  return {delta, NestedMap{{"r", at::stack({rn, rb}, 0).permute({2, 3, 0, 1}).contiguous()},
                           {"psi", psi}}};
}

std::pair<at::Tensor, NestedMap> CtcPrefixScorer::Step(const at::Tensor& ids,
                                                       const at::Tensor& att_log_probs,
                                                       const NestedMap& states) const {
  if (att_log_probs.dim() != 2 || att_log_probs.size(1) != vocab_ ||
      att_log_probs.size(0) != ids.numel()) {
    throw InvalidArgumentError(StrCat("CtcPrefixScorer: the decoder's log-probs are ",
                                      att_log_probs.sizes(), ", expected [", ids.numel(), ", ",
                                      vocab_, "] (the CTC head's labels)"));
  }
  auto [delta, new_states] = PrefixScores(ids, states);
  at::Tensor joint = att_log_probs.to(at::kFloat) * (1 - weight_) + delta * weight_;
  return {joint, std::move(new_states)};
}

}  // namespace glossa
