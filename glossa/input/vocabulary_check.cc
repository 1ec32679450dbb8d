#include "glossa/input/vocabulary_check.h"

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/input/input_generator.h"
#include "glossa/input/tokenizers.h"

namespace glossa {

int64_t TokenizerVocabSize(const BaseTokenizer& tok) {
  // A SentencePiece model has its own size; other tokenizers are their Params.
  const auto* spm = dynamic_cast<const SentencePieceTokenizer*>(&tok);
  return spm != nullptr ? spm->vocab_size() : tok.params().GetInt("vocab_size");
}

void CheckVocabularyAgrees(const BaseInputGenerator& input,
                           const std::vector<std::pair<std::string, int64_t>>& task_keys,
                           const std::string& where) {
  const auto* seq = dynamic_cast<const BaseSequenceInputGenerator*>(&input);
  if (seq == nullptr) return;
  const BaseTokenizer& tok = seq->tokenizer();
  const int64_t n = TokenizerVocabSize(tok);
  std::vector<std::pair<std::string, int64_t>> keys = {
      {"input.tokenizer.vocab_size", tok.params().GetInt("vocab_size")}};
  keys.insert(keys.end(), task_keys.begin(), task_keys.end());
  std::vector<std::string> wrong, fix;
  for (const auto& [key, value] : keys) {
    if (value != n) wrong.push_back(StrCat(key, " is ", value));
    fix.push_back(StrCat("task.", key, " : ", n));
  }
  if (wrong.empty()) return;
  const std::string what =
      tok.params().IsSet("spm_model_file")
          ? StrCat("the tokenizer's model ", tok.params().GetString("spm_model_file"))
          : StrCat("the tokenizer (", tok.params().ClsKey(), ")");
  throw InvalidArgumentError(StrCat(where, ": ", what, " has ", n, " ids, but ", Join(wrong, ", "),
                                    ": the vocabulary sizes must agree. Set them all: "
                                    "--model_params_override=\"",
                                    Join(fix, "; "), "\""));
}

}  // namespace glossa
