// Sampling from a TransformerLmTask token by token: the draw, the "generate" subgraph's options
// and fetches, and the decoding batch that requests join and leave at step boundaries
// (glossa/model/generation.h) which glossa serve runs for "generate".
//
//   auto batch = MakeLmGeneration(task, tokenizer);   // TransformerLmTask::StartGeneration
//   const int64_t id = batch->Join({{"prompt", InferenceValue::Strings({"Elizabeth"})}});
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "glossa/model/generation.h"

namespace glossa {

class BaseTokenizer;
class TransformerLmTask;

// The next token of each row of logits [n, V]: the argmax at temperature 0, else a draw from the
// softmax of logits / temperature over the top_k (0: all).
at::Tensor PickTokens(at::Tensor logits, double temperature, int64_t top_k, at::Generator& gen);

// "generate"'s options: a feed where given, else `defaults` (the task's decode_*).
struct GenerateOptions {
  int64_t max_new_tokens = 0;
  double temperature = 0;
  int64_t top_k = 0;
  uint64_t seed = 0;
};
GenerateOptions ReadGenerateOptions(const InferenceMap& feeds, const GenerateOptions& defaults);
// Each prompt's ids, <s> first.
std::vector<std::vector<int64_t>> PromptIds(const BaseTokenizer& tokenizer,
                                            const std::vector<std::string>& prompts);
// "generate"'s fetches of each row's draws (its </s> last when drawn): text, ids (</s>-padded),
// lengths (the ids before </s>).
InferenceMap GenerateFetches(const BaseTokenizer& tokenizer,
                             const std::vector<std::vector<int64_t>>& draws);

// The continuous decoding batch of `task`'s "generate" on its weights now (theta is read once).
// Each row draws what SampleTogether draws for it alone.
std::unique_ptr<GenerationBatch> MakeLmGeneration(const TransformerLmTask& task,
                                                  const BaseTokenizer& tokenizer);

}  // namespace glossa
