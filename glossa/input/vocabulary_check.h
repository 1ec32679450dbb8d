// A model's vocabulary sizes against its input's tokenizer, checked when the model is built: a
// SentencePiece model of another size than the Params say fails there, naming every key that
// differs and the override that fixes them all, not as an embedding's "ids must be in [0, N)" at
// the first step.
//
//   CheckVocabularyAgrees(input(), {{"emb.vocab_size", 2000}, {"softmax.num_classes", 2000}},
//                         "task 'lm'");
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace glossa {

class BaseInputGenerator;
class BaseTokenizer;

// How many ids `tok` has: its SentencePiece model's size, or its Params vocab_size.
int64_t TokenizerVocabSize(const BaseTokenizer& tok);

// `input`'s tokenizer (a sequence input's; other inputs are not checked) has NumIds ids: its
// SentencePiece model's size, or its Params vocab_size. input.tokenizer.vocab_size and each of
// `task_keys` (keys under the task, with their values) must equal it: InvalidArgument otherwise,
// led by `where`.
void CheckVocabularyAgrees(const BaseInputGenerator& input,
                           const std::vector<std::pair<std::string, int64_t>>& task_keys,
                           const std::string& where);

}  // namespace glossa
