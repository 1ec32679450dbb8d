// `glossa serve`: a Predictor over HTTP/JSON (Debian's cpp-httplib), with TF Serving's dynamic
// batching.
//
//   GET  /v1/subgraphs               {"subgraphs": {NAME: {doc, feeds, fetches}}, "global_step": N}
//   POST /v1/subgraphs/NAME:run      {"feeds": {...}, "fetch_keys": [...]?}
//                                    -> {"fetches": {...}, "global_step": N}
//   POST /v1/subgraphs/NAME:stream   the same body -> server-sent events: a token event per token
//                                    drawn, then the :run answer (glossa/inference/event_stream.h)
//   POST /v1/admin/reload            {"checkpoint": PATH} (or {} with a watched logdir: its latest)
//   GET  /healthz                    {"status": "ok", "global_step": N}
//   GET  /metrics                    Prometheus text: requests by subgraph and code, latency and
//                                    batch-size histograms, queue depth, in-flight requests
//
// Errors answer {"error": {"code": "INVALID_ARGUMENT", "message": ...}}: 400 bad JSON or feeds,
// 404 unknown subgraph or path, 413 a body over max_body_bytes, 503 a full queue or a stopping
// server, 500 anything else. Requests for one subgraph with the same option feeds (rank 0) are
// merged into batches of up to max_batch_size examples, waiting at most batch_timeout_micros for
// more after the first; at most max_enqueued_requests wait. Stop() stops accepting, lets every
// request in flight finish, then returns.
//
//   Predictor predictor(bundle_dir);
//   InferenceServer server(&predictor, ServeOptions{});
//   int port = server.Start();      // ServeOptions::port 0: a free port
//   ...
//   server.Stop();
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace glossa {

class Predictor;

// Connection limits (glossa/inference/connection_guard.h): connections in total and per client
// address, and how long a request's header (from the connection's open or its previous answer)
// and body (from the header) may take in total.
struct ConnectionLimits {
  int64_t max_connections = 512;
  int64_t max_connections_per_client = 128;
  double header_timeout_secs = 10;
  double body_timeout_secs = 60;
};

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port (Start returns it)
  size_t max_body_bytes = size_t{4} << 20;  // a larger body, chunked or not, is 413 when it passes it
  // Connections in total and per client, and how long a header and a body may take
  // (glossa/inference/connection_guard.h).
  ConnectionLimits connection_limits;
  // Dynamic batching (TF Serving's BatchingParameters); off: each request runs on its own thread.
  bool enable_batching = true;
  int64_t max_batch_size = 32;
  int64_t batch_timeout_micros = 0;  // 0: run what is queued at once (under load, requests
                                     // queue while a batch runs and merge)
  int64_t max_enqueued_requests = 256;
  int num_batch_threads = 1;  // per subgraph: replicas (glossa/runtime/cpu_runtime.h)
  // Continuous batching (glossa/inference/continuous_batching.h), with enable_batching: the
  // subgraphs that generate token by token run a decoding batch per batch thread that requests
  // join and leave at step boundaries (up to max_batch_size rows), and answer :stream with
  // server-sent events. Off: they batch as the other subgraphs do.
  bool continuous_batching = true;
  // A :run request not answered this many seconds after its body arrived is answered 503
  // (UNAVAILABLE) and its HTTP thread freed; one still waiting for a batch is then dropped
  // unrun. A batch already running finishes (its answer discarded). 0: no limit.
  double request_timeout_secs = 60;
  // Reload the latest checkpoint of <watch_logdir>/train when it changes (empty: no watching).
  std::string watch_logdir;
  double watch_interval_secs = 10;
};

class InferenceServer {
 public:
  InferenceServer(Predictor* predictor, ServeOptions options);
  ~InferenceServer();  // Stop()s

  // Binds and starts serving in background threads; returns the port. Throws when it cannot bind.
  int Start();
  // Stops accepting connections, finishes the requests in flight, stops the threads. Idempotent.
  void Stop();

  // Loads a checkpoint into the predictor (the watched logdir's latest when empty); returns its
  // global step. Requests keep running on the old weights meanwhile.
  int64_t Reload(const std::string& checkpoint);

  std::string MetricsText() const;
  // The subgraphs that run continuous batching (and stream), known once Start has run.
  std::vector<std::string> ContinuousSubgraphs() const;
  int64_t in_flight() const;
  int64_t queued() const;

  // For tests: hold the batch threads (requests queue up) until ResumeBatching.
  void PauseBatching();
  void ResumeBatching();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace glossa
