// A Prometheus histogram for /metrics (glossa serve): observations counted into buckets, printed
// cumulatively with their sum and count in the text exposition format.
//
//   Histogram h({0.01, 0.1, 1});  h.Observe(0.05);
//   std::ostringstream out;  h.Print(out, "latency_seconds", "subgraph=\"default\"");
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace glossa {

struct Histogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // per bucket, plus +Inf
  double sum = 0;
  int64_t count = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void Observe(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    ++counts[i];
    sum += v;
    ++count;
  }
  void Print(std::ostringstream& out, const std::string& name, const std::string& labels) const {
    const std::string sep = labels.empty() ? "" : ",";
    int64_t cumulative = 0;
    for (size_t i = 0; i <= bounds.size(); ++i) {
      cumulative += counts[i];
      std::ostringstream le;
      if (i < bounds.size()) {
        le << bounds[i];
      } else {
        le << "+Inf";
      }
      out << name << "_bucket{" << labels << sep << "le=\"" << le.str() << "\"} " << cumulative
          << "\n";
    }
    const std::string braces = labels.empty() ? "" : "{" + labels + "}";
    out << name << "_sum" << braces << " " << sum << "\n";
    out << name << "_count" << braces << " " << count << "\n";
  }
};

}  // namespace glossa
