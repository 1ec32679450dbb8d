#include "glossa/input/record_batcher.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "glossa/base/strings.h"
#include "glossa/io/record_io.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

// A file of records "<key>" (integers); the processor makes {x: [key] ones, paddings} with bucket
// key = the record's integer.
std::shared_ptr<RecordYielder> Yielder(const std::vector<int>& keys, const std::string& name) {
  fs::path dir = ::glossa::testing::TestRoot() / "batcher";
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  {
    TFRecordWriter w(path);
    for (int k : keys) w.Write(std::to_string(k));
  }
  YielderOptions o;
  o.file_pattern = {"tfrecord:" + path};
  o.require_sequential_order = true;
  o.repeat_count = 1;
  return std::make_shared<RecordYielder>(o);
}

std::optional<std::pair<NestedMap, int64_t>> Process(const Record& r) {
  const int64_t key = std::stoll(r.value);
  const int64_t len = std::max<int64_t>(key, 1);
  NestedMap ex;
  ex.Put("x", at::full({len}, static_cast<float>(key)));
  ex.Put("paddings", at::zeros({len}));
  ex.Put("key", key);
  return std::make_pair(ex, key);
}

std::vector<NestedMap> Drain(RecordBatcher& b) {
  std::vector<NestedMap> out;
  while (true) {
    try {
      out.push_back(b.Next());
    } catch (const OutOfRangeError&) {
      return out;
    }
  }
}

std::vector<int64_t> Keys(const NestedMap& batch) {
  std::vector<int64_t> out;
  for (const auto& v : batch.GetItem("key").AsList()) out.push_back(v.AsInt());
  return out;
}

TEST(RecordBatcher, BucketsByUpperBoundAndEmitsFullBuckets) {
  BatcherOptions o;
  o.bucket_upper_bound = {2, 5};
  o.bucket_batch_limit = {2, 3};
  RecordBatcher b(Yielder({1, 4, 2, 5, 3, 9, -1, 1}, "buckets"), o, Process);
  auto batches = Drain(b);
  // Bucket 0 (keys <= 2): [1, 2] full; bucket 1: [4, 5, 3] full; then flush: [1].
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(Keys(batches[0]), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Keys(batches[1]), (std::vector<int64_t>{4, 5, 3}));
  EXPECT_EQ(Keys(batches[2]), (std::vector<int64_t>{1}));
  EXPECT_EQ(b.num_skipped_too_long(), 1);  // 9 > 5
  EXPECT_EQ(b.num_dropped(), 1);           // -1
  EXPECT_EQ(b.num_processed(), 8);
  // Dynamic padding to the longest in the batch; paddings padded with 1.
  EXPECT_EQ(batches[1].GetTensor("x").sizes(), (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(
      at::equal(batches[1].GetTensor("paddings")[2], at::tensor({0.f, 0.f, 0.f, 1.f, 1.f})));
  EXPECT_TRUE(at::equal(batches[1].GetTensor("x")[0], at::tensor({4.f, 4.f, 4.f, 4.f, 0.f})));
}

TEST(RecordBatcher, KeyEqualToABoundGoesInThatBucket) {
  BatcherOptions o;
  o.bucket_upper_bound = {3, 10};
  o.bucket_batch_limit = {1, 1};
  RecordBatcher b(Yielder({3, 4, 10, 11, 0}, "bounds"), o, Process);
  auto batches = Drain(b);
  std::vector<int64_t> keys;
  for (const auto& batch : batches) keys.push_back(Keys(batch)[0]);
  EXPECT_EQ(keys, (std::vector<int64_t>{3, 4, 10, 0}));
  EXPECT_EQ(b.num_skipped_too_long(), 1);
}

TEST(RecordBatcher, FlushEveryNAndPadValues) {
  BatcherOptions o;
  o.bucket_upper_bound = {100};
  o.bucket_batch_limit = {10};
  o.flush_every_n = 2;
  o.pad_values = {{"x", -1.0}};
  RecordBatcher b(Yielder({1, 2, 3, 4, 5}, "flush"), o, Process);
  auto batches = Drain(b);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(Keys(batches[0]), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(at::equal(batches[0].GetTensor("x")[0], at::tensor({1.f, -1.f})));
}

TEST(RecordBatcher, ManyThreadsLoseNoRecords) {
  std::vector<int> keys;
  for (int i = 0; i < 500; ++i) keys.push_back(i % 7 + 1);
  BatcherOptions o;
  o.bucket_upper_bound = {3, 7};
  o.bucket_batch_limit = {8, 5};
  o.num_batcher_threads = 4;
  RecordBatcher b(Yielder(keys, "threads"), o, Process);
  int64_t total = 0;
  for (const auto& batch : Drain(b)) total += batch.GetTensor("x").size(0);
  EXPECT_EQ(total, 500);
}

TEST(RecordBatcher, ValidatesBucketsAndPropagatesErrors) {
  BatcherOptions o;
  o.bucket_upper_bound = {5, 2};
  o.bucket_batch_limit = {1, 1};
  EXPECT_ERROR_CONTAINS(RecordBatcher(Yielder({1}, "v1"), o, Process), InvalidArgumentError,
                        "bucket_upper_bound must be sorted, got [5, 2]");
  o.bucket_upper_bound = {5};
  EXPECT_ERROR_CONTAINS(RecordBatcher(Yielder({1}, "v2"), o, Process), InvalidArgumentError,
                        "equal length");
  o.bucket_batch_limit = {1};
  RecordBatcher b(Yielder({1, 2}, "v3"), o,
                  [](const Record&) -> std::optional<std::pair<NestedMap, int64_t>> {
                    throw InvalidArgumentError("bad record");
                  });
  EXPECT_ERROR_CONTAINS(b.Next(), InvalidArgumentError, "bad record");
}

// Against the composition it replaces (constant_pad_nd to the largest shape, then stack), for
// ranks 0 to 3, int64 and float, with a named pad value, paddings (pad 1), an empty example, a
// non-contiguous one and mixed dtypes (the general path).
TEST(PadAndStack, EqualsPaddingEachExampleThenStacking) {
  at::manual_seed(4);
  auto reference = [](const std::vector<at::Tensor>& ts, double pad) {
    std::vector<int64_t> max_shape = ts[0].sizes().vec();
    for (const auto& t : ts) {
      for (int64_t d = 0; d < t.dim(); ++d) max_shape[d] = std::max(max_shape[d], t.size(d));
    }
    std::vector<at::Tensor> padded;
    for (const auto& t : ts) {
      std::vector<int64_t> pads;
      for (int64_t d = t.dim() - 1; d >= 0; --d) {
        pads.push_back(0);
        pads.push_back(max_shape[d] - t.size(d));
      }
      padded.push_back(at::constant_pad_nd(t, pads, pad));
    }
    return at::stack(padded);
  };
  std::vector<std::vector<at::Tensor>> cases = {
      {at::tensor(3.5), at::tensor(-1.0)},
      {at::randint(0, 9, {4}, at::kLong), at::randint(0, 9, {7}, at::kLong),
       at::zeros({0}, at::kLong)},
      {at::randn({2, 3}), at::randn({4, 1}), at::randn({3, 3})},
      {at::randn({2, 3, 4}), at::randn({1, 5, 2}), at::randn({3, 1, 4})},
      {at::randn({2, 3}), at::randn({4, 3}).t()},  // not contiguous
      {at::randn({3}), at::randint(0, 5, {2}, at::kLong)}};
  for (size_t c = 0; c < cases.size(); ++c) {
    for (const std::string key : {"ids", "paddings", "labels"}) {
      SCOPED_TRACE(::testing::Message() << "case " << c << " key " << key);
      std::vector<NestedMap> examples;
      for (const auto& t : cases[c]) examples.push_back(NestedMap{{key, t}});
      const double pad = key == "labels" ? 7.0 : key == "paddings" ? 1.0 : 0.0;
      const NestedMap got = PadAndStack(examples, {{"labels", 7.0}});
      const at::Tensor want = reference(cases[c], pad);
      ASSERT_EQ(got.GetTensor(key).sizes(), want.sizes());
      EXPECT_EQ(got.GetTensor(key).scalar_type(), want.scalar_type());
      EXPECT_TRUE(at::equal(got.GetTensor(key), want));
    }
  }
}

TEST(PadAndStack, RejectsMismatchedExamples) {
  NestedMap a{{"x", at::zeros({2})}}, b{{"y", at::zeros({2})}}, c{{"x", at::zeros({2, 2})}};
  EXPECT_ERROR_CONTAINS(PadAndStack({a, b}), InvalidArgumentError,
                        "has key 'y' where example 0 has 'x'");
  EXPECT_ERROR_CONTAINS(PadAndStack({a, c}), InvalidArgumentError, "has rank 2");
}

}  // namespace
}  // namespace glossa
