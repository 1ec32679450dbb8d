// The vocabulary shortlist: Build against a brute-force Dice ranking of a random corpus, the file
// format's round trip and its errors, and a batch's candidates.
#include "glossa/input/shortlist.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <set>
#include <vector>

#include "glossa/base/errors.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

using Pairs = std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>;

// Source piece a mostly appears with target piece a + 1 (its "translation"); piece 0 of the
// target side is in most pairs (a frequent function word).
Pairs RandomCorpus(int64_t vocab, int64_t n, uint64_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> piece(0, vocab - 2), len(1, 6);
  std::bernoulli_distribution noise(0.2), function_word(0.7);
  Pairs pairs;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> s, t;
    for (int64_t j = len(rng); j > 0; --j) {
      const int64_t a = piece(rng);
      s.push_back(a);
      t.push_back(noise(rng) ? piece(rng) + 1 : a + 1);
    }
    if (function_word(rng)) t.push_back(0);
    pairs.emplace_back(s, t);
  }
  return pairs;
}

TEST(VocabShortlist, BuildKeepsTheHighestDiceCandidatesAndTheFrequentPieces) {
  const int64_t v = 30, per_source = 4, frequent = 5;
  const Pairs pairs = RandomCorpus(v, 400, 1);
  const VocabShortlist s = VocabShortlist::Build(pairs, v, v, per_source, frequent);
  // Brute force: pair counts from sets, Dice in double, ties to the smaller id.
  std::vector<double> cs(v, 0), ct(v, 0);
  std::vector<std::vector<double>> co(v, std::vector<double>(v, 0));
  for (const auto& [src, tgt] : pairs) {
    const std::set<int64_t> a(src.begin(), src.end()), b(tgt.begin(), tgt.end());
    for (int64_t x : a) cs[x] += 1;
    for (int64_t y : b) ct[y] += 1;
    for (int64_t x : a) {
      for (int64_t y : b) co[x][y] += 1;
    }
  }
  for (int64_t x = 0; x < v; ++x) {
    std::vector<std::pair<double, int64_t>> ranked;
    for (int64_t y = 0; y < v; ++y) {
      if (co[x][y] > 0) ranked.emplace_back(-2 * co[x][y] / (cs[x] + ct[y]), y);
    }
    std::sort(ranked.begin(), ranked.end());
    std::vector<int64_t> want;
    for (size_t i = 0; i < ranked.size() && i < static_cast<size_t>(per_source); ++i) {
      want.push_back(ranked[i].second);
    }
    std::sort(want.begin(), want.end());
    EXPECT_EQ(s.candidates(x), want) << "source " << x;
    if (cs[x] > 5) {
      // The "translation" x + 1 ranks first for a piece seen often enough.
      EXPECT_TRUE(std::count(want.begin(), want.end(), x + 1)) << "source " << x;
    }
  }
  std::vector<int64_t> by_count(v);
  for (int64_t y = 0; y < v; ++y) by_count[y] = y;
  std::stable_sort(by_count.begin(), by_count.end(), [&](int64_t a, int64_t b) { return ct[a] > ct[b]; });
  std::vector<int64_t> want_frequent(by_count.begin(), by_count.begin() + frequent);
  std::sort(want_frequent.begin(), want_frequent.end());
  EXPECT_EQ(s.frequent(), want_frequent);
  EXPECT_TRUE(std::count(s.frequent().begin(), s.frequent().end(), 0)) << "the function word";

  EXPECT_ERROR_CONTAINS(VocabShortlist::Build({{{0, 31}, {1}}}, v, v, 4, 5), InvalidArgumentError,
                        "pair 0: a source id outside [0, 30)");
  EXPECT_ERROR_CONTAINS(VocabShortlist::Build(pairs, v, v, 0, 5), InvalidArgumentError,
                        "per_source >= 1");
}

TEST(VocabShortlist, SavesLoadsAndNamesTheLineOfABadFile) {
  const std::string dir = testing::TempDir("shortlist");
  const VocabShortlist s = VocabShortlist::Build(RandomCorpus(20, 200, 2), 20, 20, 3, 4);
  s.Save(dir + "/s.tsv");
  const VocabShortlist t = VocabShortlist::Load(dir + "/s.tsv");
  EXPECT_EQ(t.source_vocab(), 20);
  EXPECT_EQ(t.target_vocab(), 20);
  EXPECT_EQ(t.frequent(), s.frequent());
  for (int64_t a = 0; a < 20; ++a) EXPECT_EQ(t.candidates(a), s.candidates(a)) << a;

  auto write = [&](const std::string& text) {
    std::ofstream(dir + "/bad.tsv") << text;
    return dir + "/bad.tsv";
  };
  EXPECT_ERROR_CONTAINS(VocabShortlist::Load(dir + "/missing.tsv"), NotFoundError, "missing.tsv");
  EXPECT_ERROR_CONTAINS(VocabShortlist::Load(write("")), DataLossError, "bad.tsv:1: not a glossa");
  EXPECT_ERROR_CONTAINS(VocabShortlist::Load(write("glossa_shortlist 1 5 5\nfrequent 1 x\n")),
                        DataLossError, "bad.tsv:2: 'x' is not an integer id");
  EXPECT_ERROR_CONTAINS(VocabShortlist::Load(write("glossa_shortlist 1 5 5\nfrequent 1\n3 4 5\n")),
                        DataLossError, "bad.tsv:3: target id 5 outside [0, 5)");
  EXPECT_ERROR_CONTAINS(
      VocabShortlist::Load(write("glossa_shortlist 1 5 5\nfrequent 1\n3 4\n7 1\n")),
      DataLossError, "bad.tsv:4: source id 7 outside [0, 5)");
  EXPECT_ERROR_CONTAINS(
      VocabShortlist::Load(write("glossa_shortlist 1 5 5\nfrequent 1\n3 4\n\n3 2\n")),
      DataLossError, "bad.tsv:5: source id 3 listed twice");
  EXPECT_ERROR_CONTAINS(VocabShortlist::Load(write("glossa_shortlist 1 5\nfrequent\n")),
                        DataLossError, "bad.tsv:1: bad vocabulary sizes");
}

TEST(VocabShortlist, CandidatesAreTheUnionOfTheUnpaddedSourcesAndTheAlwaysIds) {
  const std::string dir = testing::TempDir("shortlist_candidates");
  std::ofstream(dir + "/s.tsv") << "glossa_shortlist 1 6 10\nfrequent 0 9\n1 3 4\n2 4 5\n3 7\n";
  const VocabShortlist s = VocabShortlist::Load(dir + "/s.tsv");
  const at::Tensor ids = at::tensor({1, 3, 2, 2, 0, 0}, at::kLong).view({2, 3});
  const at::Tensor pad = at::tensor({0.f, 0.f, 1.f, 0.f, 0.f, 1.f}).view({2, 3});
  // Row 0: pieces 1 and 3 (2 is padding); row 1: 2 and 0 (0 has no candidates).
  EXPECT_TRUE(at::equal(s.Candidates(ids, pad, {2}), at::tensor({0, 2, 3, 4, 5, 7, 9}, at::kLong)));
  EXPECT_TRUE(at::equal(s.Candidates(ids, {}, {}), at::tensor({0, 3, 4, 5, 7, 9}, at::kLong)));
  EXPECT_ERROR_CONTAINS(s.Candidates(at::tensor({6}, at::kLong), {}, {}), InvalidArgumentError,
                        "source id 6 outside [0, 6)");
  EXPECT_ERROR_CONTAINS(s.Candidates(ids, {}, {10}), InvalidArgumentError,
                        "id 10 outside the target vocabulary of 10");
}

}  // namespace
}  // namespace glossa
