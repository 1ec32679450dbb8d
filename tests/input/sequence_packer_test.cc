#include "glossa/input/sequence_packer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "glossa/base/errors.h"
#include "glossa/input/input_generator.h"
#include "glossa/input/nmt_input.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

// An LM-like example of `n` tokens: ids v, v+1, ...; labels the ids + 100; paddings 0.
NestedMap Example(int64_t n, int64_t v) {
  NestedMap ex;
  ex.Put("ids", at::arange(v, v + n, at::kLong));
  ex.Put("labels", at::arange(v, v + n, at::kLong) + 100);
  ex.Put("paddings", at::zeros({n}, at::kFloat));
  return ex;
}

std::vector<int64_t> Row(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// A window of one batch (open_rows = rows): the batch is emitted when an example fits no row.
TEST(SequencePacker, RowsWithSegmentIdsAndPositions) {
  SequencePacker packer({.rows = 2, .open_rows = 2, .row_length = {{"", 8}}},
                        {{"ids", 2.0}, {"labels", 2.0}});
  EXPECT_FALSE(packer.Add(Example(5, 10)).has_value());
  EXPECT_FALSE(packer.Add(Example(3, 20)).has_value());  // fills row 0 exactly
  EXPECT_FALSE(packer.Add(Example(4, 30)).has_value());  // row 1
  // 6 tokens fit neither row (8 used, 4 used): the batch is finished and a new one begun.
  std::optional<NestedMap> batch = packer.Add(Example(6, 40));
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->GetTensor("ids").sizes(), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(Row(batch->GetTensor("ids")[0]), (std::vector<int64_t>{10, 11, 12, 13, 14, 20, 21, 22}));
  // Row 1: 4 tokens, padded with the pad values (ids 2, paddings 1, segments 0).
  EXPECT_EQ(Row(batch->GetTensor("ids")[1]), (std::vector<int64_t>{30, 31, 32, 33, 2, 2, 2, 2}));
  EXPECT_EQ(Row(batch->GetTensor("labels")[1]),
            (std::vector<int64_t>{130, 131, 132, 133, 2, 2, 2, 2}));
  EXPECT_EQ(Row(batch->GetTensor("paddings")[1]), (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(Row(batch->GetTensor("segment_ids")[0]),
            (std::vector<int64_t>{1, 1, 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(Row(batch->GetTensor("segment_pos")[0]),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_EQ(Row(batch->GetTensor("segment_ids")[1]),
            (std::vector<int64_t>{1, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(batch->GetTensor("segment_ids").scalar_type(), at::kLong);
  // The flush: the one open row, its example alone.
  std::optional<NestedMap> last = packer.Flush();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->GetTensor("ids").sizes(), (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(Row(last->GetTensor("segment_pos")[0]), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_FALSE(packer.Flush().has_value());
}

// The first token of each row of a batch.
std::vector<int64_t> Firsts(const NestedMap& batch) {
  return Row(batch.GetTensor("ids").select(1, 0));
}

// Best fit over the open rows; a full window emits its fullest rows; Flush empties it in order of
// fullness.
TEST(SequencePacker, BestFitOverTheOpenRows) {
  SequencePacker packer({.rows = 1, .open_rows = 3, .row_length = {{"", 10}}}, {});
  EXPECT_FALSE(packer.Add(Example(6, 10)).has_value());  // row a: 6
  EXPECT_FALSE(packer.Add(Example(5, 20)).has_value());  // row b: 5
  EXPECT_FALSE(packer.Add(Example(4, 30)).has_value());  // fits both: the fuller a (10)
  EXPECT_FALSE(packer.Add(Example(5, 40)).has_value());  // b: 10
  EXPECT_FALSE(packer.Add(Example(3, 50)).has_value());  // row c: 3
  std::optional<NestedMap> batch = packer.Add(Example(9, 60));  // fits none, 3 rows open
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(Row(batch->GetTensor("ids")[0]),
            (std::vector<int64_t>{10, 11, 12, 13, 14, 15, 30, 31, 32, 33}));
  EXPECT_EQ(Firsts(*packer.Flush()), (std::vector<int64_t>{20}));  // b (10)
  EXPECT_EQ(Firsts(*packer.Flush()), (std::vector<int64_t>{60}));  // 9
  EXPECT_EQ(Firsts(*packer.Flush()), (std::vector<int64_t>{50}));  // c (3)
  EXPECT_FALSE(packer.Flush().has_value());
}

TEST(SequencePacker, PairsPackSourcesAndTargetsSideBySide) {
  SequencePacker packer({.rows = 1, .open_rows = 1, .row_length = {{"src", 6}, {"tgt", 5}}}, {});
  auto pair = [](int64_t s, int64_t t) {
    NestedMap ex;
    ex.Set("src.ids", at::full({s}, s, at::kLong));
    ex.Set("src.paddings", at::zeros({s}));
    ex.Set("tgt.ids", at::full({t}, t, at::kLong));
    ex.Set("tgt.paddings", at::zeros({t}));
    return ex;
  };
  EXPECT_TRUE(packer.Fits(pair(6, 5)));
  EXPECT_FALSE(packer.Fits(pair(7, 1)));
  EXPECT_FALSE(packer.Fits(pair(1, 6)));
  EXPECT_FALSE(packer.Add(pair(2, 3)).has_value());
  EXPECT_FALSE(packer.Add(pair(4, 1)).has_value());  // src 6 of 6, tgt 4 of 5
  // The source row is full, so a pair with room on the target side only starts a new batch.
  std::optional<NestedMap> batch = packer.Add(pair(1, 1));
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(Row(batch->GetTensor("src.ids")[0]), (std::vector<int64_t>{2, 2, 4, 4, 4, 4}));
  EXPECT_EQ(Row(batch->GetTensor("src.segment_ids")[0]), (std::vector<int64_t>{1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(Row(batch->GetTensor("tgt.ids")[0]), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(Row(batch->GetTensor("tgt.segment_ids")[0]), (std::vector<int64_t>{1, 1, 1, 2}));
  EXPECT_EQ(Row(batch->GetTensor("tgt.segment_pos")[0]), (std::vector<int64_t>{0, 1, 2, 0}));
  EXPECT_FALSE(batch->Has("segment_ids"));
}

TEST(SequencePacker, RefusesWhatCannotBePacked) {
  EXPECT_THROW(SequencePacker({.rows = 0, .row_length = {{"", 8}}}, {}), InvalidArgumentError);
  EXPECT_THROW(SequencePacker({.rows = 1, .row_length = {}}, {}), InvalidArgumentError);
  EXPECT_THROW(SequencePacker({.rows = 2, .open_rows = 1, .row_length = {{"", 8}}}, {}),
               InvalidArgumentError);
  EXPECT_THROW(SequencePacker({.rows = 1, .row_length = {{"", 0}}}, {}), InvalidArgumentError);
  SequencePacker packer({.rows = 1, .row_length = {{"", 8}}}, {});
  NestedMap two_d;
  two_d.Put("x", at::zeros({2, 2}));
  EXPECT_ERROR_CONTAINS(packer.Fits(two_d), InvalidArgumentError, "cannot pack 'x'");
  NestedMap ragged = Example(3, 0);
  ragged.Put("labels", at::zeros({4}, at::kLong));
  EXPECT_ERROR_CONTAINS(packer.Fits(ragged), InvalidArgumentError, "length 4");
  NestedMap grouped;
  grouped.Set("src.ids", at::zeros({2}, at::kLong));
  EXPECT_ERROR_CONTAINS(packer.Fits(grouped), InvalidArgumentError, "group 'src', which has no row length");
}

// TextLmInput with packed_input over a file of lines: every line is in the batches exactly once
// (its tokens, as a segment of its own), rows never exceed target_max_length, and lines too long
// for a row are truncated as unpacked ones are.
TEST(SequencePacker, TextLmInputPacksEveryLineOnce) {
  const fs::path dir = ::glossa::testing::TestRoot() / "packer";
  fs::create_directories(dir);
  const std::string file = (dir / "lines.txt").string();
  int64_t want_tokens = 0, want_lines = 0;
  {
    std::ofstream out(file);
    for (int i = 0; i < 200; ++i) {
      const int words = 1 + (i * 7) % 13;
      std::string line;
      for (int w = 0; w < words; ++w) line += (w ? " " : "") + std::string(1, 'a' + (i + w) % 26);
      out << line << "\n";
      // AsciiTokenizer: one id a character, plus </s> (labels) / <s> (ids).
      want_tokens += std::min<int64_t>(static_cast<int64_t>(line.size()) + 1, 16);
      ++want_lines;
    }
  }
  Params p = TextLmInput::Params();
  p.Set("name", "input").Set("file_pattern", "text:" + file).Set("target_max_length", 16);
  p.Set("repeat_count", 1).Set("require_sequential_order", true).Set("file_parallelism", 1);
  p.Set("packed_input", true).Set("packed_rows", 4);
  auto input = InstantiateLayer<BaseInputGenerator>(p);
  EXPECT_EQ(input->InfeedBatchSize(), 4);
  int64_t tokens = 0, segments = 0, rows = 0, cells = 0;
  while (true) {
    NestedMap b;
    try {
      b = input->GetPreprocessedInputBatch();
    } catch (const OutOfRangeError&) {
      break;
    }
    const at::Tensor pad = b.GetTensor("paddings"), seg = b.GetTensor("segment_ids");
    ASSERT_LE(b.GetTensor("ids").size(1), 16);
    ASSERT_LE(b.GetTensor("ids").size(0), 4);
    tokens += static_cast<int64_t>((pad < 0.5).sum().item<int64_t>());
    // Padded exactly where the segment is 0.
    EXPECT_TRUE(at::equal(pad > 0.5, seg == 0));
    segments += std::get<0>(seg.max(1)).sum().item<int64_t>();
    rows += pad.size(0);
    cells += pad.numel();
  }
  EXPECT_EQ(tokens, want_tokens);
  EXPECT_EQ(segments, want_lines);
  // Packing fills the rows: under a tenth of the cells are padding here (lines of 2 to 26
  // characters in rows of 16).
  EXPECT_GT(static_cast<double>(tokens) / static_cast<double>(cells), 0.9) << rows << " rows";
  p.Set("packed_rows", 0);
  EXPECT_THROW(InstantiateLayer<BaseInputGenerator>(p), InvalidArgumentError);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace glossa
