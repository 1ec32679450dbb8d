// Lingvo's corpus BLEU (lingvo/core/scorers.py BleuScorer): hypotheses and references split on
// whitespace (Python's str.split(): Unicode whitespace, in UTF-8), n-grams of order 1..max_ngram
// counted over the corpus with each hypothesis n-gram's matches clipped to its count in the
// reference, the geometric mean of the precisions of the orders that have any match (Lingvo's
// rule: orders without a match are left out, no smoothing), and the brevity penalty
// exp(1 - ref_tokens / hyp_tokens) when the hypotheses are shorter. Scores are in [0, 1].
//
//   BleuScorer bleu;                              // max_ngram 4, no unsegmenting
//   bleu.AddSentence("the cat sat", "the cat sat down");   // (reference, hypothesis)
//   double corpus = bleu.ComputeOverallScore();
//   double one = SentenceBleu("the cat sat", "the cat");
//
// separator_type undoes subword segmentation before scoring, as Lingvo's Unsegmenter: "bpe"
// removes "@@ ", "wpm"/"spm" removes spaces and turns "▁" into spaces; "" leaves text as is.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace glossa {

// Python's str.split() on UTF-8 text (invalid UTF-8 bytes are kept inside tokens).
std::vector<std::string> SplitOnUnicodeWhitespace(std::string_view text);

// Lingvo's Unsegmenter; separator_type "", "bpe", "wpm" or "spm" (InvalidArgument otherwise).
std::string Unsegment(std::string_view text, const std::string& separator_type);

class BleuScorer {
 public:
  explicit BleuScorer(int max_ngram = 4, std::string separator_type = "");
  void AddSentence(std::string_view ref, std::string_view hyp);
  double ComputeOverallScore() const;

  int64_t num_ref_tokens() const { return num_ref_tokens_; }
  int64_t num_hyp_tokens() const { return num_hyp_tokens_; }
  // Per order (index 0: unigrams): clipped matches and hypothesis n-grams.
  const std::vector<int64_t>& matches() const { return matches_; }
  const std::vector<int64_t>& counts() const { return counts_; }

 private:
  int max_ngram_;
  std::string separator_type_;
  std::vector<int64_t> matches_, counts_;
  int64_t num_ref_tokens_ = 0, num_hyp_tokens_ = 0;
};

// BLEU of one (reference, hypothesis) pair: a BleuScorer over that pair alone.
double SentenceBleu(std::string_view ref, std::string_view hyp, int max_ngram = 4,
                    const std::string& separator_type = "");

}  // namespace glossa
