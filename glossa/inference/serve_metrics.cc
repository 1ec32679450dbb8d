#include "glossa/inference/serve_metrics.h"

#include <sstream>
#include <vector>

namespace glossa {
namespace {

const std::vector<double> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1,     2.5,  5,     10,   30};
const std::vector<double> kBatchBounds = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

void Gauge(std::ostringstream& out, const char* name, const char* help, int64_t value) {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
      << name << " " << value << "\n";
}

void Counter(std::ostringstream& out, const char* name, const char* help, int64_t value) {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
      << name << " " << value << "\n";
}

}  // namespace

ServeMetrics::ServeMetrics() : batch_sizes_(kBatchBounds) {}

void ServeMetrics::CountRequest(const std::string& subgraph, int status, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{subgraph, status}];
  latency_.try_emplace(subgraph, kLatencyBounds).first->second.Observe(seconds);
}

void ServeMetrics::CountRefused(const std::string& subgraph, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{subgraph, status}];
}

void ServeMetrics::ObserveBatch(int64_t examples) {
  std::lock_guard<std::mutex> lock(mu_);
  batch_sizes_.Observe(static_cast<double>(examples));
}

void ServeMetrics::CountReload(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  ++(ok ? reloads_ok_ : reloads_failed_);
}

std::string ServeMetrics::Text(const Gauges& g) const {
  std::ostringstream out;
  std::lock_guard<std::mutex> lock(mu_);
  out << "# HELP glossa_serve_requests_total Requests to :run, by subgraph and HTTP status.\n"
      << "# TYPE glossa_serve_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out << "glossa_serve_requests_total{subgraph=\"" << key.first << "\",code=\"" << key.second
        << "\"} " << n << "\n";
  }
  out << "# HELP glossa_serve_request_duration_seconds Time from receiving a :run request to "
         "its answer.\n# TYPE glossa_serve_request_duration_seconds histogram\n";
  for (const auto& [subgraph, h] : latency_) {
    h.Print(out, "glossa_serve_request_duration_seconds", "subgraph=\"" + subgraph + "\"");
  }
  out << "# HELP glossa_serve_batch_size Examples per run of the model (merged requests).\n"
         "# TYPE glossa_serve_batch_size histogram\n";
  batch_sizes_.Print(out, "glossa_serve_batch_size", "");
  Gauge(out, "glossa_serve_queue_depth", "Requests waiting for a batch.", g.queued);
  Gauge(out, "glossa_serve_in_flight_requests", "Requests received and not yet answered.",
        g.in_flight);
  Gauge(out, "glossa_serve_connections", "Open client connections.", g.connections);
  Counter(out, "glossa_serve_connections_refused_total",
          "Connections answered 503 at once (--max_connections, --max_connections_per_client).",
          g.connections_refused);
  Counter(out, "glossa_serve_connections_timed_out_total",
          "Connections closed for a header or body that did not arrive in time "
          "(--header_timeout_secs, --body_timeout_secs).",
          g.connections_timed_out);
  Gauge(out, "glossa_serve_model_global_step", "The global step of the weights served.",
        g.global_step);
  out << "# HELP glossa_serve_reloads_total Weight reloads, by result.\n"
         "# TYPE glossa_serve_reloads_total counter\n"
      << "glossa_serve_reloads_total{result=\"ok\"} " << reloads_ok_ << "\n"
      << "glossa_serve_reloads_total{result=\"error\"} " << reloads_failed_ << "\n";
  return out.str();
}

}  // namespace glossa
