// The unigram baseline `glossa report` compares a language model against.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "glossa/core/nested_map.h"

namespace glossa {

// Unigram baseline: token frequencies (add-one smoothed) counted over `train` batches' labels,
// and the per-token log-perplexity of `eval` batches under them. Both are lists of batches with
// labels and paddings (Lingvo's LM baseline for comparison).
struct UnigramBaseline {
  explicit UnigramBaseline(int64_t vocab_size);
  void Count(const NestedMap& batch);
  // Returns Σ -log p(label) over non-padded tokens and the token count.
  std::pair<double, double> Score(const NestedMap& batch) const;
  std::vector<double> counts;
  double total = 0;
};

}  // namespace glossa
