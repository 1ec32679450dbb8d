#include "glossa/input/record_yielder.h"

#include <glob.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/base/thread_state.h"
#include "glossa/io/record_io.h"

namespace glossa {
namespace {

std::vector<std::string> Glob(const std::string& pattern) {
  glob_t g;
  std::vector<std::string> out;
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  return out;
}

std::vector<std::string> ExpandOne(const std::string& p) {
  static const std::regex kSharded(R"((.*)@(\d+|\*))");
  std::smatch m;
  if (std::regex_match(p, m, kSharded)) {
    const std::string base = m[1].str();
    if (m[2].str() == "*") return Glob(base + "-\?\?\?\?\?-of-\?\?\?\?\?");
    const int64_t n = std::stoll(m[2].str());
    if (n <= 0 || n > 99999) throw InvalidArgumentError(StrCat("bad shard count in '", p, "'"));
    std::vector<std::string> out;
    char buf[32];
    for (int64_t i = 0; i < n; ++i) {
      std::snprintf(buf, sizeof(buf), "-%05ld-of-%05ld", static_cast<long>(i),
                    static_cast<long>(n));
      out.push_back(base + buf);
    }
    // Sharded names must exist (every shard).
    std::vector<std::string> missing;
    for (const auto& f : out) {
      if (Glob(f).empty()) missing.push_back(f);
    }
    if (!missing.empty()) {
      throw NotFoundError(StrCat("file pattern '", p, "': shard ", missing.front(), " not found"));
    }
    return out;
  }
  return Glob(p);
}

}  // namespace

FileList ExpandFilePattern(const std::string& pattern) {
  const size_t colon = pattern.find(':');
  if (colon == std::string::npos) {
    throw InvalidArgumentError(StrCat(
        "file pattern '", pattern, "' must be <type>:<pattern> (tfrecord, tfrecord_gzip, text)"));
  }
  FileList list;
  list.type = pattern.substr(0, colon);
  if (list.type != "tfrecord" && list.type != "tfrecord_gzip" && list.type != "text") {
    throw InvalidArgumentError(StrCat("file pattern '", pattern, "': unknown type '", list.type,
                                      "' (expected tfrecord, tfrecord_gzip or text)"));
  }
  for (const std::string& part : Split(pattern.substr(colon + 1), ',')) {
    if (Strip(part).empty()) continue;
    for (auto& f : ExpandOne(std::string(Strip(part)))) list.files.push_back(f);
  }
  std::sort(list.files.begin(), list.files.end());
  list.files.erase(std::unique(list.files.begin(), list.files.end()), list.files.end());
  if (list.files.empty())
    throw NotFoundError(StrCat("file pattern '", pattern, "' matches no files"));
  return list;
}

// One source: its files, read epoch by epoch through reader threads into a shuffle buffer.
struct RecordYielder::Source {
  FileList files;
  YielderOptions options;
  int source_id;
  uint64_t seed;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> queue;  // records read by the readers, not yet in the buffer
  std::vector<std::string> buffer;
  std::vector<std::thread> readers;
  size_t next_file = 0;
  std::vector<std::string> epoch_files;
  int active_readers = 0;
  int64_t epoch = 0;
  bool exhausted = false;
  bool stop = false;
  std::exception_ptr error;
  std::mt19937_64 rng;
  std::atomic<int64_t> corrupt{0};
  int64_t epoch_records = 0;  // records the current epoch's readers queued (under mu)
  std::string pattern;        // for errors

  static constexpr size_t kHandoffChunk = 64;
  // Readers wait while the queue holds this many records (a chunk may overshoot it).
  size_t QueueCapacity() const {
    return static_cast<size_t>(std::max<int64_t>(options.file_buffer_size, 64));
  }

  Source(FileList f, const YielderOptions& o, int id, uint64_t s)
      : files(std::move(f)), options(o), source_id(id), seed(s), rng(s) {}

  ~Source() { StopReaders(); }

  void StopReaders() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    for (auto& t : readers) t.join();
    readers.clear();
  }

  // Starts the next epoch's readers; false when repeat_count epochs are done.
  bool StartEpoch() {
    for (auto& t : readers) t.join();
    readers.clear();
    if (options.repeat_count >= 0 && epoch >= options.repeat_count) return false;
    ++epoch;
    epoch_files = files.files;
    if (!options.require_sequential_order) {
      std::mt19937_64 file_rng(seed ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(epoch)));
      std::shuffle(epoch_files.begin(), epoch_files.end(), file_rng);
    }
    next_file = 0;
    epoch_records = 0;
    const int n = options.require_sequential_order
                      ? 1
                      : static_cast<int>(std::max<int64_t>(
                            1, std::min<int64_t>(options.file_parallelism, epoch_files.size())));
    active_readers = n;
    stop = false;
    for (int i = 0; i < n; ++i) readers.push_back(StartThread(ThreadState::Fresh(), [this] { ReaderLoop(); }));
    return true;
  }

  void ReaderLoop() {
    try {
      while (true) {
        std::string path;
        size_t file_index;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (stop || next_file >= epoch_files.size()) break;
          file_index = next_file++;
          path = epoch_files[file_index];
        }
        RecordReaderOptions ro;
        ro.skip_corrupt_records = options.skip_corrupt_records;
        ro.max_line_bytes = static_cast<size_t>(options.max_line_bytes);
        auto reader = RecordReader::Open(files.type, path, ro);
        // Replica sharding: a record belongs to replica (its index in the file + the file's index
        // in sorted order) mod num_input_replicas.
        const int64_t sorted_index =
            std::lower_bound(files.files.begin(), files.files.end(), path) - files.files.begin();
        int64_t index = 0;
        std::string_view record;
        // Records go to the queue in chunks, one lock and one wake-up per chunk: handing them
        // over one at a time cost more in thread switches than reading them.
        std::vector<std::string> pending;
        pending.reserve(kHandoffChunk);
        auto hand_over = [&]() -> bool {  // false when the yielder is stopping
          if (pending.empty()) return true;
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || queue.size() < QueueCapacity(); });
          if (stop) return false;
          for (auto& r : pending) queue.push_back(std::move(r));
          epoch_records += static_cast<int64_t>(pending.size());
          pending.clear();
          cv.notify_all();
          return true;
        };
        // Views into the reader's window: a record of another replica is never copied.
        while (reader->NextView(&record)) {
          if ((index++ + sorted_index) % options.num_input_replicas != options.input_replica_id) {
            continue;
          }
          pending.emplace_back(record);
          if (pending.size() >= kHandoffChunk && !hand_over()) return;
        }
        if (!hand_over()) return;
        corrupt += reader->num_corrupt_skipped();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    --active_readers;
    cv.notify_all();
  }

  // Next record of this source, or false when it is exhausted.
  bool Next(std::string* out) {
    std::unique_lock<std::mutex> lock(mu);
    if (exhausted) return false;
    if (epoch == 0) {
      lock.unlock();
      if (!StartEpoch()) {
        exhausted = true;
        return false;
      }
      lock.lock();
    }
    const size_t target = options.require_sequential_order
                              ? 1
                              : static_cast<size_t>(std::max<int64_t>(1, options.file_buffer_size));
    while (true) {
      if (error) std::rethrow_exception(error);
      // Fill the shuffle buffer from the readers' queue. Readers blocked on a full queue are woken
      // once it is half empty, not for every record taken.
      bool took = false;
      while (!queue.empty() && buffer.size() < target) {
        buffer.push_back(std::move(queue.front()));
        queue.pop_front();
        took = true;
      }
      if (took && queue.size() <= QueueCapacity() / 2) cv.notify_all();
      const bool epoch_done = active_readers == 0 && queue.empty();
      if (buffer.size() >= target || (epoch_done && !buffer.empty())) {
        size_t i = 0;
        if (!options.require_sequential_order)
          i = std::uniform_int_distribution<size_t>(0, buffer.size() - 1)(rng);
        *out = std::move(buffer[i]);
        if (options.require_sequential_order) {
          buffer.erase(buffer.begin());
        } else {
          buffer[i] = std::move(buffer.back());
          buffer.pop_back();
        }
        return true;
      }
      if (epoch_done) {
        if (epoch_records == 0) {
          // Another pass would yield nothing either: fail instead of spinning forever.
          throw InvalidArgumentError(StrCat(
              "input '", pattern, "': a full pass over ", files.files.size(),
              " file(s) yielded no records",
              corrupt.load() > 0 ? StrCat(" (", corrupt.load(), " corrupt records skipped)") : "",
              options.num_input_replicas > 1
                  ? StrCat(" for input replica ", options.input_replica_id, " of ",
                           options.num_input_replicas)
                  : ""));
        }
        // Every record of this epoch was yielded: start the next one.
        lock.unlock();
        const bool more = StartEpoch();
        lock.lock();
        if (!more) {
          exhausted = true;
          return false;
        }
        continue;
      }
      cv.wait(lock);
    }
  }
};

struct RecordYielder::State {
  YielderOptions options;
  std::vector<std::unique_ptr<Source>> sources;
  std::vector<double> weights;
  std::mutex mu;
  std::mt19937_64 rng;
};

RecordYielder::RecordYielder(const YielderOptions& options) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.options = options;
  if (options.file_pattern.empty()) throw InvalidArgumentError("RecordYielder: no file_pattern");
  if (options.num_input_replicas < 1 || options.input_replica_id < 0 ||
      options.input_replica_id >= options.num_input_replicas) {
    throw InvalidArgumentError(
        StrCat("RecordYielder: input_replica_id ", options.input_replica_id,
               " must be in [0, num_input_replicas = ", options.num_input_replicas, ")"));
  }
  if (options.file_pattern.size() > 1 || !options.input_source_weights.empty()) {
    if (options.input_source_weights.size() != options.file_pattern.size()) {
      throw InvalidArgumentError(StrCat("RecordYielder: ", options.file_pattern.size(),
                                        " file patterns need as many input_source_weights, got ",
                                        options.input_source_weights.size()));
    }
    for (double w : options.input_source_weights) {
      if (!(w >= 0)) throw InvalidArgumentError("RecordYielder: input_source_weights must be >= 0");
    }
  }
  const uint64_t seed = options.file_random_seed == 0
                            ? std::random_device{}() * 0x100000001ULL + std::random_device{}()
                            : static_cast<uint64_t>(options.file_random_seed);
  s.rng.seed(seed * 31 + 7);
  for (size_t i = 0; i < options.file_pattern.size(); ++i) {
    s.sources.push_back(std::make_unique<Source>(ExpandFilePattern(options.file_pattern[i]),
                                                 options, static_cast<int>(i),
                                                 seed + 1000003ULL * i));
    s.sources.back()->pattern = options.file_pattern[i];
  }
  s.weights = options.input_source_weights.empty() ? std::vector<double>{1.0}
                                                   : options.input_source_weights;
}

RecordYielder::~RecordYielder() = default;

Record RecordYielder::Next() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  while (true) {
    double total = 0;
    for (size_t i = 0; i < s.sources.size(); ++i) {
      if (!s.sources[i]->exhausted) total += s.weights[i];
    }
    if (total <= 0) throw OutOfRangeError("end of input: every file pattern has been read");
    double u = std::uniform_real_distribution<double>(0, total)(s.rng);
    size_t pick = 0;
    for (size_t i = 0; i < s.sources.size(); ++i) {
      if (s.sources[i]->exhausted) continue;
      pick = i;
      if (u < s.weights[i]) break;
      u -= s.weights[i];
    }
    Record r;
    if (s.sources[pick]->Next(&r.value)) {
      r.source_id = static_cast<int>(pick);
      return r;
    }
  }
}

int64_t RecordYielder::current_epoch() const {
  std::lock_guard<std::mutex> lock(state_->sources[0]->mu);
  return state_->sources[0]->epoch;
}

int64_t RecordYielder::num_corrupt_skipped() const {
  int64_t n = 0;
  for (const auto& s : state_->sources) n += s->corrupt.load();
  return n;
}

}  // namespace glossa
