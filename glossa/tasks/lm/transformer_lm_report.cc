// TransformerLmTask's report (glossa report) and the unigram baseline it compares against.
#include "glossa/tasks/lm/transformer_lm.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "glossa/base/errors.h"
#include "glossa/base/progress.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/core/step_seed.h"
#include "glossa/input/vocabulary_check.h"
#include "glossa/input/tokenizers.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/moe.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"

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

std::string TransformerLmTask::Report(const ReportInputs& in) {
  for (const char* metric : {"log_pplx", "fraction_of_correct_next_step_preds"}) {
    if (!in.eval_metrics.count(metric))
      throw InvalidArgumentError(StrCat("report: the eval metrics lack ", metric));
  }
  if (!in.train_input) throw FailedPreconditionError("report: no Train input for the unigram");
  // The unigram baseline: token counts over one pass of Train, scored on the same split.
  std::unique_ptr<BaseInputGenerator> train_input = in.train_input();
  UnigramBaseline unigram(vocab_size_);
  CountProgress progress(stderr, "counting unigrams over Train", "batches");
  while (true) {
    try {
      unigram.Count(train_input->GetPreprocessedInputBatch());
    } catch (const OutOfRangeError&) {
      break;
    }
    progress.Add();
  }
  progress.Done(StrCat(", ", WithCommas(static_cast<int64_t>(
                                 unigram.total - static_cast<double>(unigram.counts.size()))),
                       " tokens"));
  input().Reset();
  double nll = 0, n = 0;
  while (true) {
    try {
      auto [a, b] = unigram.Score(input().GetPreprocessedInputBatch());
      nll += a;
      n += b;
    } catch (const OutOfRangeError&) {
      break;
    }
  }
  const double model_pplx = in.eval_metrics.at("log_pplx").first;
  const double unigram_pplx = nll / std::max(n, 1.0);
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof(buf), "%s step %lld on %s (%.0f tokens):\n", in.model_key.c_str(),
                static_cast<long long>(in.global_step), in.dataset.c_str(), n);
  out += buf;
  std::snprintf(buf, sizeof(buf),
                "  model   log_pplx: %.4f  (fraction_of_correct_next_step_preds: %.4f)\n",
                model_pplx, in.eval_metrics.at("fraction_of_correct_next_step_preds").first);
  out += buf;
  std::snprintf(buf, sizeof(buf), "  unigram log_pplx: %.4f\n  ratio model/unigram: %.3f\n",
                unigram_pplx, model_pplx / unigram_pplx);
  out += buf;
  out += "sampled continuations (prompt ||| sample):\n";
  for (int64_t i = 0; i < in.num_samples && i < static_cast<int64_t>(in.decode_lines.size()); ++i) {
    out += StrCat("  ", in.decode_lines[static_cast<size_t>(i)], "\n");
  }
  return out;
}

}  // namespace glossa
