// LexiconConstraint: the tokens allowed after every prefix are exactly those that continue some
// listed word, plus the separator and </s> after a whole word (checked against a brute force over
// the word list); the states follow a beam search's reordering; files are read with errors that
// name the file and line.
#include "glossa/search/lexicon.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/input/tokenizers.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

std::string TempDir() {
  const std::string dir = (::glossa::testing::TestRoot() / "lexicon").string();
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteStringToFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Brute force: after `text` (characters and spaces), which characters / ' ' / </s> may follow.
std::set<std::string> AllowedBruteForce(const std::vector<std::string>& words,
                                        const std::string& text) {
  std::set<std::string> out;
  const size_t space = text.rfind(' ');
  const std::string partial = space == std::string::npos ? text : text.substr(space + 1);
  for (const auto& w : words) {
    if (w.compare(0, partial.size(), partial) == 0 && w.size() > partial.size()) {
      out.insert(std::string(1, w[partial.size()]));
    }
    if (w == partial) {
      out.insert(" ");
      out.insert("</s>");
    }
  }
  if (text.empty()) out.insert("</s>");  // the empty transcript
  return out;
}

std::set<std::string> AllowedOf(const LexiconConstraint& lex, const AsciiTokenizer& tok,
                                const std::string& text) {
  const at::Tensor a = lex.AllowedAfter(tok.StringToIds(text));
  std::set<std::string> out;
  for (int64_t id = 0; id < a.size(0); ++id) {
    if (!a[id].item<bool>()) continue;
    out.insert(id == tok.eos_id() ? "</s>" : tok.IdToPiece(id));
  }
  return out;
}

TEST(LexiconTest, AllowsExactlyTheContinuationsOfListedWords) {
  const AsciiTokenizer tok(AsciiTokenizer::Params());
  const std::vector<std::string> words = {"to", "too", "the", "then", "a", "aunt", "harriet's"};
  const std::string path = TempDir() + "/lexicon.txt";
  std::string text;
  for (const auto& w : words) text += w + " 3\n";
  WriteStringToFile(path, "\n" + text + "to 1\n");  // blank lines and a repeat are fine
  const LexiconConstraint lex = LexiconConstraint::FromFile(path, tok, 76);
  EXPECT_EQ(lex.num_words(), 7);
  for (const std::string prefix : {"", "t", "to", "too", "th", "the", "then", "a", "au", "aunt",
                                   "the ", "the a", "to aunt", "harriet", "harriet'", "harriet's",
                                   "a t", "then too"}) {
    EXPECT_EQ(AllowedOf(lex, tok, prefix), AllowedBruteForce(words, prefix)) << "'" << prefix << "'";
  }
}

TEST(LexiconTest, StepMasksAndFollowsReorderedStates) {
  const AsciiTokenizer tok(AsciiTokenizer::Params());
  auto ids = [&](const std::string& s) { return tok.StringToIds(s); };
  const LexiconConstraint lex({ids("ab"), ids("b")}, 76, ids(" ")[0], tok.sos_id(), tok.eos_id());
  NestedMap s = lex.InitStates(2);
  at::Tensor lp = at::zeros({2, 76});
  auto [m0, s0] = lex.Step(at::full({2}, tok.sos_id(), at::kLong), lp, s);
  // After <s>: 'a', 'b' or </s>.
  const std::vector<int64_t> allowed0 = {ids("a")[0], ids("b")[0], tok.eos_id()};
  for (int64_t v = 0; v < 76; ++v) {
    const bool ok = std::find(allowed0.begin(), allowed0.end(), v) != allowed0.end();
    EXPECT_EQ(m0[0][v].item<double>(), ok ? 0.0 : LexiconConstraint::kMaskedLogProb) << v;
  }
  // Hypothesis 0 takes 'a', 1 takes 'b'; then swap them (a beam search reordering).
  at::Tensor t1 = at::tensor({ids("a")[0], ids("b")[0]}, at::kLong);
  auto [m1, s1] = lex.Step(t1, lp, s0);
  EXPECT_EQ(m1[0][ids("b")[0]].item<double>(), 0.0);                         // "a" -> "ab"
  EXPECT_EQ(m1[0][tok.eos_id()].item<double>(), LexiconConstraint::kMaskedLogProb);  // "a" is no word
  EXPECT_EQ(m1[1][tok.eos_id()].item<double>(), 0.0);                        // "b" is
  EXPECT_EQ(m1[1][ids(" ")[0]].item<double>(), 0.0);
  const at::Tensor index = at::tensor({1, 0}, at::kLong);
  NestedMap swapped{{"node", s1.GetTensor("node").index_select(0, index)}};
  auto [m2, s2] = lex.Step(at::tensor({ids(" ")[0], ids("b")[0]}, at::kLong), lp, swapped);
  // Row 0 is now "b " (a word start), row 1 "ab" (a whole word).
  EXPECT_EQ(m2[0][tok.eos_id()].item<double>(), LexiconConstraint::kMaskedLogProb);
  EXPECT_EQ(m2[0][ids(" ")[0]].item<double>(), LexiconConstraint::kMaskedLogProb);
  EXPECT_EQ(m2[0][ids("a")[0]].item<double>(), 0.0);
  EXPECT_EQ(m2[1][tok.eos_id()].item<double>(), 0.0);
  // A forbidden token frees the hypothesis (its score already carries the mask).
  auto [m3, s3] = lex.Step(at::tensor({ids("z")[0], tok.eos_id()}, at::kLong), lp, s2);
  EXPECT_EQ(m3.eq(0).all().item<bool>(), true);
}

TEST(LexiconTest, FileErrorsNameTheFileAndLine) {
  const AsciiTokenizer tok(AsciiTokenizer::Params());
  const std::string dir = TempDir();
  EXPECT_ERROR_CONTAINS(LexiconConstraint::FromFile(dir + "/none.txt", tok, 76), NotFoundError,
                        "none.txt' does not exist");
  WriteStringToFile(dir + "/empty.txt", "\n  \n");
  EXPECT_ERROR_CONTAINS(LexiconConstraint::FromFile(dir + "/empty.txt", tok, 76),
                        InvalidArgumentError, "empty.txt' has no words");
  WriteStringToFile(dir + "/bad.txt", "ok\nnaïve\n");
  EXPECT_ERROR_CONTAINS(LexiconConstraint::FromFile(dir + "/bad.txt", tok, 76),
                        InvalidArgumentError, "bad.txt' line 2: the tokenizer cannot spell");
  EXPECT_ERROR_CONTAINS(LexiconConstraint({}, 76, 3, 1, 2), InvalidArgumentError,
                        "word list is empty");
}

}  // namespace
}  // namespace glossa
