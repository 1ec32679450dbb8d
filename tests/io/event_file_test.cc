#include "glossa/io/event_file.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <memory>
#include <vector>

#include "glossa/base/file.h"
#include "glossa/io/record_io.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

// An independent decoder of the protobuf wire format for Event{wall_time=1 (double),
// step=2 (varint), file_version=3 (string), summary=5 {value=1 {tag=1, simple_value=2 (float)}}}.
struct Decoded {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;
};

uint64_t Varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const uint8_t b = static_cast<uint8_t>(s.at(i++));
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

// Calls fn(field, wire_type, payload-or-varint) for each field of a message.
template <typename F>
void Fields(const std::string& s, F fn) {
  size_t i = 0;
  while (i < s.size()) {
    const uint64_t key = Varint(s, i);
    const int field = static_cast<int>(key >> 3), wt = static_cast<int>(key & 7);
    if (wt == 0) {
      fn(field, wt, std::string(), Varint(s, i));
    } else if (wt == 1) {
      fn(field, wt, s.substr(i, 8), 0);
      i += 8;
    } else if (wt == 5) {
      fn(field, wt, s.substr(i, 4), 0);
      i += 4;
    } else if (wt == 2) {
      const uint64_t n = Varint(s, i);
      fn(field, wt, s.substr(i, n), 0);
      i += n;
    } else {
      FAIL() << "unexpected wire type " << wt;
      return;
    }
  }
}

Decoded Decode(const std::string& bytes) {
  Decoded d;
  Fields(bytes, [&](int f, int, const std::string& p, uint64_t v) {
    if (f == 1) std::memcpy(&d.wall_time, p.data(), 8);
    if (f == 2) d.step = static_cast<int64_t>(v);
    if (f == 3) d.file_version = p;
    if (f == 5) {
      Fields(p, [&](int sf, int, const std::string& value, uint64_t) {
        if (sf != 1) return;
        std::string tag;
        float x = 0;
        Fields(value, [&](int vf, int, const std::string& q, uint64_t) {
          if (vf == 1) tag = q;
          if (vf == 2) std::memcpy(&x, q.data(), 4);
        });
        d.scalars.emplace_back(tag, x);
      });
    }
  });
  return d;
}

std::string LogDir() {
  fs::path dir = ::glossa::testing::TestRoot() / "events";
  return dir.string();
}

TEST(EventFiles, WrittenEventsReadBackExactlyByBothReaders) {
  double now = 1700000000.0;
  std::string path, metrics;
  {
    EventWriter w(LogDir(), /*flush_secs=*/0.05, [&] { return now; });
    path = w.path();
    metrics = w.metrics_log_path();
    EXPECT_NE(path.find("/events.out.tfevents.1700000000."), std::string::npos);
    for (int step = 0; step < 5; ++step) {
      now += 1;
      w.WriteScalar("loss", 3.0 - step * 0.5, step * 100);
      w.WriteScalar("eval/bleu", step * 1.25, step * 100);
    }
    w.WriteHistogram("weights", at::tensor({-1.0, 0.5, 0.5, 2.0}), 400);
    w.WriteText("sample", "hello world", 400);
    // The timer flushes by itself: wait for that event (however slow the machine), never for a
    // fixed time.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (ReadEvents(path).size() < 11u && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_GE(ReadEvents(path).size(), 11u) << "the flush timer never flushed";
  }
  auto events = ReadEvents(path);
  ASSERT_EQ(events.size(), 13u);
  EXPECT_EQ(events[0].kind, EventRecord::Kind::kFileVersion);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[3].tag, "loss");
  EXPECT_EQ(events[3].step, 100);
  EXPECT_FLOAT_EQ(static_cast<float>(events[3].value), 2.5f);
  EXPECT_EQ(events[11].kind, EventRecord::Kind::kHistogram);
  EXPECT_EQ(events[11].histogram_count, 4.0);
  EXPECT_EQ(events[12].kind, EventRecord::Kind::kText);
  EXPECT_EQ(events[12].text, "hello world");
  // The independent decoder agrees on every scalar.
  auto reader = RecordReader::Open("tfrecord", path);
  std::string record;
  std::vector<Decoded> decoded;
  while (reader->Next(&record)) decoded.push_back(Decode(record));
  EXPECT_EQ(decoded[0].file_version, "brain.Event:2");
  EXPECT_EQ(decoded[0].wall_time, 1700000000.0);
  for (size_t i = 1; i <= 10; ++i) {
    ASSERT_EQ(decoded[i].scalars.size(), 1u);
    EXPECT_EQ(decoded[i].scalars[0].first, events[i].tag);
    EXPECT_EQ(decoded[i].scalars[0].second, static_cast<float>(events[i].value));
    EXPECT_EQ(decoded[i].step, events[i].step);
  }
  // metrics.jsonl: one object per scalar.
  std::ifstream in(metrics);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("step") && j.contains("wall_time") && j.contains("tag") &&
                j.contains("value"));
    ++lines;
  }
  EXPECT_EQ(lines, 10);
}

// Writers started in the same second in one logdir each get a file of their own: the third no
// longer took the second's name (base.<pid>) and truncated it.
TEST(EventFiles, WritersStartedInOneSecondKeepTheirOwnFiles) {
  const std::string dir = ::glossa::testing::TempDir("events_same_second");
  std::vector<std::string> paths;
  {
    std::vector<std::unique_ptr<EventWriter>> writers;
    for (int i = 0; i < 4; ++i) {
      writers.push_back(std::make_unique<EventWriter>(dir, 60.0, [] { return 1700000000.0; }));
      writers.back()->WriteScalar("writer", i, 7);
      paths.push_back(writers.back()->path());
    }
  }  // each writer flushes and closes here
  EXPECT_EQ(std::set<std::string>(paths.begin(), paths.end()).size(), 4u);
  EXPECT_EQ(paths[1], paths[0] + "." + std::to_string(::getpid()));
  EXPECT_EQ(paths[3], paths[1] + ".2");
  for (int i = 0; i < 4; ++i) {
    const auto events = ReadEvents(paths[i]);
    ASSERT_EQ(events.size(), 2u) << paths[i];  // the file version, then its one scalar
    EXPECT_EQ(events[1].tag, "writer");
    EXPECT_EQ(events[1].value, i) << paths[i];
  }
}

TEST(EventFiles, ReadsTheTensorFlowWrittenFile) {
  const std::string path =
      testing::SourcePath("../shared/testdata/lingvo/events.out.tfevents.test");
  if (!fs::exists(path)) GTEST_SKIP() << "../shared/testdata is absent: " << path;
  auto events = ReadEvents(path);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  double best = -1;
  int64_t best_step = -1, last_step = -1;
  for (const auto& e : events) {
    last_step = std::max(last_step, e.step);
    if (e.tag == "bleu/dev" && e.kind == EventRecord::Kind::kScalar && e.value > best) {
      best = e.value;
      best_step = e.step;
    }
  }
  EXPECT_EQ(best_step, 102600);
  EXPECT_EQ(last_step, 185200);
}

TEST(EventFiles, CorruptEventsAreDataLoss) {
  fs::create_directories(LogDir());
  const std::string path = LogDir() + "/events.out.tfevents.bad";
  {
    TFRecordWriter w(path);
    w.Write("\xff\xff\xff\xff garbage");
  }
  EXPECT_ERROR_CONTAINS(ReadEvents(path), DataLossError, "record 0 is not an Event");
}

}  // namespace
}  // namespace glossa
