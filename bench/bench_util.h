// What the bench programs share: --key=value flags over defaults, and a monotonic clock.
//
//   auto f = glossa::bench::ParseFlags(argc, argv, {{"runs", "3"}, {"batch", "16"}});
//   const double t0 = glossa::bench::Now();
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace glossa::bench {

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

}  // namespace glossa::bench
