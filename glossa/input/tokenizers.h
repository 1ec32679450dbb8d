// Tokenizers (Lingvo's): ASCII characters, a vocabulary file, and SentencePiece. StringsToIds
// gives Lingvo's (ids, labels, paddings): ids start with <s>, labels end with </s> (append_eos),
// both [batch, max_length] padded with </s>, paddings 1 past each sequence.
//
//   auto tok = SentencePieceTokenizer::Params().Set("spm_model_file", path).Set("name", "tok");
//   NestedMap out = InstantiateLayer<BaseTokenizer>(tok)->StringsToIds({"Hello world!"}, 16);
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "glossa/layers/base_layer.h"

namespace glossa {

class BaseTokenizer : public BaseLayer {
 public:
  // + vocab_size, append_eos, pad_to_max_length, target_unk_id, target_sos_id, target_eos_id.
  static glossa::Params Params();
  explicit BaseTokenizer(const glossa::Params& p);

  // Token ids of one string (no <s> or </s>).
  virtual std::vector<int64_t> StringToIds(const std::string& s) const = 0;
  // The string of token ids (ids outside the vocabulary read as the unknown token).
  virtual std::string IdsToString(const std::vector<int64_t>& ids) const = 0;
  // The vocabulary entry of one id as written in the vocabulary ("▁the" for SentencePiece, "a"
  // for ASCII, "<unk>" for ids outside it).
  virtual std::string IdToPiece(int64_t id) const { return IdsToString({id}); }

  // {ids, labels, paddings}, each [batch, max_length] (or the longest, without
  // pad_to_max_length); sequences longer than max_length are truncated.
  // pad_to_longest: pad to the longest sequence whatever pad_to_max_length says.
  NestedMap StringsToIds(const std::vector<std::string>& strs, int64_t max_length,
                         bool pad_to_longest = false) const;
  // Strings of ids [batch, time] with lengths [batch].
  std::vector<std::string> IdsToStrings(const at::Tensor& ids, const at::Tensor& lens) const;

  int64_t sos_id() const { return sos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t unk_id() const { return unk_id_; }

 protected:
  int64_t sos_id_, eos_id_, unk_id_;
};

// Lingvo's ASCII tokenizer: lower-cased characters with Lingvo's fixed ids (<unk> 0, <s> 1, </s> 2,
// ' ' 3, <noise> 4, 'a'..'z' 5..30, ...; 76 ids).
class AsciiTokenizer : public BaseTokenizer {
 public:
  static glossa::Params Params();
  explicit AsciiTokenizer(const glossa::Params& p) : BaseTokenizer(p) {}
  std::vector<int64_t> StringToIds(const std::string& s) const override;
  std::string IdsToString(const std::vector<int64_t>& ids) const override;
  std::string IdToPiece(int64_t id) const override;
};

// A vocabulary file: one token per line, or "token<TAB>score" (SentencePiece .vocab files); ids
// are line numbers. Strings split on whitespace; unknown tokens map to <unk>.
class VocabFileTokenizer : public BaseTokenizer {
 public:
  // + token_vocab_filepath, tokens_delimiter (' ').
  static glossa::Params Params();
  explicit VocabFileTokenizer(const glossa::Params& p);
  std::vector<int64_t> StringToIds(const std::string& s) const override;
  std::string IdsToString(const std::vector<int64_t>& ids) const override;
  std::string IdToPiece(int64_t id) const override;
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> ids_;
};

// SentencePiece (Debian's libsentencepiece); <s>, </s>, <unk> ids come from the model.
class SentencePieceTokenizer : public BaseTokenizer {
 public:
  // + spm_model_file.
  static glossa::Params Params();
  explicit SentencePieceTokenizer(const glossa::Params& p);
  ~SentencePieceTokenizer() override;
  std::vector<int64_t> StringToIds(const std::string& s) const override;
  std::string IdsToString(const std::vector<int64_t>& ids) const override;
  std::string IdToPiece(int64_t id) const override;
  int64_t vocab_size() const;

 private:
  void* sp_ = nullptr;  // a SentencePieceProcessor inside libglossa_spm
};

// Trains a SentencePiece model on a text file (one sentence per line): writes
// <model_prefix>.model and .vocab. model_type: unigram, bpe, char or word.
void TrainSentencePiece(const std::string& input_text_file, const std::string& model_prefix,
                        int64_t vocab_size, const std::string& model_type = "unigram");

}  // namespace glossa
