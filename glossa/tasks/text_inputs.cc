#include "glossa/tasks/text_inputs.h"

#include <algorithm>

#include "glossa/input/input_generator.h"
#include "glossa/input/nmt_input.h"
#include "glossa/input/tokenizers.h"

namespace glossa {
namespace {

// The settings every text input shares: name, file, tokenizer; Dev and Test read once, in order.
void SetCommon(Params& p, const TextInputSpec& spec, bool train) {
  p.Set("name", "input");
  p.Set("file_pattern", spec.file_pattern);
  Params tok = SentencePieceTokenizer::Params().Set("vocab_size", spec.vocab_size);
  if (!spec.spm_model_file.empty()) tok.Set("spm_model_file", spec.spm_model_file);
  p.Set("tokenizer", tok);
  p.Set("file_parallelism", 1);
  if (!train) {
    p.Set("repeat_count", 1);
    p.Set("require_sequential_order", true);
  }
}

}  // namespace

Params TextLmInputParams(const TextInputSpec& spec, bool train) {
  Params p = TextLmInput::Params();
  SetCommon(p, spec, train);
  p.Set("target_max_length", spec.max_length);
  ParamValue::List bounds, limits;
  for (int64_t b = spec.max_length / 4; b <= spec.max_length; b *= 2) {
    bounds.push_back(ParamValue(b));
    limits.push_back(ParamValue(std::max<int64_t>(1, spec.tokens_per_batch / b)));
  }
  p.Set("bucket_upper_bound", bounds);
  p.Set("bucket_batch_limit", limits);
  p.Set("packed_rows", std::max<int64_t>(1, spec.tokens_per_batch / spec.max_length));
  return p;
}

Params TextPairInputParams(const TextInputSpec& spec, bool train) {
  Params p = TextPairInput::Params();
  SetCommon(p, spec, train);
  // Evaluation keeps every pair of a test set whose sentences are up to 4x the training limit.
  const int64_t max_len = train ? spec.max_length : 4 * spec.max_length;
  p.Set("source_max_length", max_len).Set("target_max_length", max_len);
  ParamValue::List bounds, limits;
  for (int64_t b : {16, 24, 32, 48, 64, 96, 128, 256, 512}) {
    if (b > max_len) break;
    bounds.push_back(ParamValue(b));
    limits.push_back(
        ParamValue(std::max<int64_t>(1, (train ? spec.tokens_per_batch : 2048) / b)));
  }
  p.Set("bucket_upper_bound", bounds);
  p.Set("bucket_batch_limit", limits);
  p.Set("packed_rows", std::max<int64_t>(1, (train ? spec.tokens_per_batch : 2048) / max_len));
  return p;
}

}  // namespace glossa
