// docs/mt.md's BleuScorer example, compiled into the test binary and run.
#include <gtest/gtest.h>

#include <cmath>

#include "glossa/metrics/bleu.h"

TEST(DocsExample, CorpusAndSentenceBleu) {
  glossa::BleuScorer bleu;                       // max_ngram 4; separator_type "", "bpe", "wpm", "spm"
  bleu.AddSentence("the cat is on the mat", "the cat sat on the mat");   // (reference, hypothesis)
  double corpus_bleu = bleu.ComputeOverallScore();                       // in [0, 1]
  double one = glossa::SentenceBleu("the cat is on the mat", "the cat");
  // 5/6 unigrams, 3/5 bigrams, 1/4 trigrams, 0/3 4-grams (left out), no brevity penalty.
  EXPECT_NEAR(corpus_bleu, std::cbrt(5.0 / 6 * 3.0 / 5 * 1.0 / 4), 1e-12);
  // 2/2 unigrams, 1/1 bigrams; brevity exp(1 - 6/2).
  EXPECT_NEAR(one, std::exp(1.0 - 6.0 / 2), 1e-12);
}
