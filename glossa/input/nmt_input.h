// Parallel-text inputs for translation (Lingvo's NmtInput), producing batches
//   src {ids, paddings} [B, S]   the source tokens and </s>
//   tgt {ids, labels, paddings, weights} [B, T]   ids = <s> + tokens, labels = tokens + </s>
// bucketed by max(source, target) length with bucket_upper_bound / bucket_batch_limit (longer
// pairs are dropped and counted), sharded across input replicas by file.
//
//   NmtInput      tf.Example records with source_id, target_id, target_label, target_weight
//                 (int64 / float lists, as Lingvo's data generators write them; source_padding
//                 and target_padding are read when present).
//   TextPairInput plain text tokenized with the tokenizer on the fly: "text:/data/train.tsv"
//                 (source<TAB>target per line), or source_file + target_file (line-aligned).
//
//   auto p = TextPairInput::Params();
//   p.Set("file_pattern", "text:/data/bible_mt/train.tsv");
//   p.Set("tokenizer", SentencePieceTokenizer::Params().Set("spm_model_file", ".../spm.model"));
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "glossa/input/input_generator.h"

namespace glossa {

class NmtInput : public BaseSequenceInputGenerator {
 public:
  static glossa::Params Params();
  explicit NmtInput(const glossa::Params& p);
  ~NmtInput() override { StopReading(); }
  std::optional<std::pair<NestedMap, int64_t>> ProcessRecord(const Record& record) const override;
  // {src: source_max_length, tgt: target_max_length}.
  std::map<std::string, int64_t> PackedRowLengths() const override;
};

class TextPairInput : public BaseSequenceInputGenerator {
 public:
  // + source_file, target_file (instead of file_pattern: two line-aligned files; they are
  // checked and joined into one tab-separated temporary file when the input is built),
  // drop_misformatted (False: a line without a tab is InvalidArgument quoting it).
  static glossa::Params Params();
  explicit TextPairInput(const glossa::Params& p);
  ~TextPairInput() override;
  std::optional<std::pair<NestedMap, int64_t>> ProcessRecord(const Record& record) const override;
  // {src: source_max_length, tgt: target_max_length}.
  std::map<std::string, int64_t> PackedRowLengths() const override;

  // The example of one (source, target) pair of strings; nullopt when either side is empty.
  std::optional<std::pair<NestedMap, int64_t>> MakeExample(const std::string& source,
                                                           const std::string& target) const;

 private:
  std::string joined_file_;  // the temporary TSV of source_file + target_file
  bool drop_misformatted_;
};

}  // namespace glossa
