// What `glossa serve` reports at GET /metrics, in Prometheus's text format: requests by subgraph
// and HTTP status, their latency and batch-size histograms (prometheus.h), weight reloads, and the
// gauges the server reads at scrape time.
//
//   ServeMetrics metrics;
//   metrics.CountRequest("score", 200, 0.004);
//   std::string text = metrics.Text({.queued = 3, .global_step = 1200});
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "glossa/inference/prometheus.h"

namespace glossa {

class ServeMetrics {
 public:
  struct Gauges {
    int64_t queued = 0, in_flight = 0, connections = 0;
    int64_t connections_refused = 0, connections_timed_out = 0;
    int64_t global_step = 0;
  };

  ServeMetrics();
  void CountRequest(const std::string& subgraph, int status, double seconds);
  // A request refused before it was run (413, 404): counted, with no latency sample.
  void CountRefused(const std::string& subgraph, int status);
  void ObserveBatch(int64_t examples);
  void CountReload(bool ok);
  std::string Text(const Gauges& gauges) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, Histogram> latency_;
  Histogram batch_sizes_;
  int64_t reloads_ok_ = 0, reloads_failed_ = 0;
};

}  // namespace glossa
