#include "glossa/tasks/lm/unigram_baseline.h"

#include <ATen/ATen.h>

#include <cmath>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {

UnigramBaseline::UnigramBaseline(int64_t vocab_size)
    : counts(static_cast<size_t>(vocab_size), 1.0), total(static_cast<double>(vocab_size)) {}

void UnigramBaseline::Count(const NestedMap& batch) {
  const at::Tensor labels = batch.GetTensor("labels").to(at::kLong).contiguous();
  const at::Tensor keep = (batch.GetTensor("paddings") < 0.5).contiguous();
  const int64_t* l = labels.data_ptr<int64_t>();
  const bool* k = keep.data_ptr<bool>();
  for (int64_t i = 0; i < labels.numel(); ++i) {
    if (!k[i]) continue;
    if (l[i] < 0 || l[i] >= static_cast<int64_t>(counts.size())) {
      throw InvalidArgumentError(
          StrCat("unigram baseline: label ", l[i], " outside the vocabulary of ", counts.size()));
    }
    counts[static_cast<size_t>(l[i])] += 1;
    total += 1;
  }
}

std::pair<double, double> UnigramBaseline::Score(const NestedMap& batch) const {
  const at::Tensor labels = batch.GetTensor("labels").to(at::kLong).contiguous();
  const at::Tensor keep = (batch.GetTensor("paddings") < 0.5).contiguous();
  const int64_t* l = labels.data_ptr<int64_t>();
  const bool* k = keep.data_ptr<bool>();
  double nll = 0, n = 0;
  for (int64_t i = 0; i < labels.numel(); ++i) {
    if (!k[i]) continue;
    nll -= std::log(counts.at(static_cast<size_t>(l[i])) / total);
    n += 1;
  }
  return {nll, n};
}

}  // namespace glossa
