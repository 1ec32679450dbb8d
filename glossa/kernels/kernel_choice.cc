#include "glossa/kernels/kernel_choice.h"

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <sys/file.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/cpu_features.h"

extern "C" char* openblas_get_corename() __attribute__((weak));

namespace glossa {
namespace {

std::atomic<KernelMode>& Mode(KernelChoice choice) {
  static std::atomic<KernelMode> modes[3] = {KernelMode::kMeasure, KernelMode::kMeasure,
                                             KernelMode::kMeasure};
  return modes[static_cast<int>(choice)];
}

// The two paths of each choice for `op`, as a decision names them: {ATen's, Glossa's}.
std::pair<const char*, const char*> PathNames(KernelChoice choice, const std::string& op) {
  switch (choice) {
    case KernelChoice::kBf16:
      if (op == "bf16_attention" && CpuHasAvx512Bf16()) {  // kernels/bf16_dot_attention.h
        return {"aten (oneDNN bf16)",
                "native (AVX-512 BF16 dot products; float32 sgemm of widened bf16 for odd heads)"};
      }
      return {"aten (oneDNN bf16)", "native (float32 sgemm of widened bf16)"};
    case KernelChoice::kGemmSplit:
      return {"aten (one GEMM at a time on OpenBLAS's threads)",
              "native (row parts, a single-threaded GEMM per kernel thread)"};
    case KernelChoice::kRowKernel:
      if (op == "fp32_attention") {  // kernels/attention_core.cc: SmallGemmsFor
        return {"aten (BLAS sgemm per head, in place)",
                "native (Glossa's small-GEMM kernel on packed heads)"};
      }
      return {"aten (BLAS sgemm)",
              "native (Glossa's row kernel: on the weights in place, or on a plan's packed panels)"};
  }
  return {"aten", "native"};
}

struct Decisions {
  std::mutex mu;
  std::map<std::string, KernelDecision> by_key;
  std::vector<std::string> order;
  bool cache_set = false;
  std::string cache;  // the cache file; "" none
};

// The default cache file: $GLOSSA_KERNEL_CHOICE_CACHE ("" or "none": none), else
// $XDG_CACHE_HOME/glossa/kernel_choices.tsv, else $HOME/.cache/glossa/kernel_choices.tsv.
std::string DefaultCachePath() {
  if (const char* env = std::getenv("GLOSSA_KERNEL_CHOICE_CACHE"); env != nullptr) {
    return std::string(env) == "none" ? "" : env;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return JoinPath(JoinPath(xdg, "glossa"), "kernel_choices.tsv");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return JoinPath(JoinPath(JoinPath(home, ".cache"), "glossa"), "kernel_choices.tsv");
  }
  return "";
}

}  // namespace

// See kernel_choice.h; the flags digest is FNV-1a over the first processor's flags line.
std::string CpuIdentity(const std::string& cpuinfo) {
  std::string name = "unknown cpu", vendor, family, model, stepping, flags;
  for (const auto& line : Split(cpuinfo, '\n')) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) {
      if (!name.empty() && !flags.empty()) break;  // the end of the first processor's block
      continue;
    }
    const std::string k(Strip(line.substr(0, colon)));
    const std::string v(Strip(line.substr(colon + 1)));
    if (k == "model name" && name == "unknown cpu") name = v;
    else if (k == "vendor_id" && vendor.empty()) vendor = v;
    else if (k == "cpu family" && family.empty()) family = v;
    else if (k == "model" && model.empty()) model = v;
    else if (k == "stepping" && stepping.empty()) stepping = v;
    else if (k == "flags" && flags.empty()) flags = v;
  }
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the flags, which name the vector units
  for (const unsigned char c : flags) h = (h ^ c) * 1099511628211ull;
  char digest[17];
  std::snprintf(digest, sizeof(digest), "%016llx", static_cast<unsigned long long>(h));
  return StrCat(name, " (", vendor.empty() ? "?" : vendor, " family ", family.empty() ? "?" : family,
                " model ", model.empty() ? "?" : model, " stepping ",
                stepping.empty() ? "?" : stepping, ", flags ", std::string(digest, 8), ")");
}

const std::string& ThisCpuIdentity() {
  static const std::string cpu = [] {
    std::ifstream in("/proc/cpuinfo");
    std::stringstream text;
    text << in.rdbuf();
    return CpuIdentity(text.str());
  }();
  return cpu;
}

namespace {

// What a cached decision holds for: this CPU (CpuIdentity), its cores, ATen's threads now, and
// the versions of libtorch (its oneDNN) and OpenBLAS's kernel set.
std::string MachineKey() {
  const std::string& cpu = ThisCpuIdentity();
  // "probe 4": the probes' operands are made outside their timed calls, the row kernels' read
  // cold weights, and native bf16 attention runs AVX-512 BF16 dot products where the CPU has
  // them (decisions cached by earlier probes, of other native paths, are measured again).
  return StrCat(cpu, " | probe 4 | cores ", std::thread::hardware_concurrency(), " | aten threads ",
                at::get_num_threads(), " | torch ", TORCH_VERSION, " | openblas ",
                openblas_get_corename != nullptr ? openblas_get_corename() : "none");
}

// The cache file opened for appending and locked (flock, released by close), or -1 when there is
// none or it cannot be (the caller then measures without it).
int OpenLocked(const std::string& cache) {
  if (cache.empty()) return -1;
  int fd = -1;
  try {
    CreateDirectories(cache.substr(0, cache.rfind('/') + 1));
    fd = ::open(cache.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  } catch (const Error&) {
    return -1;
  }
  if (fd >= 0 && ::flock(fd, LOCK_EX) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The whole (locked) cache file.
std::string ReadAll(int fd) {
  std::string text;
  char buf[65536];
  ssize_t got;
  ::lseek(fd, 0, SEEK_SET);
  while ((got = ::read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(got));
  return text;
}

// Appends `line` to the (locked) cache file, on a line of its own: after a writer killed
// mid-line the file ends without a newline, and a line glued to that fragment would never be
// read back (every run would measure again).
void AppendLine(int fd, const std::string& line) {
  const off_t end = ::lseek(fd, 0, SEEK_END);
  char last = '\n';
  const bool cut = end > 0 && ::pread(fd, &last, 1, end - 1) == 1 && last != '\n';
  const std::string text = cut ? "\n" + line : line;
  (void)!::write(fd, text.data(), text.size());
}

// The cached measurements of `key` in the (locked) cache file, if any: their count and ATen's
// wins in d.measurements and d.aten_wins, the latest's times, and d.native as they settle.
std::optional<KernelDecision> ReadCached(int fd, const std::string& key, KernelDecision d) {
  for (const auto& line : Split(ReadAll(fd), '\n')) {
    const std::vector<std::string> f = Split(line, '\t');
    if (f.size() != 4 || f[0] != key || (f[1] != "aten" && f[1] != "native")) continue;
    ++d.measurements;
    if (f[1] == "aten") ++d.aten_wins;
    d.measured = true;
    d.cached = true;
    d.aten_seconds = std::atof(f[2].c_str());
    d.native_seconds = std::atof(f[3].c_str());
  }
  if (!d.cached) return std::nullopt;
  d.native = SettleMeasurements(d.measurements, d.aten_wins).native;
  return d;
}

// Measures, or takes the decision another process of this machine made: the cache file is locked
// while it is read, and while a missing decision is measured and appended, so that concurrent
// runs agree. Without a usable cache file, measures.
KernelDecision MeasureOrCached(const std::string& cache, KernelChoice choice,
                               const std::string& op, const std::string& shape,
                               const std::function<void(bool)>& run);

Decisions& AllDecisions() {
  static Decisions* d = new Decisions;  // never destroyed: kernels may run during exit
  return *d;
}

// The cache file (the default until SetKernelChoiceCache), with all.mu held.
const std::string& CachePathLocked(Decisions& all) {
  if (!all.cache_set) {
    all.cache = DefaultCachePath();
    all.cache_set = true;
  }
  return all.cache;
}

KernelDecision NewDecision(KernelChoice choice, const std::string& op, const std::string& shape) {
  KernelDecision d;
  d.choice = choice;
  d.op = op;
  d.shape = shape;
  return d;
}

// ATen's path is chosen only when its median time is under this fraction of the native one's.
constexpr double kAtenMustWinBy = 0.9;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times both paths: one warm-up call each, then five alternating timed calls each (so that a
// drift of this shared machine's speed hits both alike).
KernelDecision Measure(KernelChoice choice, const std::string& op, const std::string& shape,
                       const std::function<void(bool)>& run) {
  using Clock = std::chrono::steady_clock;
  KernelDecision d = NewDecision(choice, op, shape);
  d.measured = true;
  run(false);
  run(true);
  std::vector<double> aten, native;
  // Five, not three: on a shared 2-core VM a median of three once timed the tiny LM's 128 × 384
  // fp32 split at 7.0 ms against 4.3, a tie when both paths were pinned in whole runs.
  for (int i = 0; i < 5; ++i) {
    for (const bool n : {false, true}) {
      const auto t0 = Clock::now();
      run(n);
      (n ? native : aten).push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  d.aten_seconds = Median(aten);
  d.native_seconds = Median(native);
  // ATen's path must be clearly faster to be taken: on near ties (small shapes, where timings
  // are noise) every run of a machine keeps the native path.
  d.native = !(d.aten_seconds < kAtenMustWinBy * d.native_seconds);
  d.measurements = 1;
  d.aten_wins = d.native ? 0 : 1;
  return d;
}

// Closes the cache file, which releases its lock, however the scope ends: a probe that throws
// must not leave it held, or the process's next probe waits for itself forever.
struct ClosesOnExit {
  int fd;
  ~ClosesOnExit() {
    if (fd >= 0) ::close(fd);
  }
};

KernelDecision MeasureOrCached(const std::string& cache, KernelChoice choice,
                               const std::string& op, const std::string& shape,
                               const std::function<void(bool)>& run) {
  const int fd = OpenLocked(cache);  // -1: no cache file; this process measures alone
  const ClosesOnExit closer{fd};
  const std::string key = StrCat(MachineKey(), " | ", op, " ", shape);
  std::optional<KernelDecision> d;
  if (fd >= 0) d = ReadCached(fd, key, NewDecision(choice, op, shape));
  // Measured until settled (SettleMeasurements: a first BLAS win is measured again), each
  // measurement a line of its own, all under the lock and in this process: the next runs of this
  // machine (a resumed run among them) read a settled decision and keep its kernels.
  while (!d || SettleMeasurements(d->measurements, d->aten_wins).measure_again) {
    const KernelDecision now = Measure(choice, op, shape, run);
    if (fd >= 0) {
      AppendLine(fd, StrCat(key, "\t", now.native ? "native" : "aten", "\t", now.aten_seconds,
                            "\t", now.native_seconds, "\n"));
    }
    KernelDecision all = now;
    if (d) {  // this measurement joins the earlier ones
      all.measurements = d->measurements + 1;
      all.aten_wins = d->aten_wins + now.aten_wins;
      all.cached = d->cached;
    }
    all.native = SettleMeasurements(all.measurements, all.aten_wins).native;
    d = all;
  }
  if (fd >= 0) d->cache = cache;
  return *d;
}

}  // namespace

void SetKernelChoiceCache(const std::string& path) {
  Decisions& all = AllDecisions();
  std::lock_guard<std::mutex> lock(all.mu);
  all.cache = path;
  all.cache_set = true;
}

KernelMode ParseKernelMode(const std::string& text, const std::string& flag) {
  if (text == "measure") return KernelMode::kMeasure;
  if (text == "aten") return KernelMode::kAten;
  if (text == "native") return KernelMode::kNative;
  throw InvalidArgumentError(
      StrCat(flag, " must be measure, aten or native, got '", text, "'"));
}

const char* KernelChoiceFlag(KernelChoice choice) {
  switch (choice) {
    case KernelChoice::kBf16:
      return "--bf16_kernels";
    case KernelChoice::kGemmSplit:
      return "--gemm_split";
    case KernelChoice::kRowKernel:
      return "--row_kernels";
  }
  return "";
}

void SetKernelMode(KernelChoice choice, KernelMode mode) { Mode(choice).store(mode); }
KernelMode GetKernelMode(KernelChoice choice) { return Mode(choice).load(); }

SettledChoice SettleMeasurements(int measurements, int aten_wins) {
  SettledChoice s;
  s.native = aten_wins < 2;
  s.measure_again = aten_wins == 1 && measurements < 3;
  return s;
}

std::string KernelDecision::Describe() const {
  const auto [aten_path, native_path] = PathNames(choice, op);
  const std::string path = native ? native_path : aten_path;
  if (!measured) return StrCat(op, " ", shape, ": ", path, ", as ", KernelChoiceFlag(choice), " says");
  char times[96];
  std::snprintf(times, sizeof(times), "aten %.3g ms, native %.3g ms", 1e3 * aten_seconds,
                1e3 * native_seconds);
  // A cache's count: "ATen's path faster in 1 of 2 measurements" (SettleMeasurements).
  const std::string votes =
      measurements > 1
          ? StrCat("; ATen's path faster in ", aten_wins, " of ", measurements,
                   measurements == 1 ? " measurement" : " measurements")
          : std::string();
  return StrCat(op, " ", shape, ": ", path, " (measured: ", times, votes,
                cached ? StrCat("; as cached in ", cache) : std::string(), ")");
}

bool ChooseNative(KernelChoice choice, const std::string& op, const std::string& shape,
                  const std::function<void(bool native)>& run) {
  Decisions& all = AllDecisions();
  const KernelMode mode = Mode(choice).load();
  // A forced path applies whatever was decided before (kept apart from the measured ones).
  const std::string key =
      mode == KernelMode::kMeasure
          ? op + " " + shape
          : StrCat(op, " ", shape, mode == KernelMode::kNative ? " [native]" : " [aten]");
  std::lock_guard<std::mutex> lock(all.mu);
  auto it = all.by_key.find(key);
  if (it != all.by_key.end()) return it->second.native;
  KernelDecision d;
  if (mode == KernelMode::kMeasure) {
    d = MeasureOrCached(CachePathLocked(all), choice, op, shape, run);
  } else {
    d = NewDecision(choice, op, shape);
    d.native = mode == KernelMode::kNative;
  }
  std::fprintf(stderr, "kernel choice: %s\n", d.Describe().c_str());
  all.order.push_back(key);
  return all.by_key.emplace(key, d).first->second.native;
}

std::string KernelChoiceCachePath() {
  Decisions& all = AllDecisions();
  std::lock_guard<std::mutex> lock(all.mu);
  return CachePathLocked(all);
}

std::string ChooseAmongCached(const std::string& key, const std::vector<std::string>& candidates,
                              const std::function<double(const std::string&)>& seconds,
                              std::string* description) {
  if (candidates.empty()) throw InvalidArgumentError("ChooseAmongCached: no candidates for " + key);
  const std::string cache = KernelChoiceCachePath();
  const int fd = OpenLocked(cache);
  const ClosesOnExit closer{fd};
  std::string choice, times;
  if (fd >= 0) {  // the last line for this key, naming a candidate
    for (const auto& line : Split(ReadAll(fd), '\n')) {
      const std::vector<std::string> f = Split(line, '\t');
      if (f.size() == 3 && f[0] == key &&
          std::find(candidates.begin(), candidates.end(), f[1]) != candidates.end()) {
        choice = f[1];
        times = f[2];
      }
    }
  }
  const bool cached = !choice.empty();
  if (!cached) {
    std::vector<double> t;
    for (const auto& c : candidates) t.push_back(seconds(c));
    size_t best = 0;
    for (size_t i = 1; i < t.size(); ++i) {
      if (t[i] < t[best]) best = i;
    }
    if (!(t[best] < kAtenMustWinBy * t[0])) best = 0;  // near ties keep what runs now
    choice = candidates[best];
    for (size_t i = 0; i < t.size(); ++i) {
      times += StrCat(i > 0 ? "," : "", candidates[i], "=", t[i]);
    }
    if (fd >= 0) {
      const std::string line = StrCat(key, "\t", choice, "\t", times, "\n");
      AppendLine(fd, line);
    }
  }
  if (description != nullptr) {
    std::string ms;
    for (const auto& item : Split(times, ',')) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos) continue;
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.3g", 1e3 * std::atof(item.c_str() + eq + 1));
      ms += StrCat(ms.empty() ? "" : ", ", item.substr(0, eq), " ", buf, " ms");
    }
    *description = StrCat(choice, " (measured: ", ms, cached ? StrCat("; as cached in ", cache) : "",
                          ")");
  }
  return choice;
}

std::vector<KernelDecision> KernelDecisions() {
  Decisions& all = AllDecisions();
  std::lock_guard<std::mutex> lock(all.mu);
  std::vector<KernelDecision> out;
  for (const auto& k : all.order) out.push_back(all.by_key.at(k));
  return out;
}

}  // namespace glossa
