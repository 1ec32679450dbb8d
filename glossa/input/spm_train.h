// `glossa tokenizer train`: a SentencePiece model for your own text, trained by Debian's spm_train.
//
//   TrainSentencePiece({.input = "mine/train.txt", .model_prefix = "mine/spm", .vocab_size = 500});
#pragma once

#include <cstdint>
#include <string>

namespace glossa {

// Glossa's id convention (<unk> 0, <s> 1, </s> 2, no padding piece) written into the model,
// exactly vocab_size pieces (a text too small for them is an error that says the most it allows),
// the share of characters covered, trainer threads, and at most max_sentences input lines (0:
// all, else a sample). Progress every few seconds on stderr. Input files are comma-separated, one
// sentence per line.
struct SentencePieceTraining {
  std::string input;
  std::string model_prefix;
  int64_t vocab_size = 8000;
  std::string model_type = "unigram";
  double character_coverage = 1.0;
  int64_t num_threads = 1;
  int64_t max_sentences = 0;
};
void TrainSentencePiece(const SentencePieceTraining& t);

}  // namespace glossa
