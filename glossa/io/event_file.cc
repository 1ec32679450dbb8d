#include "glossa/io/event_file.h"

#include <ATen/ATen.h>
#include <glog/logging.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/base/thread_state.h"
#include "glossa/io/event.pb.h"
#include "glossa/io/record_io.h"

namespace glossa {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string Hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// TensorFlow's default histogram bucket limits: ±1e-12·1.1^k up to 1e20, plus the extremes.
const std::vector<double>& DefaultBucketLimits() {
  static const std::vector<double> limits = [] {
    std::vector<double> pos;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);
    pos.push_back(std::numeric_limits<double>::max());
    std::vector<double> out;
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) out.push_back(-*it);
    out.push_back(0.0);
    for (double v : pos) out.push_back(v);
    return out;
  }();
  return limits;
}

}  // namespace

struct EventWriter::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::unique_ptr<TFRecordWriter> writer;
  FILE* metrics = nullptr;
  std::function<double()> clock;
  std::thread flusher;
  bool closed = false;
};

namespace {

// Writers started in one second share `base`: the first takes it, the others base.<pid>,
// base.<pid>.1, ... Each name is created exclusively (O_EXCL), so that neither two writers of one
// process nor two processes (a second job on one logdir) ever open, and truncate, one file.
std::string ClaimEventFileName(const std::string& base) {
  for (int64_t i = 0;; ++i) {
    const std::string path = i == 0   ? base
                             : i == 1 ? StrCat(base, ".", ::getpid())
                                      : StrCat(base, ".", ::getpid(), ".", i - 1);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      return path;
    }
    if (errno != EEXIST) {
      throw NotFoundError(StrCat("cannot create '", path, "': ", std::strerror(errno)));
    }
  }
}

}  // namespace

EventWriter::EventWriter(const std::string& logdir, double flush_secs,
                         std::function<double()> clock)
    : impl_(std::make_unique<Impl>()) {
  CreateDirectories(logdir);
  impl_->clock = clock ? std::move(clock) : Now;
  const double now = impl_->clock();
  path_ = ClaimEventFileName(
      JoinPath(logdir, StrCat("events.out.tfevents.", static_cast<int64_t>(now), ".", Hostname())));
  impl_->writer = std::make_unique<TFRecordWriter>(path_);
  metrics_path_ = JoinPath(logdir, "metrics.jsonl");
  // A run killed mid-line left a torn last line: drop it rather than append onto it.
  if (const uint64_t torn = TruncateTornLastLine(metrics_path_); torn > 0) {
    LOG(WARNING) << "dropped a torn last line (" << torn << " bytes) of " << metrics_path_;
  }
  impl_->metrics = std::fopen(metrics_path_.c_str(), "a");
  if (!impl_->metrics)
    throw AbortedError(StrCat("cannot open '", metrics_path_, "' for appending"));
  proto::Event e;
  e.set_wall_time(now);
  e.set_file_version("brain.Event:2");
  WriteEvent(e.SerializeAsString(), now);
  Flush();
  if (flush_secs > 0) {
    impl_->flusher = StartThread(ThreadState::Fresh(), [this, flush_secs] {
      std::unique_lock<std::mutex> lock(impl_->mu);
      while (!impl_->closed) {
        impl_->cv.wait_for(lock, std::chrono::duration<double>(flush_secs));
        if (impl_->closed) break;
        impl_->writer->Flush();
        std::fflush(impl_->metrics);
      }
    });
  }
}

int64_t DropMetricLinesAfter(const std::string& metrics_path, int64_t step) {
  if (!FileExists(metrics_path)) return 0;
  const std::string text = ReadFileToString(metrics_path);
  std::string kept;
  kept.reserve(text.size());
  int64_t dropped = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    end = end == std::string::npos ? text.size() : end + 1;
    const std::string_view line(text.data() + start, end - start);
    int64_t line_step = -1;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer()) {
        line_step = j["step"].get<int64_t>();
      }
    } catch (const nlohmann::json::exception&) {
      // Not a metrics line: kept as it is.
    }
    if (line_step > step) {
      ++dropped;
    } else {
      kept.append(line);
    }
    start = end;
  }
  if (dropped > 0) AtomicWriteFile(metrics_path, kept);
  return dropped;
}

EventWriter::~EventWriter() {
  try {
    Close();
  } catch (...) {
  }
}

void EventWriter::WriteEvent(const std::string& serialized, double) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->closed) throw FailedPreconditionError(StrCat("event file '", path_, "' is closed"));
  impl_->writer->Write(serialized);
}

void EventWriter::WriteScalar(const std::string& tag, double value, int64_t step) {
  const double now = impl_->clock();
  proto::Event e;
  e.set_wall_time(now);
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  WriteEvent(e.SerializeAsString(), now);
  nlohmann::json line = {{"step", step}, {"wall_time", now}, {"tag", tag}};
  if (std::isfinite(value)) {
    line["value"] = value;
  } else {
    line["value"] = PyFloatRepr(value);  // JSON has no NaN/Inf: written as a string
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::fprintf(impl_->metrics, "%s\n", line.dump().c_str());
}

void EventWriter::WriteHistogram(const std::string& tag, const at::Tensor& values, int64_t step) {
  at::Tensor v = values.detach().to(at::kCPU, at::kDouble).reshape(-1).contiguous();
  const double* p = v.data_ptr<double>();
  const auto& limits = DefaultBucketLimits();
  std::vector<double> counts(limits.size(), 0.0);
  proto::HistogramProto h;
  double mn = std::numeric_limits<double>::infinity(), mx = -mn, sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < v.numel(); ++i) {
    const double x = p[i];
    mn = std::min(mn, x);
    mx = std::max(mx, x);
    sum += x;
    sum_sq += x * x;
    counts[std::lower_bound(limits.begin(), limits.end(), x) - limits.begin()] += 1;
  }
  h.set_min(v.numel() ? mn : 0);
  h.set_max(v.numel() ? mx : 0);
  h.set_num(static_cast<double>(v.numel()));
  h.set_sum(sum);
  h.set_sum_squares(sum_sq);
  // Only non-empty stretches are stored, as TensorFlow does (with the limit of each bucket).
  for (size_t i = 0; i < limits.size(); ++i) {
    if (counts[i] == 0 && (i + 1 >= limits.size() || counts[i + 1] == 0)) continue;
    h.add_bucket_limit(limits[i]);
    h.add_bucket(counts[i]);
  }
  const double now = impl_->clock();
  proto::Event e;
  e.set_wall_time(now);
  e.set_step(step);
  auto* val = e.mutable_summary()->add_value();
  val->set_tag(tag);
  *val->mutable_histo() = h;
  WriteEvent(e.SerializeAsString(), now);
}

void EventWriter::WriteText(const std::string& tag, const std::string& text, int64_t step) {
  const double now = impl_->clock();
  proto::Event e;
  e.set_wall_time(now);
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  auto* t = v->mutable_tensor();
  t->set_dtype(7);  // DT_STRING
  t->mutable_tensor_shape();
  t->add_string_val(text);
  WriteEvent(e.SerializeAsString(), now);
}

void EventWriter::Flush() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->closed) return;
  impl_->writer->Flush();
  std::fflush(impl_->metrics);
}

void EventWriter::Close() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->closed) return;
    impl_->closed = true;
  }
  impl_->cv.notify_all();
  if (impl_->flusher.joinable()) impl_->flusher.join();
  impl_->writer->Close();
  if (impl_->metrics) {
    std::fclose(impl_->metrics);
    impl_->metrics = nullptr;
  }
}

namespace {
std::vector<EventRecord> ReadAllEvents(const std::string& path, std::vector<EventRecord>& out);
}  // namespace

std::vector<EventRecord> ReadEvents(const std::string& path, std::string* damage) {
  std::vector<EventRecord> out;
  if (damage == nullptr) return ReadAllEvents(path, out);
  damage->clear();
  try {
    ReadAllEvents(path, out);
  } catch (const Error& e) {
    *damage = e.message();
  }
  return out;
}

namespace {

std::vector<EventRecord> ReadAllEvents(const std::string& path, std::vector<EventRecord>& out) {
  auto reader = RecordReader::Open("tfrecord", path);
  std::string record;
  int64_t index = 0;
  while (reader->Next(&record)) {
    proto::Event e;
    if (!e.ParseFromString(record)) {
      throw DataLossError(StrCat("event file '", path, "': record ", index, " is not an Event"));
    }
    ++index;
    if (e.what_case() == proto::Event::kFileVersion) {
      EventRecord r;
      r.wall_time = e.wall_time();
      r.step = e.step();
      r.kind = EventRecord::Kind::kFileVersion;
      r.file_version = e.file_version();
      out.push_back(r);
      continue;
    }
    if (e.what_case() != proto::Event::kSummary) continue;
    for (const auto& v : e.summary().value()) {
      EventRecord r;
      r.wall_time = e.wall_time();
      r.step = e.step();
      r.tag = v.tag();
      switch (v.value_case()) {
        case proto::Summary::Value::kSimpleValue:
          r.kind = EventRecord::Kind::kScalar;
          r.value = v.simple_value();
          break;
        case proto::Summary::Value::kHisto:
          r.kind = EventRecord::Kind::kHistogram;
          r.histogram_count = v.histo().num();
          break;
        case proto::Summary::Value::kTensor:
          if (v.tensor().dtype() == 7 && v.tensor().string_val_size() > 0) {
            r.kind = EventRecord::Kind::kText;
            r.text = v.tensor().string_val(0);
          } else if (v.tensor().float_val_size() == 1) {
            r.kind = EventRecord::Kind::kScalar;  // TF2 scalar summaries
            r.value = v.tensor().float_val(0);
          }
          break;
        default: break;
      }
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

}  // namespace glossa
