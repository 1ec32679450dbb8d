#include "glossa/io/record_io.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "glossa/base/crc32c.h"
#include "glossa/base/strings.h"
#include "glossa/io/example.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  fs::path dir = ::glossa::testing::TestRoot() / "io_test";
  fs::create_directories(dir);
  return dir.string();
}

std::vector<std::string> ReadAll(const std::string& type, const std::string& path,
                                 RecordReaderOptions options = {}) {
  auto reader = RecordReader::Open(type, path, options);
  std::vector<std::string> out;
  std::string r;
  while (reader->Next(&r)) out.push_back(r);
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

TEST(Crc32c, KnownValuesAndHardwareMatchesPortable) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // the standard CRC-32C check value
  EXPECT_EQ(Crc32c("", 0), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);  // RFC 3720 test vector
  std::mt19937 rng(1);
  // Every short length (the hardware path's leading partial word, its shift of the incoming state
  // by a table of x^(8n) up to 4,096 bytes), longer inputs past the table, misaligned starts.
  std::vector<int> lengths;
  for (int n = 1; n <= 1600; ++n) lengths.push_back(n);
  for (int n : {4095, 4096, 4097, 4103, 100003}) lengths.push_back(n);
  for (int n : lengths) {
    std::string data(n, '\0');
    for (auto& c : data) c = static_cast<char>(rng());
    EXPECT_EQ(Crc32c(data), Crc32cExtendPortable(0, data.data(), data.size())) << n;
    EXPECT_EQ(Crc32cExtend(Crc32c(data.data(), n / 2), data.data() + n / 2, n - n / 2),
              Crc32c(data));
    for (int skip = 1; skip < 4 && skip < n; ++skip) {
      EXPECT_EQ(Crc32c(data.data() + skip, n - skip),
                Crc32cExtendPortable(0, data.data() + skip, n - skip))
          << n << " from byte " << skip;
    }
  }
  EXPECT_EQ(UnmaskCrc(MaskCrc(0x12345678u)), 0x12345678u);
}

TEST(TFRecord, RoundTripsPlainAndGzipWithOffsets) {
  const std::string dir = TempDir();
  std::vector<std::string> records = {"", "a", std::string(100000, 'x'), "last"};
  for (bool gzip : {false, true}) {
    const std::string path = dir + (gzip ? "/r.tfrecord.gz" : "/r.tfrecord");
    {
      TFRecordWriter w(path, gzip);
      for (const auto& r : records) w.Write(r);
    }
    EXPECT_EQ(ReadAll(gzip ? "tfrecord_gzip" : "tfrecord", path), records);
  }
  auto reader = RecordReader::Open("tfrecord", dir + "/r.tfrecord");
  std::string r;
  reader->Next(&r);
  EXPECT_EQ(reader->offset(), 16u);  // 12 header + 0 data + 4 crc
  reader->Next(&r);
  EXPECT_EQ(reader->offset(), 16u + 17u);
  // A plain file is exactly the concatenated frames.
  std::string expected;
  for (const auto& rec : records) expected += TFRecordFrame(rec);
  EXPECT_EQ(ReadFile(dir + "/r.tfrecord"), expected);
}

TEST(TFRecord, CorruptAndTruncatedRecordsAreDataLossWithFileAndOffset) {
  const std::string dir = TempDir();
  const std::string good =
      TFRecordFrame("first") + TFRecordFrame("second") + TFRecordFrame("third");
  std::string bad_data = good;
  bad_data[21 + 12 + 2] ^= 1;  // a byte of "second"'s data (first frame is 12 + 5 + 4 = 21)
  WriteFile(dir + "/bad_data", bad_data);
  EXPECT_ERROR_MESSAGE(
      ReadAll("tfrecord", dir + "/bad_data"), DataLossError,
      "'" + dir + "/bad_data': corrupt record data (CRC mismatch) at byte offset 21");
  RecordReaderOptions skip;
  skip.skip_corrupt_records = true;
  auto reader = RecordReader::Open("tfrecord", dir + "/bad_data", skip);
  std::vector<std::string> got;
  std::string r;
  while (reader->Next(&r)) got.push_back(r);
  EXPECT_EQ(got, (std::vector<std::string>{"first", "third"}));
  EXPECT_EQ(reader->num_corrupt_skipped(), 1);

  std::string bad_len = good;
  bad_len[21] ^= 1;
  WriteFile(dir + "/bad_len", bad_len);
  EXPECT_ERROR_CONTAINS(ReadAll("tfrecord", dir + "/bad_len"), DataLossError,
                        "corrupt record length (CRC mismatch) at byte offset 21");
  EXPECT_EQ(ReadAll("tfrecord", dir + "/bad_len", skip), (std::vector<std::string>{"first"}));

  WriteFile(dir + "/truncated", good.substr(0, good.size() - 3));
  EXPECT_ERROR_CONTAINS(ReadAll("tfrecord", dir + "/truncated"), DataLossError,
                        "truncated record: 6 of 9 data and CRC bytes at byte offset 43");
  WriteFile(dir + "/short_header", good.substr(0, 21 + 5));
  EXPECT_ERROR_CONTAINS(ReadAll("tfrecord", dir + "/short_header"), DataLossError,
                        "truncated record header (5 of 12 bytes) at byte offset 21");
  RecordReaderOptions small;
  small.max_record_size = 3;
  EXPECT_ERROR_CONTAINS(ReadAll("tfrecord", dir + "/truncated", small), DataLossError,
                        "exceeds max_record_size 3");
  EXPECT_ERROR_CONTAINS(ReadAll("tfrecord", dir + "/missing"), NotFoundError,
                        "record file '" + dir + "/missing' does not exist");
  EXPECT_ERROR_CONTAINS(ReadAll("text", "/dev/zero"), InvalidArgumentError,
                        "record file '/dev/zero' is a character device, not a regular file");
  EXPECT_ERROR_CONTAINS(RecordReader::Open("csv", dir + "/x"), InvalidArgumentError,
                        "unknown record file type 'csv'");
  WriteFile(dir + "/not_gzip", "this is not gzip data at all, but gzread passes it through");
  EXPECT_THROW(ReadAll("tfrecord_gzip", dir + "/not_gzip"), DataLossError);
}

// Thousands of records of random sizes, some larger than the reader's window, so that frames
// straddle every refill: each comes back whole, with the offset after it at its frame's end, from
// plain and gzip files; a corrupt one among them is skipped without losing its neighbours.
TEST(TFRecord, RecordsAcrossWindowRefillsAndLargerThanTheWindow) {
  const std::string dir = TempDir();
  std::mt19937 rng(7);
  std::vector<std::string> records;
  for (int i = 0; i < 3000; ++i) {
    const size_t n = i % 700 == 5 ? 200000 + rng() % 1000 : rng() % 300;
    std::string r(n, '\0');
    for (auto& c : r) c = static_cast<char>(rng());
    records.push_back(std::move(r));
  }
  RecordReaderOptions small_window;
  small_window.buffer_size = 1;  // the smallest window the reader allows (64 KiB)
  for (bool gzip : {false, true}) {
    const std::string path = dir + (gzip ? "/many.tfrecord.gz" : "/many.tfrecord");
    {
      TFRecordWriter w(path, gzip);
      for (const auto& r : records) w.Write(r);
    }
    auto reader = RecordReader::Open(gzip ? "tfrecord_gzip" : "tfrecord", path, small_window);
    std::string r;
    uint64_t end = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      ASSERT_TRUE(reader->Next(&r)) << i;
      ASSERT_EQ(r, records[i]) << "record " << i << (gzip ? " (gzip)" : "");
      end += 16 + records[i].size();
      ASSERT_EQ(reader->offset(), end) << i;
    }
    EXPECT_FALSE(reader->Next(&r));
    // The same through NextView: views into the window, refills in between, mixed with Next.
    auto viewer = RecordReader::Open(gzip ? "tfrecord_gzip" : "tfrecord", path, small_window);
    std::string_view v;
    end = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      if (i % 3 == 2) {
        ASSERT_TRUE(viewer->Next(&r)) << i;
        ASSERT_EQ(r, records[i]) << "record " << i;
      } else {
        ASSERT_TRUE(viewer->NextView(&v)) << i;
        ASSERT_EQ(v, records[i]) << "view " << i << (gzip ? " (gzip)" : "");
      }
      end += 16 + records[i].size();
      ASSERT_EQ(viewer->offset(), end) << i;
    }
    EXPECT_FALSE(viewer->NextView(&v));
  }
  std::string bytes = ReadFile(dir + "/many.tfrecord");
  uint64_t at = 0;
  for (int i = 0; i < 1400; ++i) at += 16 + records[i].size();
  bytes[at + 12 + records[1400].size() / 2] ^= 0x40;  // the data of record 1400 (not empty)
  ASSERT_FALSE(records[1400].empty());
  WriteFile(dir + "/one_bad", bytes);
  RecordReaderOptions skip = small_window;
  skip.skip_corrupt_records = true;
  std::vector<std::string> expected = records;
  expected.erase(expected.begin() + 1400);
  EXPECT_EQ(ReadAll("tfrecord", dir + "/one_bad", skip), expected);
  EXPECT_ERROR_CONTAINS(ReadAll("tfrecord", dir + "/one_bad", small_window), DataLossError,
                        StrCat("corrupt record data (CRC mismatch) at byte offset ", at));
  auto viewer = RecordReader::Open("tfrecord", dir + "/one_bad", skip);
  std::string_view v;
  size_t n = 0;
  while (viewer->NextView(&v)) ASSERT_EQ(v, expected[n++]) << n;
  EXPECT_EQ(n, expected.size());
  EXPECT_EQ(viewer->num_corrupt_skipped(), 1);
}

TEST(TextRecords, OneRecordPerLine) {
  const std::string dir = TempDir();
  WriteFile(dir + "/t.txt", "one\ntwo\r\n\nthree");
  EXPECT_EQ(ReadAll("text", dir + "/t.txt"), (std::vector<std::string>{"one", "two", "", "three"}));
  WriteFile(dir + "/e.txt", "");
  EXPECT_TRUE(ReadAll("text", dir + "/e.txt").empty());
  std::string big(200000, 'y');
  WriteFile(dir + "/big.txt", big + "\nz\n");
  EXPECT_EQ(ReadAll("text", dir + "/big.txt"), (std::vector<std::string>{big, "z"}));
  auto reader = RecordReader::Open("text", dir + "/t.txt");
  std::string_view v;
  std::vector<std::string> got;
  while (reader->NextView(&v)) got.emplace_back(v);
  EXPECT_EQ(got, (std::vector<std::string>{"one", "two", "", "three"}));
}

TEST(TFRecord, GzipTypeOnAFileThatIsNotGzipIsAnError) {
  const std::string dir = TempDir();
  {
    TFRecordWriter w(dir + "/plain.tfrecord");
    w.Write("payload");
    w.Close();
  }
  EXPECT_ERROR_CONTAINS(RecordReader::Open("tfrecord_gzip", dir + "/plain.tfrecord"), DataLossError,
                        "is not a gzip file (no gzip magic in its first 2 bytes)");
  WriteFile(dir + "/empty", "");
  EXPECT_ERROR_CONTAINS(RecordReader::Open("tfrecord_gzip", dir + "/empty"), DataLossError,
                        "is not a gzip file (shorter than its first 2 bytes)");
}

std::string TestData(const std::string& name) {
  return testing::SourcePath("../shared/testdata/lingvo/" + name);
}

TEST(TFRecord, ReadsTensorFlowWrittenWmtFile) {
  const std::string path = TestData("wmt14_ende_wpm_32k_test.tfrecord");
  if (!fs::exists(path)) GTEST_SKIP() << "../shared/testdata is absent: " << path;
  FeatureSpecs spec;
  for (const char* k : {"source_id", "target_id", "target_label", "natural_order"}) {
    spec[k] = FeatureSpec::VarLen(FeatureType::kInt64);
  }
  spec["example_index"] = FeatureSpec::VarLen(FeatureType::kInt64);
  for (const char* k : {"source_padding", "target_padding", "target_weight"}) {
    spec[k] = FeatureSpec::VarLen(FeatureType::kFloat);
  }
  spec["source_word"] = FeatureSpec::VarLen(FeatureType::kBytes);
  spec["target_word"] = FeatureSpec::VarLen(FeatureType::kBytes);
  auto reader = RecordReader::Open("tfrecord", path);
  std::string r;
  int n = 0;
  while (reader->Next(&r)) {
    NestedMap ex = ParseExample(r, spec, StrCat(path, " record ", n));
    EXPECT_EQ(ex.GetTensor("source_id").numel(), ex.GetTensor("source_padding").numel());
    EXPECT_EQ(ex.GetTensor("target_id").numel(), ex.GetTensor("target_label").numel());
    EXPECT_GT(ex.GetTensor("source_id").numel(), 0);
    EXPECT_TRUE(ex.GetItem("source_word").is_list());
    ++n;
  }
  EXPECT_EQ(n, 100);
}

TEST(TFRecord, ReadsTheWmtShardWithEveryCrcChecked) {
  const std::string path = TestData("translate_ende_wmt32k-train-00511-of-00512");
  if (!fs::exists(path)) GTEST_SKIP() << "../shared/testdata is absent: " << path;
  FeatureSpecs spec = {{"inputs", FeatureSpec::VarLen(FeatureType::kInt64)},
                       {"targets", FeatureSpec::VarLen(FeatureType::kInt64)}};
  auto reader = RecordReader::Open("tfrecord", path);
  std::string r;
  int64_t n = 0, tokens = 0;
  while (reader->Next(&r)) {
    NestedMap ex = ParseExample(r, spec);
    tokens += ex.GetTensor("inputs").numel() + ex.GetTensor("targets").numel();
    ++n;
  }
  EXPECT_EQ(n, 8941);
  EXPECT_GT(tokens, 8941 * 2);
  EXPECT_EQ(reader->offset(), fs::file_size(path));
}

TEST(Example, ParsesBySpecWithDefaultsAndClearErrors) {
  std::string ex = ExampleBuilder()
                       .Int64("ids", {3, 4, 5})
                       .Float("scores", {0.5f, 1.5f})
                       .Bytes("words", {"a", "b"})
                       .Bytes("title", {"t"})
                       .Serialize();
  FeatureSpecs spec = {
      {"ids", FeatureSpec::VarLen(FeatureType::kInt64)},
      {"scores", FeatureSpec::Fixed(FeatureType::kFloat, {2})},
      {"words", FeatureSpec::VarLen(FeatureType::kBytes)},
      {"title", FeatureSpec::Fixed(FeatureType::kBytes)},
      {"weight", FeatureSpec::Fixed(FeatureType::kFloat, {}, std::vector<double>{1.0})},
      {"extra", FeatureSpec::VarLen(FeatureType::kInt64)},
      {"grid", FeatureSpec::Fixed(FeatureType::kInt64, {2, 2}, std::vector<double>{7})},
  };
  NestedMap m = ParseExample(ex, spec);
  EXPECT_TRUE(at::equal(m.GetTensor("ids"), at::tensor({3, 4, 5}, at::kLong)));
  EXPECT_TRUE(at::equal(m.GetTensor("scores"), at::tensor({0.5f, 1.5f})));
  EXPECT_EQ(m.GetItem("words").AsList()[1].AsString(), "b");
  EXPECT_EQ(m.GetItem("title").AsString(), "t");
  EXPECT_EQ(m.GetTensor("weight").item<float>(), 1.0f);
  EXPECT_EQ(m.GetTensor("extra").numel(), 0);
  EXPECT_TRUE(at::equal(m.GetTensor("grid"), at::full({2, 2}, 7, at::kLong)));
  EXPECT_ERROR_MESSAGE(
      ParseExample(ex, {{"ids", FeatureSpec::VarLen(FeatureType::kFloat)}}, "f.rec record 3"),
      InvalidArgumentError,
      "f.rec record 3: feature 'ids' is a int64_list, but the spec wants float_list");
  EXPECT_ERROR_CONTAINS(
      ParseExample(ex, {{"scores", FeatureSpec::Fixed(FeatureType::kFloat, {3})}}),
      InvalidArgumentError, "has 2 values, but the spec's shape needs 3");
  EXPECT_ERROR_CONTAINS(ParseExample(ex, {{"nope", FeatureSpec::Fixed(FeatureType::kInt64)}}),
                        InvalidArgumentError, "feature 'nope' is missing and has no default");
  EXPECT_ERROR_CONTAINS(ParseExample("\xff\xff\xff garbage", {}, "x"), DataLossError,
                        "not a valid tf.train.Example");
}

}  // namespace
}  // namespace glossa
