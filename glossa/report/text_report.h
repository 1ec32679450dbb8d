// `glossa report`'s text: the task's Report hook (BaseTask::Report) on the latest checkpoint of
// <logdir>/train — the eval metrics on the dataset, one decoded batch when the task decodes, and
// what the task adds (an LM's unigram baseline, read from Train) — then the best steps the evaler
// and decoder jobs tracked on the dataset.
//
//   TextReportOptions o{.model_key = "lm.austen.TransformerLmTiny", .dataset = "Dev",
//                       .logdir = "runs/x", .train_params = [] { return TrainParams(); }};
//   std::cout << RenderTextReport(dev_params, o);
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "glossa/core/params.h"

namespace glossa {

struct TextReportOptions {
  std::string model_key, dataset, logdir;
  int64_t num_samples = 5;  // sampled continuations the task prints
  // The model's Params for Train (the task may read its input once, e.g. for a unigram baseline).
  std::function<Params()> train_params;
};

// NotFound when <logdir>/train has no checkpoint.
std::string RenderTextReport(const Params& model_params, const TextReportOptions& options);

}  // namespace glossa
