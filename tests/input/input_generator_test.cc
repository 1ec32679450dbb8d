#include "glossa/input/input_generator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "glossa/base/strings.h"
#include "glossa/core/hyperparams.pb.h"
#include "glossa/io/example.h"
#include "glossa/io/record_io.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

fs::path Dir() {
  fs::path dir = ::glossa::testing::TestRoot() / "inputgen";
  fs::create_directories(dir);
  return dir;
}

std::string TestData(const std::string& name) {
  return testing::SourcePath("../shared/testdata/lingvo/" + name);
}

std::vector<int64_t> Values(BaseInputGenerator& input) {
  std::vector<int64_t> out;
  try {
    while (true)
      out.push_back(input.GetPreprocessedInputBatch().GetTensor("value").item<int64_t>());
  } catch (const OutOfRangeError&) {
  }
  return out;
}

std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(i);
  return v;
}

TEST(DatasetInput, RangeYieldsThenEndsWithOutOfRange) {
  Params p = DatasetInput::ParamsFor("glossa.input.Range");
  p.Set("name", "range");
  EXPECT_EQ(p.GetInt("args.begin"), 0);
  EXPECT_EQ(p.GetInt("args.end"), 10);
  auto input = InstantiateLayer<BaseInputGenerator>(p);
  EXPECT_EQ(Values(*input), Range(10));
  input->Reset();
  EXPECT_EQ(Values(*input), Range(10));
}

TEST(DatasetInput, ArgsRoundTripThroughProtoAndStillInstantiate) {
  Params p = DatasetInput::ParamsFor("glossa.input.Range");
  p.Set("name", "range").Set("args.begin", 3);
  Params q = Params::FromProtoBytes(p.ToProtoBytes());
  EXPECT_EQ(q.GetInt("args.begin"), 3);
  auto input = InstantiateLayer<BaseInputGenerator>(q);
  EXPECT_EQ(Values(*input), (std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9}));
}


// A dataset function bound to an object: only its declared argument is exposed.
class CountingSource {
 public:
  explicit CountingSource(int64_t offset) : offset_(offset) {}
  std::unique_ptr<Dataset> Make(const Params& args) const {
    class D : public Dataset {
     public:
      D(int64_t start, int64_t n, bool repeat) : start_(start), n_(n), repeat_(repeat) {}
      NestedMap Next() override {
        if (i_ >= n_) {
          if (!repeat_) throw OutOfRangeError("end of input");
          i_ = 0;
        }
        return NestedMap{{"value", at::full({}, start_ + i_++, at::kLong)}};
      }

     private:
      int64_t start_, n_, i_ = 0;
      bool repeat_;
    };
    return std::make_unique<D>(offset_, args.GetInt("n"), args.GetBool("repeat"));
  }

 private:
  int64_t offset_;
};

TEST(DatasetInput, BoundFunctionsRequiredArgsIgnoreArgsAndRepeat) {
  static CountingSource source(100);
  const std::vector<DatasetArg> args = {{"n", std::nullopt, "How many."},
                                         {"repeat", ParamValue(false), "Repeat forever."},
                                         {"unused", ParamValue(1), "Ignored."}};
  RegisterDatasetFn(
      "glossa.testing.Counting", args, [](const Params& a) { return source.Make(a); }, "",
      {.ignore_args = {"unused"}});
  Params p = DatasetInput::ParamsFor("glossa.testing.Counting");
  p.Set("name", "count");
  EXPECT_TRUE(p.Get("args.n").is_none());
  EXPECT_FALSE(p.GetParams("args").Contains("self"));
  EXPECT_FALSE(p.GetParams("args").Contains("unused"));  // ignored by the definition
  EXPECT_ERROR_CONTAINS(InstantiateLayer<BaseInputGenerator>(p), InvalidArgumentError,
                        "argument 'n' of glossa.testing.Counting has no default and must be set");
  p.Set("args.n", 3);
  auto once = InstantiateLayer<BaseInputGenerator>(p);
  EXPECT_EQ(Values(*once), (std::vector<int64_t>{100, 101, 102}));
  p.Set("args.repeat", true);
  auto forever = InstantiateLayer<BaseInputGenerator>(p);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(forever->GetPreprocessedInputBatch().GetTensor("value").item<int64_t>(), 100 + i % 3);
  }
  EXPECT_ERROR_CONTAINS(DatasetInput::ParamsFor("glossa.testing.Countin"), NotFoundError,
                        "did you mean");
  EXPECT_THROW(RegisterDatasetFn("glossa.testing.Counting", {}, nullptr), InvalidArgumentError);
  // map_args belong to the definition: the mapped argument leaves p.args (Lingvo asserts
  // 'end' not in p.args) and takes the layer param's value.
  RegisterDatasetFn(
      "glossa.testing.CountingToNumSamples", args, [](const Params& a) { return source.Make(a); },
      "", {.ignore_args = {"unused"}, .map_args = {{"n", "num_samples"}}});
  Params mapped = DatasetInput::ParamsFor("glossa.testing.CountingToNumSamples");
  EXPECT_FALSE(mapped.GetParams("args").Contains("n"));
  EXPECT_EQ(mapped.Get("map_args").AsDict().at("n").AsString(), "num_samples");
  mapped.Set("name", "mapped").Set("num_samples", 4);
  auto four = InstantiateLayer<BaseInputGenerator>(mapped);
  EXPECT_EQ(Values(*four), (std::vector<int64_t>{100, 101, 102, 103}));
  // A mapped argument that is also in p.args is an error, as is a bad definition.
  Params both = mapped.Copy();
  Params with_n = both.GetParams("args").Copy();
  with_n.Define("n", 2, "");
  both.Set("args", with_n);
  EXPECT_ERROR_CONTAINS(InstantiateLayer<BaseInputGenerator>(both), InvalidArgumentError,
                        "argument 'n' is taken from p.num_samples (map_args) and must not be in "
                        "p.args");
  EXPECT_ERROR_CONTAINS(RegisterDatasetFn("glossa.testing.Bad1", args, nullptr, "",
                                          {.map_args = {{"nope", "num_samples"}}}),
                        InvalidArgumentError, "map_args names 'nope'");
  EXPECT_ERROR_CONTAINS(
      RegisterDatasetFn("glossa.testing.Bad2", args, nullptr, "", {.ignore_args = {"n"}}),
      InvalidArgumentError, "ignore_args 'n' has no default to apply");
}

TEST(InputGenerator, SplitInputBatchAndBatchSizes) {
  NestedMap batch{{"x", at::arange(12).view({6, 2})}, {"y", at::arange(6)}};
  auto parts = BaseInputGenerator::SplitInputBatch(batch, 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_TRUE(at::equal(parts[1].GetTensor("y"), at::tensor({2, 3}, at::kLong)));
  EXPECT_EQ(parts[2].GetTensor("x").sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_ERROR_CONTAINS(BaseInputGenerator::SplitInputBatch(batch, 4), InvalidArgumentError,
                        "does not divide into 4 splits");
  Params p = DatasetInput::ParamsFor("glossa.input.Range");
  p.Set("name", "r").Set("batch_size", 8).Set("num_input_replicas", 4);
  auto input = InstantiateLayer<BaseInputGenerator>(p);
  EXPECT_EQ(input->InfeedBatchSize(), 8);
  EXPECT_EQ(input->GlobalBatchSize(), 32);
}

std::string WriteExamples(const std::string& name, int n) {
  const std::string path = (Dir() / name).string();
  TFRecordWriter w(path);
  for (int i = 0; i < n; ++i) {
    w.Write(ExampleBuilder().Int64("id", {i}).Float("x", {i * 0.5f, 1.0f}).Serialize());
  }
  return path;
}

Params ExampleInput(const std::string& path, int64_t batch, int64_t epochs) {
  Params p = ExampleFileInput::Params();
  p.Set("name", "examples")
      .Set("input_files", path)
      .Set("batch_size", batch)
      .Set("num_epochs", epochs);
  p.Set("features", ParamValue::Dict{{"id", ExampleFileInput::FeatureParams("int64")},
                                     {"x", ExampleFileInput::FeatureParams("float", {2})}});
  return p;
}

TEST(ExampleFileInput, EpochsAndDropRemainder) {
  const std::string three = WriteExamples("three.tfrecord", 3);
  auto input = InstantiateLayer<BaseInputGenerator>(ExampleInput(three, 3, 7));
  int batches = 0;
  try {
    while (true) {
      NestedMap b = input->GetPreprocessedInputBatch();
      EXPECT_EQ(b.GetTensor("id").sizes(), (std::vector<int64_t>{3}));
      EXPECT_EQ(b.GetTensor("id").sum().item<int64_t>(), 0 + 1 + 2);  // one epoch per batch
      ++batches;
    }
  } catch (const OutOfRangeError&) {
  }
  EXPECT_EQ(batches, 7);
  const std::string ten = WriteExamples("ten.tfrecord", 10);
  auto big = InstantiateLayer<BaseInputGenerator>(ExampleInput(ten, 200, -1));
  NestedMap b = big->GetPreprocessedInputBatch();
  EXPECT_EQ(b.GetTensor("x").sizes(), (std::vector<int64_t>{200, 2}));
  auto partial = InstantiateLayer<BaseInputGenerator>(ExampleInput(ten, 4, 1));
  EXPECT_NO_THROW(partial->GetPreprocessedInputBatch());
  EXPECT_NO_THROW(partial->GetPreprocessedInputBatch());
  EXPECT_THROW(partial->GetPreprocessedInputBatch(), OutOfRangeError);  // 2 left: dropped
}

TEST(ExampleFileInput, ReadsTheTensorFlowWrittenWmtFile) {
  const std::string path = TestData("wmt14_ende_wpm_32k_test.tfrecord");
  if (!fs::exists(path)) GTEST_SKIP() << "../shared/testdata is absent: " << path;
  Params p = ExampleFileInput::Params();
  p.Set("name", "wmt").Set("input_files", path).Set("batch_size", 10).Set("num_epochs", 1);
  p.Set("features",
        ParamValue::Dict{{"source_id", ExampleFileInput::FeatureParams("int64", {}, true)},
                         {"target_weight", ExampleFileInput::FeatureParams("float", {}, true)}});
  auto input = InstantiateLayer<BaseInputGenerator>(p);
  int batches = 0;
  try {
    while (true) {
      NestedMap b = input->GetPreprocessedInputBatch();
      EXPECT_EQ(b.GetTensor("source_id").size(0), 10);
      ++batches;
    }
  } catch (const OutOfRangeError&) {
  }
  EXPECT_EQ(batches, 10);
}

TEST(TextLmInput, TokenizesBucketsAndPads) {
  const fs::path file = Dir() / "lm.txt";
  std::ofstream(file) << "hello world\nhi\n\nthe quick brown fox jumps over the lazy dog\nok\n";
  Params p = TextLmInput::Params();
  p.Set("name", "lm")
      .Set("file_pattern", "text:" + file.string())
      .Set("require_sequential_order", true);
  p.Set("repeat_count", 1)
      .Set("bucket_upper_bound", ParamValue::List{5, 20})
      .Set("bucket_batch_limit", ParamValue::List{2, 2});
  auto input = InstantiateLayer<TextLmInput>(p);
  // "hi" (3 with </s>) and "ok" fill bucket 0; "hello world" (12) waits in bucket 1, the long
  // line (45) is too long.
  NestedMap b = input->GetPreprocessedInputBatch();
  EXPECT_EQ(b.GetTensor("ids").sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(at::equal(b.GetTensor("ids")[0], at::tensor({1, 12, 13}, at::kLong)));     // <s> h i
  EXPECT_TRUE(at::equal(b.GetTensor("labels")[0], at::tensor({12, 13, 2}, at::kLong)));  // h i </s>
  NestedMap flushed = input->GetPreprocessedInputBatch();
  EXPECT_EQ(flushed.GetTensor("ids").size(0), 1);
  EXPECT_EQ(input->IdsToStrings(flushed.GetTensor("labels"), at::tensor({11}, at::kLong))[0],
            "hello world");
  EXPECT_THROW(input->GetPreprocessedInputBatch(), OutOfRangeError);
  EXPECT_EQ(input->num_skipped_too_long(), 1);
  input->Reset();
  EXPECT_NO_THROW(input->GetPreprocessedInputBatch());
  EXPECT_EQ(input->InfeedBatchSize(), 2);
  Params bad = p.Copy();
  bad.Set("file_pattern", "text:/no/such/file");
  auto missing = InstantiateLayer<TextLmInput>(bad);
  EXPECT_ERROR_CONTAINS(missing->GetPreprocessedInputBatch(), NotFoundError, "matches no files");
}

TEST(TextLmInput, ThreadCountsAndLineLengthsAreBounded) {
  const fs::path file = Dir() / "bounded.txt";
  std::ofstream(file) << "short line\n" << std::string(3000, 'x') << "\n";
  Params p = TextLmInput::Params();
  p.Set("name", "lm").Set("file_pattern", "text:" + file.string());
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, int64_t>>{{"num_batcher_threads", 100000},
                                                    {"num_batcher_threads", 0},
                                                    {"num_batcher_threads", -1},
                                                    {"file_parallelism", 0},
                                                    {"prefetch", -3}}) {
    Params bad = p.Copy();
    bad.Set(key, value);
    EXPECT_ERROR_CONTAINS(InstantiateLayer<TextLmInput>(bad), InvalidArgumentError,
                          StrCat("input 'lm': ", key, " is ", value, "; it must be in ["));
  }
  // A line longer than max_line_bytes is DataLoss naming the file and offset.
  Params small = p.Copy();
  small.Set("max_line_bytes", 1000).Set("require_sequential_order", true).Set("repeat_count", 1);
  auto input = InstantiateLayer<TextLmInput>(small);
  EXPECT_ERROR_CONTAINS(
      { for (;;) input->GetPreprocessedInputBatch(); }, DataLossError,
      StrCat("text file '", file.string(), "': the line at byte offset 11 is longer than 1000"));
}

TEST(TextLmInput, InputThatCanNeverMakeABatchIsAnErrorNotAHang) {
  const fs::path empty = Dir() / "empty_lm.txt";
  std::ofstream(empty).close();
  Params p = TextLmInput::Params();
  p.Set("name", "lm").Set("file_pattern", "text:" + empty.string()).Set("repeat_count", -1);
  p.Set("bucket_upper_bound", ParamValue::List{5}).Set("bucket_batch_limit", ParamValue::List{2});
  auto none = InstantiateLayer<TextLmInput>(p);
  EXPECT_ERROR_CONTAINS(none->GetPreprocessedInputBatch(), InvalidArgumentError,
                        "a full pass over 1 file(s) yielded no records");
  // Records, but every one longer than the largest bucket.
  const fs::path long_lines = Dir() / "long_lm.txt";
  std::ofstream(long_lines) << "the quick brown fox\njumps over the lazy dog\n";
  p.Set("file_pattern", "text:" + long_lines.string());
  auto too_long = InstantiateLayer<TextLmInput>(p);
  EXPECT_ERROR_CONTAINS(too_long->GetPreprocessedInputBatch(), InvalidArgumentError,
                        "a full pass over the data gave no example a batch");
  EXPECT_GE(too_long->num_skipped_too_long(), 2);
}

}  // namespace
}  // namespace glossa
