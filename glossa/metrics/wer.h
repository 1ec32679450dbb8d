// Word and character error rates (Lingvo's tasks/asr/decoder_utils: EditDistance and the WER the
// decoder metrics accumulate): the Levenshtein alignment of a hypothesis to its reference, counted
// as substitutions, insertions and deletions.
//
//   ErrorCounts e = WordErrors("the cat sat", "the bat sat down");   // 1 sub, 1 ins: WER 2/3
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace glossa {

struct ErrorCounts {
  int64_t substitutions = 0, insertions = 0, deletions = 0;
  int64_t reference_length = 0;
  int64_t errors() const { return substitutions + insertions + deletions; }
  ErrorCounts& operator+=(const ErrorCounts& o);
  // errors / reference_length (0 for an empty reference with no errors).
  double rate() const;
};

// The minimum-edit alignment of hyp to ref (ties broken toward substitutions, then deletions).
ErrorCounts EditDistance(const std::vector<std::string>& ref, const std::vector<std::string>& hyp);
// Over whitespace-separated words.
ErrorCounts WordErrors(const std::string& ref, const std::string& hyp);
// Over characters, spaces included (as Lingvo's CER), after collapsing runs of whitespace.
ErrorCounts CharErrors(const std::string& ref, const std::string& hyp);

}  // namespace glossa
