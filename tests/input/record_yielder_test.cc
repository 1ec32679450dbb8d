#include "glossa/input/record_yielder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "glossa/base/strings.h"
#include "glossa/io/record_io.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

// Writes `num_files` tfrecord files "<prefix>-0000i-of-0000N" with records "<tag><file>:<i>".
std::string MakeShards(const std::string& name, int num_files, int per_file,
                       const std::string& tag = "r") {
  fs::path dir = ::glossa::testing::TestRoot() / "yielder";
  fs::create_directories(dir);
  const std::string base = (dir / name).string();
  for (int f = 0; f < num_files; ++f) {
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), "-%05d-of-%05d", f, num_files);
    TFRecordWriter w(base + suffix);
    for (int i = 0; i < per_file; ++i) w.Write(StrCat(tag, f, ":", i));
  }
  return base;
}

std::vector<std::string> Take(RecordYielder& y, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(y.Next().value);
  return out;
}

TEST(FilePatterns, ShardedNamesGlobsAndListsExpand) {
  const std::string base = MakeShards("pat", 3, 1);
  EXPECT_EQ(ExpandFilePattern("tfrecord:" + base + "@3").files.size(), 3u);
  EXPECT_EQ(ExpandFilePattern("tfrecord:" + base + "@*").files.size(), 3u);
  EXPECT_EQ(ExpandFilePattern("tfrecord:" + base + "-0000[01]*").files.size(), 2u);
  auto list =
      ExpandFilePattern("tfrecord_gzip:" + base + "-00000-of-00003," + base + "-00002-of-00003");
  EXPECT_EQ(list.type, "tfrecord_gzip");
  EXPECT_EQ(list.files.size(), 2u);
  EXPECT_ERROR_MESSAGE(ExpandFilePattern("tfrecord:/no/such/dir/*"), NotFoundError,
                       "file pattern 'tfrecord:/no/such/dir/*' matches no files");
  EXPECT_ERROR_CONTAINS(ExpandFilePattern("tfrecord:" + base + "@4"), NotFoundError,
                        "-00000-of-00004 not found");
  EXPECT_ERROR_CONTAINS(ExpandFilePattern("/no/type"), InvalidArgumentError,
                        "must be <type>:<pattern>");
  EXPECT_ERROR_CONTAINS(ExpandFilePattern("csv:/x"), InvalidArgumentError, "unknown type 'csv'");
}

TEST(RecordYielder, EveryRecordExactlyOncePerEpochAndReshuffled) {
  const std::string base = MakeShards("epochs", 4, 25);
  YielderOptions o;
  o.file_pattern = {"tfrecord:" + base + "@4"};
  o.file_buffer_size = 30;
  o.file_parallelism = 3;
  o.file_random_seed = 7;
  RecordYielder y(o);
  std::vector<std::string> first = Take(y, 100), second = Take(y, 100);
  EXPECT_EQ(std::set<std::string>(first.begin(), first.end()).size(), 100u);
  EXPECT_EQ(std::set<std::string>(second.begin(), second.end()).size(), 100u);
  EXPECT_NE(first, second);  // a new order each epoch
  EXPECT_EQ(y.current_epoch(), 2);
}

TEST(RecordYielder, SequentialOrderWithRepeatCountThenOutOfRange) {
  const std::string base = MakeShards("seq", 2, 3);
  YielderOptions o;
  o.file_pattern = {"tfrecord:" + base + "@2"};
  o.require_sequential_order = true;
  o.repeat_count = 2;
  RecordYielder y(o);
  std::vector<std::string> expected = {"r0:0", "r0:1", "r0:2", "r1:0", "r1:1", "r1:2"};
  EXPECT_EQ(Take(y, 6), expected);
  EXPECT_EQ(Take(y, 6), expected);
  EXPECT_ERROR_CONTAINS(y.Next(), OutOfRangeError, "end of input");
  EXPECT_THROW(y.Next(), OutOfRangeError);  // stays at the end
}

TEST(RecordYielder, SameSeedSameOrderZeroSeedDiffers) {
  const std::string base = MakeShards("seeds", 3, 20);
  YielderOptions o;
  o.file_pattern = {"tfrecord:" + base + "@3"};
  o.file_parallelism = 1;  // one reader: the order depends on the seeds only
  o.file_buffer_size = 10;
  o.file_random_seed = 11;
  RecordYielder a(o), b(o);
  EXPECT_EQ(Take(a, 60), Take(b, 60));
  o.file_random_seed = 0;
  RecordYielder c(o), d(o);
  EXPECT_NE(Take(c, 60), Take(d, 60));
}

TEST(RecordYielder, ReplicasShardRecordsDisjointly) {
  const std::string base = MakeShards("replicas", 3, 10);
  std::multiset<std::string> all;
  for (int r = 0; r < 3; ++r) {
    YielderOptions o;
    o.file_pattern = {"tfrecord:" + base + "@3"};
    o.num_input_replicas = 3;
    o.input_replica_id = r;
    o.repeat_count = 1;
    RecordYielder y(o);
    int n = 0;
    try {
      while (true) {
        all.insert(y.Next().value);
        ++n;
      }
    } catch (const OutOfRangeError&) {
    }
    EXPECT_EQ(n, 10) << "replica " << r;
  }
  EXPECT_EQ(all.size(), 30u);
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), 30u);
  YielderOptions bad;
  bad.file_pattern = {"tfrecord:" + base + "@3"};
  bad.num_input_replicas = 2;
  bad.input_replica_id = 2;
  EXPECT_THROW(RecordYielder{bad}, InvalidArgumentError);
}

TEST(RecordYielder, MixesSourcesByWeightAndTagsSourceIds) {
  const std::string a = MakeShards("mix_a", 1, 50, "a"), b = MakeShards("mix_b", 1, 50, "b");
  YielderOptions o;
  o.file_pattern = {"tfrecord:" + a + "@1", "tfrecord:" + b + "@1"};
  o.input_source_weights = {0.3, 0.7};
  o.file_buffer_size = 16;
  RecordYielder y(o);
  int from_a = 0;
  const int n = 10000;
  for (int i = 0; i < n; ++i) {
    Record r = y.Next();
    EXPECT_EQ(r.source_id, r.value[0] == 'a' ? 0 : 1);
    from_a += r.source_id == 0;
  }
  EXPECT_NEAR(from_a / static_cast<double>(n), 0.3, 0.01);
  o.input_source_weights = {1.0};
  EXPECT_ERROR_CONTAINS(RecordYielder{o}, InvalidArgumentError, "2 file patterns need as many");
}

TEST(RecordYielder, CorruptFilesAreDataLossOrSkipped) {
  const std::string base = MakeShards("corrupt", 1, 5);
  const std::string path = base + "-00000-of-00001";
  std::string data;
  {
    std::ifstream in(path, std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  data[12 + 1] ^= 0x40;  // first record's data
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
  YielderOptions o;
  o.file_pattern = {"tfrecord:" + path};
  o.repeat_count = 1;
  RecordYielder y(o);
  EXPECT_ERROR_CONTAINS(y.Next(), DataLossError, path + "': corrupt record data");
  o.skip_corrupt_records = true;
  RecordYielder s(o);
  int n = 0;
  try {
    while (true) {
      s.Next();
      ++n;
    }
  } catch (const OutOfRangeError&) {
  }
  EXPECT_EQ(n, 4);
  EXPECT_EQ(s.num_corrupt_skipped(), 1);
}

TEST(RecordYielder, ReadsTextFiles) {
  fs::path dir = ::glossa::testing::TestRoot() / "yielder";
  fs::create_directories(dir);
  std::ofstream(dir / "lines.txt") << "a\nb\nc\n";
  YielderOptions o;
  o.file_pattern = {"text:" + (dir / "lines.txt").string()};
  o.require_sequential_order = true;
  o.repeat_count = 1;
  RecordYielder y(o);
  EXPECT_EQ(Take(y, 3), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_THROW(y.Next(), OutOfRangeError);
}

TEST(RecordYielder, AFullPassWithNoRecordsIsAnErrorNotAHang) {
  fs::path dir = ::glossa::testing::TestRoot() / "yielder";
  fs::create_directories(dir);
  std::ofstream(dir / "empty.txt").close();
  YielderOptions o;
  o.file_pattern = {"text:" + (dir / "empty.txt").string()};
  o.repeat_count = -1;  // forever: used to restart empty epochs without end
  RecordYielder empty(o);
  EXPECT_ERROR_CONTAINS(empty.Next(), InvalidArgumentError,
                        "empty.txt': a full pass over 1 file(s) yielded no records");
  EXPECT_THROW(empty.Next(), InvalidArgumentError);  // and again, not a hang
  // Every record corrupt, skipped: the same, with the count.
  const std::string base = MakeShards("all_corrupt", 1, 1);
  const std::string path = base + "-00000-of-00001";
  std::string data;
  {
    std::ifstream in(path, std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  data[12 + 1] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
  o.file_pattern = {"tfrecord:" + path};
  o.skip_corrupt_records = true;
  RecordYielder corrupt(o);
  EXPECT_ERROR_CONTAINS(corrupt.Next(), InvalidArgumentError,
                        "yielded no records (1 corrupt records skipped)");
}

}  // namespace
}  // namespace glossa
