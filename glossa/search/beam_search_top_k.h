// The per-source selection of Lingvo's BeamSearchStep (beam_search_step_op_kernels.h): Hyp, one
// proposed extension of a live hypothesis, and HypTopK, the buffer that keeps a source's best k
// extensions and, for epsilon-emitting models (merge_paths), merges two extensions that read the
// same once epsilons are removed.
//
//   HypTopK top_k(/*k=*/4, /*epsilon_id=*/0);           // epsilon_id -1: no merging
//   top_k.Add({.beam_id = 0, .hyp_id = 3, .word_id = 7, .local_score = -0.2,
//              .global_score = -1.5, .prev_labels = {5, 9}});
//   const std::vector<Hyp>& best = top_k.Get();         // the best k, best one first
//
// The buffer holds up to buffer_size_factor·k extensions; when full it keeps the best k and from
// then on refuses any extension not better than the k-th. A refused extension is not merged even
// when it duplicates one that was kept, and one dropped at a shrink misses the duplicates that
// come later: with a factor of 2 the merged scores depend on the order of the Add calls. That is
// Lingvo's behaviour, and the beam search adds in a fixed order (parents by index, each parent's
// extensions best first) so that it is repeatable.
#pragma once

#include <cstdint>
#include <vector>

namespace glossa {

// One extension of a live hypothesis (Lingvo's Hyp).
struct Hyp {
  int64_t beam_id = 0;               // the source
  int64_t hyp_id = 0;                // the extended hypothesis, in [0, num_hyps)
  int64_t word_id = 0;               // the proposed token (may be the epsilon)
  double local_score = 0;            // its log-prob at this step
  double global_score = 0;           // the hypothesis' score with it
  std::vector<int64_t> prev_labels;  // the hypothesis' tokens before it, epsilons removed
};

// Lingvo's HigherScore: the higher global score, then the lower word id, then the lower hyp id.
bool HigherScore(const Hyp& x, const Hyp& y);

// Whether two extensions read the same label sequence once epsilon_id tokens are removed
// (an extension by the epsilon reads its prev_labels; one by a token, prev_labels and the token).
bool IsDuplicateHyp(const Hyp& cur, const Hyp& other, int64_t epsilon_id);

// log(e^a + e^b), exact when both are -inf.
double LogSumExp(double a, double b);

// Lingvo's TopK<Hyp, HigherScore, ExtractGlobalScore, InsertHypWithEpsilonDedupe>.
class HypTopK {
 public:
  // epsilon_id < 0: no merging. buffer_size_factor >= 2.
  HypTopK(int64_t k, int64_t epsilon_id, int64_t buffer_size_factor = 2);

  // Adds (or merges) `hyp` unless the k-th best is already known and `hyp` is not better; merging
  // keeps the better of the two and gives it log(e^a + e^b). Returns the k-th best global score
  // once known (after the first shrink), else the lowest double.
  double Add(const Hyp& hyp);

  // The best k (fewer if fewer were added); items_[k-1] is the k-th best and the ones before it
  // are better, in no particular order beyond that (sort with HigherScore).
  const std::vector<Hyp>& Get();

  void Clear();
  int64_t k() const { return k_; }

 private:
  void Insert(const Hyp& hyp);
  void Shrink();

  int64_t k_, epsilon_id_, buffer_size_factor_;
  bool selected_ = false;  // the k-th best is known: items_[k_ - 1]
  std::vector<Hyp> items_;
};

}  // namespace glossa
