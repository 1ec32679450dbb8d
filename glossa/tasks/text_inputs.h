// The inputs of the text model families: the corpus ones (lm.austen.*, mt.bible.*) and the ones
// for your own text (lm.text.*, mt.text.*). One example a line of a "text:" file pattern, tokenized
// on the fly by a SentencePiece model, bucketed by length; Dev and Test read once, in order.
//
//   Params train = TextLmInputParams({"text:/data/train.txt", "/data/spm.model", 2000}, true);
//   Params dev = TextPairInputParams({"", "", 8000}, false);  // file and model from the Params
#pragma once

#include <cstdint>
#include <string>

#include "glossa/core/params.h"

namespace glossa {

struct TextInputSpec {
  // "" leaves file_pattern empty: the model's datasets.<dataset> gives it (model/datasets.h).
  std::string file_pattern;
  // "" leaves task.input.tokenizer.spm_model_file unset: a job names the key to set.
  std::string spm_model_file;
  int64_t vocab_size = 0;
  // The longest sequence (in pieces) a training batch holds; longer examples are dropped.
  int64_t max_length = 128;
  // Training batches hold about this many tokens (bucket_batch_limit = this / bucket bound; with
  // packed_input, packed_rows = this / max_length).
  int64_t tokens_per_batch = 2048;
};

// TextLmInput: one sentence a line; buckets max_length/4, /2, 1 (doubling).
Params TextLmInputParams(const TextInputSpec& spec, bool train);

// TextPairInput: "source<TAB>target" a line; buckets 16, 24, ..., 512 up to the length limit.
// Evaluation keeps pairs up to 4 × max_length, in batches of about 2,048 tokens.
Params TextPairInputParams(const TextInputSpec& spec, bool train);

}  // namespace glossa
