#include "glossa/search/beam_search_top_k.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {

bool HigherScore(const Hyp& x, const Hyp& y) {
  if (x.global_score != y.global_score) return x.global_score > y.global_score;
  if (x.word_id != y.word_id) return x.word_id < y.word_id;
  return x.hyp_id < y.hyp_id;
}

namespace {

// `longer` is `shorter` followed by `last`.
bool ExtendsBy(const std::vector<int64_t>& longer, const std::vector<int64_t>& shorter,
               int64_t last) {
  return longer.size() == shorter.size() + 1 && longer.back() == last &&
         std::equal(shorter.begin(), shorter.end(), longer.begin());
}

}  // namespace

bool IsDuplicateHyp(const Hyp& cur, const Hyp& other, int64_t epsilon_id) {
  if (cur.word_id == other.word_id) return cur.prev_labels == other.prev_labels;
  // Exactly one of them may end with the epsilon: it then reads its prev_labels, which must be
  // the other's prev_labels and the other's token.
  if (cur.word_id == epsilon_id)
    return ExtendsBy(cur.prev_labels, other.prev_labels, other.word_id);
  if (other.word_id == epsilon_id)
    return ExtendsBy(other.prev_labels, cur.prev_labels, cur.word_id);
  return false;
}

double LogSumExp(double a, double b) {
  const double m = std::max(a, b);
  if (m == -std::numeric_limits<double>::infinity()) return m;
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

HypTopK::HypTopK(int64_t k, int64_t epsilon_id, int64_t buffer_size_factor)
    : k_(k), epsilon_id_(epsilon_id), buffer_size_factor_(buffer_size_factor) {
  if (k_ < 1) throw InvalidArgumentError(StrCat("HypTopK: k must be >= 1, got ", k_));
  if (buffer_size_factor_ < 2) {
    throw InvalidArgumentError(
        StrCat("HypTopK: buffer_size_factor must be >= 2, got ", buffer_size_factor_));
  }
}

double HypTopK::Add(const Hyp& hyp) {
  if (!selected_ || HigherScore(hyp, items_[k_ - 1])) {
    Insert(hyp);
    if (static_cast<int64_t>(items_.size()) >= buffer_size_factor_ * k_) Shrink();
  }
  if (!selected_) return std::numeric_limits<double>::lowest();
  return items_[k_ - 1].global_score;
}

void HypTopK::Insert(const Hyp& hyp) {
  if (epsilon_id_ >= 0) {
    for (Hyp& old : items_) {
      if (!IsDuplicateHyp(hyp, old, epsilon_id_)) continue;
      const double merged = LogSumExp(hyp.global_score, old.global_score);
      if (HigherScore(hyp, old)) old = hyp;
      old.global_score = merged;
      return;
    }
  }
  items_.push_back(hyp);
}

const std::vector<Hyp>& HypTopK::Get() {
  if (static_cast<int64_t>(items_.size()) > k_) Shrink();
  return items_;
}

void HypTopK::Clear() {
  selected_ = false;
  items_.clear();
}

void HypTopK::Shrink() {
  std::nth_element(items_.begin(), items_.begin() + (k_ - 1), items_.end(), HigherScore);
  items_.resize(k_);
  selected_ = true;
}

}  // namespace glossa
