// What the bench programs share: --key=value flags over defaults, and a monotonic clock.
//
//   auto f = glossa::bench::ParseFlags(argc, argv, {{"runs", "3"}, {"batch", "16"}});
//   const double t0 = glossa::bench::Now();
#pragma once

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "glossa/kernels/kernel_choice.h"

namespace glossa::bench {

// The kernel choices this run made (glossa/kernels/kernel_choice.h), counted per op and path:
// "kernel_choices bf16_affine:aten=0,native=4 fp32_row_affine:aten=3,native=6".
inline void PrintKernelChoices() {
  std::map<std::string, std::pair<int, int>> chosen;  // op -> (aten, native)
  for (const KernelDecision& k : KernelDecisions()) {
    (k.native ? chosen[k.op].second : chosen[k.op].first) += 1;
  }
  if (chosen.empty()) return;
  std::printf("kernel_choices");
  for (const auto& [op, n] : chosen) std::printf(" %s:aten=%d,native=%d", op.c_str(), n.first, n.second);
  std::printf("\n");
}

// `flags` (the defaults) with each --key=value of the command line applied. A flag that is not
// --key=value of a known key exits with status 2, naming it and the valid flags; with
// `bare_means_true`, --key alone sets "1".
inline std::map<std::string, std::string> ParseFlags(int argc, char** argv,
                                                     std::map<std::string, std::string> flags,
                                                     bool bare_means_true = false) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    const std::string k =
        a.rfind("--", 0) == 0 ? a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)
                              : "";
    if (k.empty() || !flags.count(k) || (eq == std::string::npos && !bare_means_true)) {
      std::string valid;
      for (const auto& [name, value] : flags) valid += " --" + name;
      std::fprintf(stderr, "bad flag %s (flags:%s)\n", a.c_str(), valid.c_str());
      std::exit(2);
    }
    flags[k] = eq == std::string::npos ? "1" : a.substr(eq + 1);
  }
  return flags;
}

// Seconds on the steady clock.
inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs f once and prints its op counts: dispatcher calls (every ATen op, nested ones included), the
// outermost ones (what the model code calls) by name, and the autograd nodes a backward pass ran.
//   ops_per_<what> 812 outermost_ops_per_<what> 301 autograd_nodes_per_<what> 0
inline void PrintOpCounts(const std::function<void()>& f, const std::string& what) {
  static thread_local int depth = 0;
  static std::map<std::string, int64_t> outer;
  static int64_t all = 0, nodes = 0;
  outer.clear();
  all = nodes = 0;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
            if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
              ++nodes;
            } else {
              ++all;
              if (depth == 0) ++outer[fn.name()];
            }
            ++depth;
            return nullptr;
          },
          [](const at::RecordFunction&, at::ObserverContext*) { --depth; })
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  f();
  at::removeCallback(handle);
  int64_t outer_total = 0;
  std::vector<std::pair<int64_t, std::string>> top;
  for (const auto& [name, n] : outer) {
    outer_total += n;
    top.emplace_back(n, name);
  }
  std::sort(top.rbegin(), top.rend());
  std::printf("ops_per_%s %lld outermost_ops_per_%s %lld autograd_nodes_per_%s %lld\n", what.c_str(),
              static_cast<long long>(all), what.c_str(), static_cast<long long>(outer_total),
              what.c_str(), static_cast<long long>(nodes));
  for (size_t i = 0; i < std::min<size_t>(top.size(), 40); ++i) {
    std::printf("  %6lld %s\n", static_cast<long long>(top[i].first), top[i].second.c_str());
  }
}

}  // namespace glossa::bench
