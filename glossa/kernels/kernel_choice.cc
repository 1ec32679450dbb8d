#include "glossa/kernels/kernel_choice.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

std::atomic<KernelMode>& Mode() {
  static std::atomic<KernelMode> mode{KernelMode::kMeasure};
  return mode;
}

struct Decisions {
  std::mutex mu;
  std::map<std::string, KernelDecision> by_key;
  std::vector<std::string> order;
};

Decisions& AllDecisions() {
  static Decisions* d = new Decisions;  // never destroyed: kernels may run during exit
  return *d;
}

double Median3(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times both paths: one warm-up call each, then three alternating timed calls each (so that a
// drift of this shared machine's speed hits both alike).
KernelDecision Measure(const std::string& op, const std::string& shape,
                       const std::function<void(bool)>& run) {
  using Clock = std::chrono::steady_clock;
  KernelDecision d{op, shape};
  d.measured = true;
  run(false);
  run(true);
  std::vector<double> aten, native;
  for (int i = 0; i < 3; ++i) {
    for (const bool n : {false, true}) {
      const auto t0 = Clock::now();
      run(n);
      (n ? native : aten).push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  d.aten_seconds = Median3(aten);
  d.native_seconds = Median3(native);
  d.native = d.native_seconds < d.aten_seconds;
  return d;
}

}  // namespace

KernelMode ParseKernelMode(const std::string& text, const std::string& flag) {
  if (text == "measure") return KernelMode::kMeasure;
  if (text == "aten") return KernelMode::kAten;
  if (text == "native") return KernelMode::kNative;
  throw InvalidArgumentError(
      StrCat(flag, " must be measure, aten or native, got '", text, "'"));
}

void SetBf16KernelMode(KernelMode mode) { Mode().store(mode); }
KernelMode Bf16KernelMode() { return Mode().load(); }

std::string KernelDecision::Describe() const {
  const std::string path = native ? "native (float32 sgemm of widened bf16)" : "aten (oneDNN bf16)";
  if (!measured) return StrCat(op, " ", shape, ": ", path, ", as --bf16_kernels says");
  char times[96];
  std::snprintf(times, sizeof(times), "aten %.3g ms, native %.3g ms", 1e3 * aten_seconds,
                1e3 * native_seconds);
  return StrCat(op, " ", shape, ": ", path, " (measured: ", times, ")");
}

bool ChooseNative(const std::string& op, const std::string& shape,
                  const std::function<void(bool native)>& run) {
  Decisions& all = AllDecisions();
  const KernelMode mode = Mode().load();
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
    d = Measure(op, shape, run);
  } else {
    d = KernelDecision{op, shape, mode == KernelMode::kNative};
  }
  std::fprintf(stderr, "kernel choice: %s\n", d.Describe().c_str());
  all.order.push_back(key);
  return all.by_key.emplace(key, d).first->second.native;
}

std::vector<KernelDecision> KernelDecisions() {
  Decisions& all = AllDecisions();
  std::lock_guard<std::mutex> lock(all.mu);
  std::vector<KernelDecision> out;
  for (const auto& k : all.order) out.push_back(all.by_key.at(k));
  return out;
}

}  // namespace glossa
