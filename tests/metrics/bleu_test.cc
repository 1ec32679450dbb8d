// Lingvo's corpus BLEU: hand-worked cases and an independent reference (tests/reference/
// bleu_reference.py) on generated corpora with Unicode whitespace and subword segmentation.
#include "glossa/metrics/bleu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(Bleu, HandWorkedCases) {
  // Identical: every precision 1, no brevity penalty.
  EXPECT_EQ(SentenceBleu("a b c d", "a b c d"), 1.0);
  // Two sentences: unigrams 5/6, bigrams 3/4, trigrams 2/2, 4-grams 1/1, 6 tokens each side.
  BleuScorer s;
  s.AddSentence("hyp matches ref str", "hyp matches ref str");
  s.AddSentence("almost right", "almost write");
  EXPECT_EQ(s.matches(), (std::vector<int64_t>{5, 3, 2, 1}));
  EXPECT_EQ(s.counts(), (std::vector<int64_t>{6, 4, 2, 1}));
  EXPECT_NEAR(s.ComputeOverallScore(), std::exp((std::log(5.0 / 6) + std::log(3.0 / 4)) / 4),
              1e-15);
  // Clipping: "the" appears twice in the reference, seven times in the hypothesis: 2/7, and no
  // bigram matches, so (Lingvo's rule) only the unigram order counts; brevity 1 (7 >= 6 tokens).
  EXPECT_NEAR(SentenceBleu("the cat is on the mat", "the the the the the the the"), 2.0 / 7,
              1e-15);
  // Brevity: hypothesis "the cat" against a 6-token reference: precision 1 over 2 orders,
  // penalty exp(1 - 6/2).
  EXPECT_NEAR(SentenceBleu("the cat is on the mat", "the cat"), std::exp(1.0 - 3.0), 1e-15);
  // No match at all, or no hypothesis: 0.
  EXPECT_EQ(SentenceBleu("a b", "c d"), 0.0);
  EXPECT_EQ(SentenceBleu("a b", ""), 0.0);
  // max_ngram 1: unigram precision alone.
  EXPECT_NEAR(SentenceBleu("a b c", "a x c", 1), 2.0 / 3, 1e-15);
  // Unicode whitespace separates tokens as Python's str.split() does.
  EXPECT_EQ(SplitOnUnicodeWhitespace("\ta\xc2\xa0" "b\xe3\x80\x80" "c  "),
            (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(SentenceBleu("señor de la casa", "se\xc3\xb1or\xe2\x80\x89" "de la\tcasa"), 1.0);
  // Unsegmenting.
  EXPECT_EQ(Unsegment("the ca@@ t sat", "bpe"), "the cat sat");
  EXPECT_EQ(Unsegment("▁the ▁ca t", "spm"), "the cat");
  EXPECT_EQ(SentenceBleu("▁the ▁cat", "▁the ▁c at", 4, "spm"), 1.0);
  EXPECT_ERROR_CONTAINS(BleuScorer(4, "sentencepiece"), InvalidArgumentError,
                        "separator_type must be '', 'bpe', 'wpm' or 'spm', got 'sentencepiece'");
  EXPECT_ERROR_CONTAINS(BleuScorer(0), InvalidArgumentError, "max_ngram must be >= 1, got 0");
}

TEST(Bleu, MatchesTheIndependentReference) {
  const auto cases = nlohmann::json::parse(
      testing::ReadSourceFile("tests/reference/bleu_reference.json"))["cases"];
  ASSERT_GE(cases.size(), 40u);
  int nonzero = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& k = cases[c];
    BleuScorer s(k["max_ngram"].get<int>(), k["separator_type"].get<std::string>());
    for (size_t i = 0; i < k["refs"].size(); ++i) {
      s.AddSentence(k["refs"][i].get<std::string>(), k["hyps"][i].get<std::string>());
    }
    EXPECT_EQ(s.matches(), k["matches"].get<std::vector<int64_t>>()) << "case " << c;
    EXPECT_EQ(s.counts(), k["counts"].get<std::vector<int64_t>>()) << "case " << c;
    EXPECT_EQ(s.num_ref_tokens(), k["ref_tokens"].get<int64_t>()) << "case " << c;
    EXPECT_EQ(s.num_hyp_tokens(), k["hyp_tokens"].get<int64_t>()) << "case " << c;
    EXPECT_NEAR(s.ComputeOverallScore(), k["bleu"].get<double>(), 1e-12) << "case " << c;
    nonzero += k["bleu"].get<double>() > 0;
  }
  EXPECT_GE(nonzero, 30);  // the generated corpora exercise real scores, not just zeros
}

}  // namespace
}  // namespace glossa
