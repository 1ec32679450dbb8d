#include "glossa/input/tokenizers.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

std::string TestData(const std::string& name) {
  return testing::SourcePath("../shared/testdata/lingvo/" + name);
}

template <typename T>
std::unique_ptr<T> MakeTokenizer(Params p) {
  p.Set("name", "tokenizer");
  return InstantiateLayer<T>(p);
}

TEST(AsciiTokenizer, LingvosIdsAndSpecialTokens) {
  auto tok = MakeTokenizer<AsciiTokenizer>(AsciiTokenizer::Params());
  EXPECT_EQ(tok->StringToIds("Hi!"), (std::vector<int64_t>{12, 13, 35}));
  EXPECT_EQ(tok->StringToIds("a z 0 9"), (std::vector<int64_t>{5, 3, 30, 3, 39, 3, 48}));
  EXPECT_EQ(tok->StringToIds("<noise>x</s>"), (std::vector<int64_t>{4, 28, 2}));
  EXPECT_EQ(tok->StringToIds("\x01"), (std::vector<int64_t>{0}));
  EXPECT_EQ(tok->IdsToString({12, 13, 3, 4}), "hi <noise>");
  EXPECT_EQ(tok->IdsToString({500}), "<unk>");
}

TEST(BaseTokenizer, StringsToIdsFollowsLingvosLayout) {
  auto tok = MakeTokenizer<AsciiTokenizer>(AsciiTokenizer::Params());
  NestedMap out = tok->StringsToIds({"ab", "abcdef"}, 4);
  EXPECT_TRUE(at::equal(out.GetTensor("ids"),
                        at::tensor({1, 5, 6, 2, 1, 5, 6, 7}, at::kLong).view({2, 4})));
  EXPECT_TRUE(at::equal(out.GetTensor("labels"),
                        at::tensor({5, 6, 2, 2, 5, 6, 7, 8}, at::kLong).view({2, 4})));
  EXPECT_TRUE(at::equal(out.GetTensor("paddings"),
                        at::tensor({0.f, 0.f, 0.f, 1.f, 0.f, 0.f, 0.f, 0.f}).view({2, 4})));
  auto no_eos = MakeTokenizer<AsciiTokenizer>(
      AsciiTokenizer::Params().Set("append_eos", false).Set("pad_to_max_length", false));
  NestedMap o2 = no_eos->StringsToIds({"ab"}, 10);
  EXPECT_TRUE(at::equal(o2.GetTensor("ids"), at::tensor({1, 5}, at::kLong).view({1, 2})));
  EXPECT_TRUE(at::equal(o2.GetTensor("labels"), at::tensor({5, 6}, at::kLong).view({1, 2})));
  EXPECT_EQ(tok->IdsToStrings(out.GetTensor("labels"), at::tensor({2, 4}, at::kLong)),
            (std::vector<std::string>{"ab", "abcd"}));
  EXPECT_THROW(tok->StringsToIds({"a"}, 0), InvalidArgumentError);
}

TEST(VocabFileTokenizer, ReadsLingvoVocabFiles) {
  const fs::path dir = ::glossa::testing::TestRoot() / "tok";
  fs::create_directories(dir);
  std::ofstream(dir / "v.txt") << "<unk>\t0\n<s>\t0\n</s>\t0\nhello\t-1\nworld\t-2\n";
  auto tok = MakeTokenizer<VocabFileTokenizer>(
      VocabFileTokenizer::Params().Set("token_vocab_filepath", (dir / "v.txt").string()));
  EXPECT_EQ(tok->vocab_size(), 5);
  EXPECT_EQ(tok->StringToIds("hello  world moon"), (std::vector<int64_t>{3, 4, 0}));
  EXPECT_EQ(tok->IdsToString({3, 4}), "hello world");
  EXPECT_ERROR_CONTAINS(MakeTokenizer<VocabFileTokenizer>(
                            VocabFileTokenizer::Params().Set("token_vocab_filepath", "/no/vocab")),
                        NotFoundError, "cannot open vocabulary file '/no/vocab'");
  const std::string wmt_vocab = TestData("wmt14_ende_wpm_32k_test.vocab");
  if (fs::exists(wmt_vocab)) {
    auto wmt = MakeTokenizer<VocabFileTokenizer>(
        VocabFileTokenizer::Params().Set("token_vocab_filepath", wmt_vocab));
    EXPECT_EQ(wmt->vocab_size(), 32000);
    EXPECT_EQ(wmt->unk_id(), 0);
    EXPECT_EQ(wmt->sos_id(), 1);
    EXPECT_EQ(wmt->eos_id(), 2);
  }
}

TEST(SentencePieceTokenizer, EncodesLikeLingvosModel) {
  const std::string model = TestData("en-1k.spm.model");
  if (!fs::exists(model)) GTEST_SKIP() << "../shared/testdata is absent: " << model;
  auto tok =
      MakeTokenizer<SentencePieceTokenizer>(SentencePieceTokenizer::Params().Set("spm_model_file", model));
  EXPECT_EQ(tok->StringToIds("Hello world!"), (std::vector<int64_t>{136, 263, 36, 779, 185}));
  EXPECT_EQ(tok->StringToIds("why"), (std::vector<int64_t>{109, 534}));
  EXPECT_EQ(tok->sos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->vocab_size(), 1024);
  EXPECT_EQ(tok->IdsToString({136, 263, 36, 779, 185}), "Hello world!");
}

TEST(SentencePieceTokenizer, LongInputsTokenizeInLinearTimeAndAsInOneCall) {
  // SentencePiece alone takes super-linear time in a long run without spaces (a 3.9 MB run of
  // '日' held a server for minutes): long texts are encoded in segments (spm_shim.cc). Were it
  // not linear, this test would run for minutes and CTest's timeout would fail it.
  auto tok = MakeTokenizer<SentencePieceTokenizer>(SentencePieceTokenizer::Params().Set(
      "spm_model_file", testing::SourcePath("data/austen/spm_2k.model")));
  // Text with spaces: cut at spaces, where SentencePiece splits anyway, so the ids are those of
  // the lines one by one (each shorter than a segment, encoded in one call).
  std::ifstream in(testing::SourcePath("data/austen/train.txt"));
  std::string line, joined;
  std::vector<int64_t> want;
  while (joined.size() < 60000 && std::getline(in, line)) {
    if (line.find_first_not_of(' ') == std::string::npos) continue;
    const std::vector<int64_t> ids = tok->StringToIds(line);
    want.insert(want.end(), ids.begin(), ids.end());
    joined += (joined.empty() ? "" : " ") + line;
  }
  ASSERT_GT(joined.size(), 50000u);
  EXPECT_EQ(tok->StringToIds(joined), want);
  // A run of unknown characters is one <unk>, however long, as SentencePiece makes a short one.
  std::string cjk;
  for (int i = 0; i < 400000; ++i) cjk += "\xE6\x97\xA5";  // 日, 1.2 MB
  EXPECT_EQ(tok->StringToIds("abc " + cjk + " def"), tok->StringToIds("abc \xE6\x97\xA5 def"));
  EXPECT_EQ(tok->StringToIds(std::string(600000, '\0')), tok->StringToIds(std::string(4, '\0')));
  // A long run of known characters is cut inside the run; it still decodes to itself.
  const std::string run(100000, 'a');
  const std::vector<int64_t> ids = tok->StringToIds(run);
  EXPECT_LE(ids.size(), run.size());
  EXPECT_EQ(tok->IdsToString(ids), run);
  const std::string words = "It is a truth " + std::string(5000, 'e') + " universally acknowledged";
  EXPECT_EQ(tok->IdsToString(tok->StringToIds(words)), words);
}

TEST(SentencePieceTokenizer, TrainsAModelFromText) {
  const fs::path dir = ::glossa::testing::TestRoot() / "spm";
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "corpus.txt");
    for (int i = 0; i < 200; ++i) out << "the cat sat on the mat number " << i % 17 << "\n";
  }
  TrainSentencePiece((dir / "corpus.txt").string(), (dir / "m").string(), 40);
  auto tok = MakeTokenizer<SentencePieceTokenizer>(
      SentencePieceTokenizer::Params().Set("spm_model_file", (dir / "m.model").string()));
  auto ids = tok->StringToIds("the cat sat");
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(tok->IdsToString(ids), "the cat sat");
  EXPECT_ERROR_CONTAINS(TrainSentencePiece("/no/corpus.txt", (dir / "x").string(), 40),
                        InvalidArgumentError, "SentencePiece training on '/no/corpus.txt' failed");
  EXPECT_ERROR_CONTAINS(MakeTokenizer<SentencePieceTokenizer>(
                            SentencePieceTokenizer::Params().Set("spm_model_file", "/no/model")),
                        NotFoundError, "spm_model_file '/no/model' does not exist");
  EXPECT_ERROR_CONTAINS(MakeTokenizer<SentencePieceTokenizer>(
                            SentencePieceTokenizer::Params().Set("spm_model_file", "/dev/zero")),
                        InvalidArgumentError, "spm_model_file '/dev/zero' is a character device");
}

}  // namespace
}  // namespace glossa
