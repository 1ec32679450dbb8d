// Input pipeline throughput. Usage:
//   input_pipeline read <file_pattern> <readers>      records with every CRC checked: `readers`
//                                                     threads, each a RecordReader over its files,
//                                                     records as views (NextView: no copy)
//   input_pipeline read_copy <file_pattern> <readers> the same, each record copied out (Next)
// [passes]: read modes go over the files that many times (a pass over 300 MB takes ~0.1 s, too
// short to time on a shared machine).
//   input_pipeline pipeline <file_pattern> <readers>  tf.Example parse -> bucketing batcher ->
//   tensors
// Prints one line: mode, readers, records, bytes, seconds, records/s, MB/s, tokens/s.
// bench/input_pipeline.sh runs it against `cat` of the same bytes; see that script.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/input/record_batcher.h"
#include "glossa/input/record_yielder.h"
#include "glossa/io/example.h"
#include "glossa/io/record_io.h"

using namespace glossa;

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s read|read_copy|pipeline <file_pattern> <readers> [passes=1]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int passes = argc == 5 ? std::max(1, std::atoi(argv[4])) : 1;
  YielderOptions o;
  o.file_pattern = {argv[2]};
  o.file_parallelism = std::stoll(argv[3]);
  o.repeat_count = 1;
  o.file_buffer_size = 1024;
  o.file_random_seed = 1;
  auto yielder = std::make_shared<RecordYielder>(o);
  const auto start = std::chrono::steady_clock::now();
  int64_t records = 0, bytes = 0, tokens = 0;
  try {
    if (mode == "read" || mode == "read_copy") {
      const bool copy = mode == "read_copy";
      const FileList files = ExpandFilePattern(argv[2]);
      std::atomic<int64_t> n_records{0}, n_bytes{0};
      std::vector<std::thread> threads;
      const int64_t readers = std::max<int64_t>(1, o.file_parallelism);
      for (int64_t t = 0; t < readers; ++t) {
        threads.emplace_back([&, t] {
          std::string record;
          std::string_view view;
          // Per-thread counts, added once at the end: atomics bumped per record would cost more
          // than the reader itself (and contend between the readers).
          int64_t local_records = 0, local_bytes = 0;
          for (int pass = 0; pass < passes; ++pass)
          for (size_t f = t; f < files.files.size(); f += readers) {
            auto reader = RecordReader::Open(files.type, files.files[f]);
            if (copy) {
              while (reader->Next(&record)) {
                ++local_records;
                local_bytes += static_cast<int64_t>(record.size()) + 16;
              }
            } else {
              while (reader->NextView(&view)) {
                ++local_records;
                local_bytes += static_cast<int64_t>(view.size()) + 16;
              }
            }
          }
          n_records += local_records;
          n_bytes += local_bytes;
        });
      }
      for (auto& t : threads) t.join();
      records = n_records;
      bytes = n_bytes;
    } else {
      const FeatureSpecs spec = {{"inputs", FeatureSpec::VarLen(FeatureType::kInt64)},
                                 {"targets", FeatureSpec::VarLen(FeatureType::kInt64)}};
      BatcherOptions bo;
      bo.bucket_upper_bound = {16, 32, 64, 128, 256, 100000};
      bo.bucket_batch_limit = {256, 128, 64, 32, 16, 8};
      bo.num_batcher_threads = std::max<int64_t>(1, o.file_parallelism);
      std::atomic<int64_t> in_bytes{0};
      RecordBatcher batcher(
          yielder, bo, [&](const Record& r) -> std::optional<std::pair<NestedMap, int64_t>> {
            in_bytes += static_cast<int64_t>(r.value.size()) + 16;
            NestedMap ex = ParseExample(r.value, spec);
            const int64_t len =
                std::max(ex.GetTensor("inputs").numel(), ex.GetTensor("targets").numel());
            return std::make_pair(std::move(ex), len);
          });
      try {
        while (true) {
          NestedMap b = batcher.Next();
          records += b.GetTensor("inputs").size(0);
          tokens += b.GetTensor("inputs").numel() + b.GetTensor("targets").numel();
        }
      } catch (const OutOfRangeError&) {
      }
      bytes = in_bytes;
    }
  } catch (const OutOfRangeError&) {
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%s readers=%s records=%ld bytes=%ld seconds=%.3f records_per_s=%.0f MB_per_s=%.1f "
      "padded_tokens_per_s=%.0f\n",
      mode.c_str(), argv[3], static_cast<long>(records), static_cast<long>(bytes), s, records / s,
      bytes / s / 1e6, tokens / s);
  return 0;
}
