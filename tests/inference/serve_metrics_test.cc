// ServeMetrics: what GET /metrics prints, counted and bucketed.
#include "glossa/inference/serve_metrics.h"

#include <gtest/gtest.h>

namespace glossa {
namespace {

TEST(ServeMetrics, CountsBucketsAndGaugesInPrometheusText) {
  ServeMetrics m;
  m.CountRequest("score", 200, 0.004);
  m.CountRequest("score", 200, 0.2);
  m.CountRequest("score", 400, 0.001);
  m.ObserveBatch(3);
  m.CountReload(true);
  m.CountReload(false);
  m.CountReload(false);
  ServeMetrics::Gauges g;
  g.queued = 7;
  g.in_flight = 2;
  g.connections = 5;
  g.connections_refused = 1;
  g.global_step = 1200;
  const std::string text = m.Text(g);
  for (const char* line : {
           "glossa_serve_requests_total{subgraph=\"score\",code=\"200\"} 2\n",
           "glossa_serve_requests_total{subgraph=\"score\",code=\"400\"} 1\n",
           "glossa_serve_request_duration_seconds_count{subgraph=\"score\"} 3\n",
           "glossa_serve_batch_size_count 1\n",
           "glossa_serve_queue_depth 7\n",
           "glossa_serve_in_flight_requests 2\n",
           "glossa_serve_connections 5\n",
           "glossa_serve_connections_refused_total 1\n",
           "glossa_serve_connections_timed_out_total 0\n",
           "glossa_serve_model_global_step 1200\n",
           "glossa_serve_reloads_total{result=\"ok\"} 1\n",
           "glossa_serve_reloads_total{result=\"error\"} 2\n",
           "# TYPE glossa_serve_connections_refused_total counter\n",
           "# TYPE glossa_serve_queue_depth gauge\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nin:\n" << text;
  }
}

}  // namespace
}  // namespace glossa
