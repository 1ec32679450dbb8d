#include "glossa/inference/server.h"

#include <ATen/ATen.h>
#include <glog/logging.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/inference/connection_guard.h"
#include "glossa/inference/batching.h"
#include "glossa/inference/json_io.h"
#include "glossa/inference/prometheus.h"
#include "glossa/inference/predictor.h"
#include "glossa/runtime/saver.h"

namespace glossa {

namespace {

using Clock = std::chrono::steady_clock;

// A full queue or a stopping server: HTTP 503.
class UnavailableError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

int HttpStatus(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kDataLoss:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

std::string ErrorBody(std::string_view code, const std::string& message) {
  nlohmann::json j;
  j["error"] = {{"code", code}, {"message", message}};
  // A message may quote the request's bytes: invalid UTF-8 becomes U+FFFD, never an exception.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

const std::vector<double> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1,     2.5,  5,     10,   30};
const std::vector<double> kBatchBounds = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

// One request waiting for a batch.
struct Pending {
  std::string subgraph, key;
  InferenceMap feeds;
  int64_t n = 0;
  Clock::time_point enqueued;
  std::promise<std::pair<InferenceMap, int64_t>> done;  // fetches, global step
};

std::vector<const InferenceMap*> FeedsOf(const std::vector<std::shared_ptr<Pending>>& batch) {
  std::vector<const InferenceMap*> out;
  for (const auto& p : batch) out.push_back(&p->feeds);
  return out;
}

}  // namespace

struct InferenceServer::Impl {
  Predictor* predictor;
  ServeOptions options;
  httplib::Server http;
  std::thread listen_thread, watch_thread;
  std::vector<std::thread> batch_threads;
  std::atomic<bool> started{false}, stopping{false}, stopped{false};
  std::atomic<int64_t> in_flight{0};
  std::mutex stop_mu;

  // The batch queues, one per subgraph with its own batch threads: a long generation never holds
  // up another subgraph's requests.
  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::deque<std::shared_ptr<Pending>>> queues;
  int64_t queued = 0;

  // Connections (connection_guard.h).
  std::shared_ptr<ConnectionTable> connections;
  int port = 0;
  bool paused = false, batch_stop = false;
  bool draining = false;  // stopping: run what is queued without waiting for more

  // The watched logdir.
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool watch_stop = false;
  std::string last_watched;

  // Metrics.
  mutable std::mutex metrics_mu;
  std::map<std::pair<std::string, int>, int64_t> requests;
  std::map<std::string, Histogram> latency;
  Histogram batch_sizes{kBatchBounds};
  int64_t reloads_ok = 0, reloads_failed = 0;

  const std::map<std::string, InferenceSubgraphSpec> specs;

  Impl(Predictor* p, ServeOptions o)
      : predictor(p), options(std::move(o)), specs(p->ListSubgraphs()) {}

  void Count(const std::string& subgraph, int status, double seconds) {
    std::lock_guard<std::mutex> lock(metrics_mu);
    ++requests[{subgraph, status}];
    latency.try_emplace(subgraph, kLatencyBounds).first->second.Observe(seconds);
  }

  // --- batching -----------------------------------------------------------------------------

  std::future<std::pair<InferenceMap, int64_t>> Enqueue(const std::string& subgraph,
                                                        InferenceMap feeds) {
    auto p = std::make_shared<Pending>();
    p->subgraph = subgraph;
    p->key = MergeKey(subgraph, feeds);
    p->n = BatchSize(feeds);
    p->feeds = std::move(feeds);
    p->enqueued = Clock::now();
    auto future = p->done.get_future();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (batch_stop) throw UnavailableError("the server is stopping");
      if (queued >= options.max_enqueued_requests) {
        throw UnavailableError(StrCat("the queue is full (", options.max_enqueued_requests,
                                      " requests wait); retry later"));
      }
      queues[subgraph].push_back(std::move(p));
      ++queued;
    }
    cv.notify_all();
    return future;
  }

  void BatchLoop(const std::string& subgraph) {
    std::deque<std::shared_ptr<Pending>>* q = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      q = &queues[subgraph];  // map nodes stay put
    }
    auto& queue = *q;
    for (;;) {
      std::vector<std::shared_ptr<Pending>> batch;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return (!queue.empty() && !paused) || (batch_stop && queue.empty()); });
        if (queue.empty()) return;  // batch_stop
        batch.push_back(queue.front());
        queue.pop_front();
        --queued;
        int64_t n = batch[0]->n;
        const auto deadline = batch[0]->enqueued + std::chrono::microseconds(
                                                       options.batch_timeout_micros);
        while (n < options.max_batch_size) {
          auto it = std::find_if(queue.begin(), queue.end(), [&](const auto& p) {
            return p->key == batch[0]->key && n + p->n <= options.max_batch_size;
          });
          if (it != queue.end()) {
            n += (*it)->n;
            batch.push_back(*it);
            queue.erase(it);
            --queued;
            continue;
          }
          if (batch_stop || draining || Clock::now() >= deadline) break;
          cv.wait_until(lock, deadline);
        }
      }
      RunBatch(batch);
    }
  }

  void RunBatch(const std::vector<std::shared_ptr<Pending>>& batch) {
    int64_t total = 0;
    for (const auto& p : batch) total += p->n;
    {
      std::lock_guard<std::mutex> lock(metrics_mu);
      batch_sizes.Observe(static_cast<double>(total));
    }
    if (batch.size() > 1) {
      try {
        int64_t step = 0;
        const InferenceMap all =
            predictor->Run(batch[0]->subgraph, MergeFeeds(FeedsOf(batch)), {}, true, &step);
        int64_t offset = 0;
        for (const auto& p : batch) {
          p->done.set_value({SliceFetches(all, offset, p->n, total), step});
          offset += p->n;
        }
        return;
      } catch (const std::exception& e) {
        // One request must not fail the others: run each alone below.
        LOG(WARNING) << "a merged batch of " << batch.size()
                     << " requests failed; running them one by one: " << e.what();
      }
    }
    for (const auto& p : batch) {
      try {
        int64_t step = 0;
        InferenceMap fetches = predictor->Run(p->subgraph, p->feeds, {}, true, &step);
        p->done.set_value({std::move(fetches), step});
      } catch (...) {
        p->done.set_exception(std::current_exception());
      }
    }
  }

  // --- HTTP ---------------------------------------------------------------------------------

  void HandleRun(const httplib::Request& req, const std::string& request_body,
                 httplib::Response& res) {
    const auto start = Clock::now();
    ++in_flight;
    std::string subgraph = req.matches[1];
    const std::string label = specs.count(subgraph) ? subgraph : std::string("(unknown)");
    try {
      if (stopping) throw UnavailableError("the server is stopping");
      auto spec = specs.find(subgraph);
      if (spec == specs.end()) predictor->Validate(subgraph, {});  // NotFound listing subgraphs
      nlohmann::json body;
      try {
        body = nlohmann::json::parse(request_body);
      } catch (const nlohmann::json::exception& e) {
        throw InvalidArgumentError(StrCat("the request body is not valid JSON: ", e.what()));
      }
      if (!body.is_object()) {
        throw InvalidArgumentError(StrCat("the request body must be a JSON object, got ",
                                          body.type_name()));
      }
      for (auto it = body.begin(); it != body.end(); ++it) {
        if (it.key() != "feeds" && it.key() != "fetch_keys") {
          throw InvalidArgumentError(StrCat("unknown request field '", it.key(),
                                            "' (fields: feeds, fetch_keys)"));
        }
      }
      if (!body.contains("feeds")) throw InvalidArgumentError("the request has no \"feeds\"");
      std::vector<std::string> fetch_keys;
      if (body.contains("fetch_keys")) {
        const auto& k = body["fetch_keys"];
        if (!k.is_array()) throw InvalidArgumentError("\"fetch_keys\" must be an array of strings");
        for (const auto& e : k) {
          if (!e.is_string()) {
            throw InvalidArgumentError("\"fetch_keys\" must be an array of strings");
          }
          fetch_keys.push_back(e.get<std::string>());
        }
      }
      InferenceMap feeds =
          FeedsFromJson(body["feeds"], spec->second, StrCat("subgraph '", subgraph, "'"));
      predictor->Validate(subgraph, feeds, fetch_keys);
      std::pair<InferenceMap, int64_t> result;
      if (options.enable_batching) {
        result = Enqueue(subgraph, std::move(feeds)).get();
      } else {
        result.first = predictor->Run(subgraph, feeds, {}, true, &result.second);
      }
      // Convert all fetches (per-token rows are cut by "lengths"), then keep the asked ones.
      nlohmann::ordered_json all = FetchesToJson(result.first);
      nlohmann::ordered_json out;
      if (fetch_keys.empty()) {
        out["fetches"] = std::move(all);
      } else {
        out["fetches"] = nlohmann::ordered_json::object();
        for (const auto& k : fetch_keys) out["fetches"][k] = all[k];
      }
      out["global_step"] = result.second;
      res.status = 200;
      res.set_content(out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace),
                      "application/json");
    } catch (const Error& e) {
      res.status = HttpStatus(e.code());
      res.set_content(ErrorBody(StatusCodeName(e.code()), e.message()), "application/json");
    } catch (const UnavailableError& e) {
      res.status = 503;
      res.set_content(ErrorBody("UNAVAILABLE", e.what()), "application/json");
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(ErrorBody("INTERNAL", e.what()), "application/json");
      LOG(ERROR) << "request to subgraph '" << subgraph << "' failed: " << e.what();
    }
    Count(label, res.status, std::chrono::duration<double>(Clock::now() - start).count());
    --in_flight;
  }

  void HandleSubgraphs(httplib::Response& res) {
    nlohmann::ordered_json out;
    out["subgraphs"] = nlohmann::ordered_json::object();
    for (const auto& [name, spec] : specs) {
      out["subgraphs"][name] = SpecToJson(spec);
    }
    out["global_step"] = predictor->global_step();
    res.set_content(out.dump(), "application/json");
  }

  void HandleReload(const std::string& request_body, httplib::Response& res,
                    InferenceServer* self) {
    try {
      nlohmann::json body = nlohmann::json::object();
      if (!request_body.empty()) {
        try {
          body = nlohmann::json::parse(request_body);
        } catch (const nlohmann::json::exception& e) {
          throw InvalidArgumentError(StrCat("the request body is not valid JSON: ", e.what()));
        }
      }
      if (!body.is_object() || (body.contains("checkpoint") && !body["checkpoint"].is_string())) {
        throw InvalidArgumentError("expected {\"checkpoint\": \"PATH\"} or {}");
      }
      const std::string checkpoint = body.value("checkpoint", std::string());
      const int64_t step = self->Reload(checkpoint);
      res.set_content(nlohmann::json({{"global_step", step}}).dump(), "application/json");
    } catch (const Error& e) {
      res.status = HttpStatus(e.code());
      res.set_content(ErrorBody(StatusCodeName(e.code()), e.message()), "application/json");
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(ErrorBody("INTERNAL", e.what()), "application/json");
    }
  }

  std::string Metrics() const {
    std::ostringstream out;
    std::lock_guard<std::mutex> lock(metrics_mu);
    out << "# HELP glossa_serve_requests_total Requests to :run, by subgraph and HTTP status.\n"
        << "# TYPE glossa_serve_requests_total counter\n";
    for (const auto& [key, n] : requests) {
      out << "glossa_serve_requests_total{subgraph=\"" << key.first << "\",code=\"" << key.second
          << "\"} " << n << "\n";
    }
    out << "# HELP glossa_serve_request_duration_seconds Time from receiving a :run request to "
           "its answer.\n# TYPE glossa_serve_request_duration_seconds histogram\n";
    for (const auto& [subgraph, h] : latency) {
      h.Print(out, "glossa_serve_request_duration_seconds", "subgraph=\"" + subgraph + "\"");
    }
    out << "# HELP glossa_serve_batch_size Examples per run of the model (merged requests).\n"
           "# TYPE glossa_serve_batch_size histogram\n";
    batch_sizes.Print(out, "glossa_serve_batch_size", "");
    out << "# HELP glossa_serve_queue_depth Requests waiting for a batch.\n"
           "# TYPE glossa_serve_queue_depth gauge\nglossa_serve_queue_depth "
        << Queued() << "\n";
    out << "# HELP glossa_serve_in_flight_requests Requests received and not yet answered.\n"
           "# TYPE glossa_serve_in_flight_requests gauge\nglossa_serve_in_flight_requests "
        << in_flight.load() << "\n";
    out << "# HELP glossa_serve_connections Open client connections.\n"
           "# TYPE glossa_serve_connections gauge\nglossa_serve_connections "
        << (connections ? connections->open() : 0) << "\n";
    out << "# HELP glossa_serve_connections_refused_total Connections answered 503 at once "
           "(--max_connections, --max_connections_per_client).\n"
           "# TYPE glossa_serve_connections_refused_total counter\n"
           "glossa_serve_connections_refused_total "
        << (connections ? connections->refused_total() : 0) << "\n";
    out << "# HELP glossa_serve_connections_timed_out_total Connections closed for a header or "
           "body that did not arrive in time (--header_timeout_secs, --body_timeout_secs).\n"
           "# TYPE glossa_serve_connections_timed_out_total counter\n"
           "glossa_serve_connections_timed_out_total "
        << (connections ? connections->timed_out_total() : 0) << "\n";
    out << "# HELP glossa_serve_model_global_step The global step of the weights served.\n"
           "# TYPE glossa_serve_model_global_step gauge\nglossa_serve_model_global_step "
        << predictor->global_step() << "\n";
    out << "# HELP glossa_serve_reloads_total Weight reloads, by result.\n"
           "# TYPE glossa_serve_reloads_total counter\n"
        << "glossa_serve_reloads_total{result=\"ok\"} " << reloads_ok << "\n"
        << "glossa_serve_reloads_total{result=\"error\"} " << reloads_failed << "\n";
    return out.str();
  }

  int64_t Queued() const {
    std::lock_guard<std::mutex> lock(mu);
    return queued;
  }

  void WatchLoop(InferenceServer* self) {
    const std::string dir = JoinPath(options.watch_logdir, "train");
    std::string failed;  // the last checkpoint that failed to load (reported once)
    std::unique_lock<std::mutex> lock(watch_mu);
    while (!watch_stop) {
      lock.unlock();
      try {
        const auto latest = Saver::LatestCheckpoint(dir);
        if (latest && *latest != last_watched && *latest != failed) {
          self->Reload(*latest);
        }
      } catch (const std::exception& e) {
        const auto latest = Saver::LatestCheckpoint(dir);
        failed = latest.value_or("");
        LOG(WARNING) << "watching '" << dir << "': " << e.what();
      }
      lock.lock();
      watch_cv.wait_for(lock, std::chrono::duration<double>(options.watch_interval_secs),
                        [&] { return watch_stop; });
    }
  }
};

InferenceServer::InferenceServer(Predictor* predictor, ServeOptions options)
    : impl_(std::make_unique<Impl>(predictor, std::move(options))) {
  const ServeOptions& o = impl_->options;
  if (o.connection_limits.max_connections < 1 ||
      o.connection_limits.max_connections_per_client < 1 ||
      !(o.connection_limits.header_timeout_secs > 0) ||
      !(o.connection_limits.body_timeout_secs > 0) || o.num_batch_threads < 1 ||
      o.max_batch_size < 1 ||
      o.batch_timeout_micros < 0 || o.max_enqueued_requests < 1 || o.max_body_bytes < 1 ||
      o.watch_interval_secs <= 0) {
    throw InvalidArgumentError(
        "serve: max_connections, max_connections_per_client, the timeouts, num_batch_threads, "
        "max_batch_size, max_enqueued_requests, "
        "max_body_bytes and watch_interval_secs must be positive, batch_timeout_micros >= 0");
  }
  if (o.enable_batching && o.max_batch_size > predictor->options().max_batch_size) {
    throw InvalidArgumentError(StrCat("serve: max_batch_size ", o.max_batch_size,
                                      " is more than the predictor's max_batch_size ",
                                      predictor->options().max_batch_size));
  }
}

InferenceServer::~InferenceServer() { Stop(); }

int InferenceServer::Start() {
  Impl& m = *impl_;
  if (m.started.exchange(true)) throw FailedPreconditionError("serve: Start() called twice");
  auto& http = m.http;
  m.connections = std::make_shared<ConnectionTable>(m.options.connection_limits);
  http.new_task_queue = [&m] { return new ConnectionQueue(m.connections, m.port); };
  http.set_payload_max_length(m.options.max_body_bytes);
  http.set_keep_alive_timeout(2);
  http.set_tcp_nodelay(true);  // no Nagle delay between the header and body writes
  http.set_read_timeout(30);
  // Before any body is read: the header is complete (the connection's header clock stops), a
  // declared body over the limit is answered 413 at once, and a POST to no endpoint 404 (neither
  // is read).
  http.set_pre_routing_handler([&m](const httplib::Request& req, httplib::Response& res) {
    m.connections->HeaderDone(req.remote_addr, req.remote_port);
    const bool post = req.method == "POST";
    const bool known_post = post && (req.path == "/v1/admin/reload" ||
                                     (req.path.rfind("/v1/subgraphs/", 0) == 0 &&
                                      req.path.size() > 18 &&
                                      req.path.compare(req.path.size() - 4, 4, ":run") == 0));
    const uint64_t declared = req.has_header("Content-Length")
                                  ? std::strtoull(req.get_header_value("Content-Length").c_str(),
                                                  nullptr, 10)
                                  : 0;
    const bool chunked = req.get_header_value("Transfer-Encoding") == "chunked";
    // A body up to 64 times the limit is read and dropped by cpp-httplib (413), so that the
    // client, still sending it, sees the answer; beyond, the connection stops being read.
    if (declared > 64 * static_cast<uint64_t>(m.options.max_body_bytes)) {
      res.status = 413;
    } else if (post && !known_post && chunked) {
      res.status = 404;
    } else {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    m.connections->StopReading(req.remote_addr, req.remote_port);
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_logger([&m](const httplib::Request& req, const httplib::Response&) {
    m.connections->Answered(req.remote_addr, req.remote_port);
  });
  // POST bodies are read here, chunked or not, and stop at max_body_bytes (413).
  auto read_body = [&m](const httplib::Request& req, httplib::Response& res,
                        const httplib::ContentReader& reader, std::string* body) {
    bool too_large = false;
    const bool read = reader([&](const char* data, size_t n) {
      if (body->size() + n > m.options.max_body_bytes) {
        too_large = true;
        return false;
      }
      body->append(data, n);
      return true;
    });
    m.connections->BodyDone(req.remote_addr, req.remote_port);
    if (read) return true;
    if (!too_large && res.status != 413) {  // cut short by the client, or malformed chunks
      res.status = 400;
      res.set_content(ErrorBody("INVALID_ARGUMENT", "the request body could not be read whole"),
                      "application/json");
      return false;
    }
    // Over the limit: cpp-httplib has dropped a declared body; a chunked one stops being read.
    if (too_large) m.connections->StopReading(req.remote_addr, req.remote_port);
    res.status = 413;
    res.set_content(ErrorBody("RESOURCE_EXHAUSTED",
                              StrCat("the request body is larger than the server's "
                                     "max_body_bytes (", m.options.max_body_bytes, ")")),
                    "application/json");
    return false;
  };
  http.Post(R"(/v1/subgraphs/([^/]+):run)",
            [&m, read_body](const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader) {
              std::string body;
              if (read_body(req, res, reader, &body)) m.HandleRun(req, body, res);
            });
  http.Get("/v1/subgraphs",
           [&m](const httplib::Request&, httplib::Response& res) { m.HandleSubgraphs(res); });
  http.Post("/v1/admin/reload", [this, read_body](const httplib::Request& req,
                                                  httplib::Response& res,
                                                  const httplib::ContentReader& reader) {
    std::string body;
    if (read_body(req, res, reader, &body)) impl_->HandleReload(body, res, this);
  });
  http.Get("/healthz", [&m](const httplib::Request&, httplib::Response& res) {
    const bool ok = !m.stopping;
    res.status = ok ? 200 : 503;
    res.set_content(nlohmann::json({{"status", ok ? "ok" : "stopping"},
                                    {"global_step", m.predictor->global_step()}})
                        .dump(),
                    "application/json");
  });
  http.Get("/metrics", [&m](const httplib::Request&, httplib::Response& res) {
    res.set_content(m.Metrics(), "text/plain; version=0.0.4");
  });
  // Answers cpp-httplib makes itself (unknown paths 404, oversized bodies 413) get a JSON body.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string code = "INVALID_ARGUMENT", message = StrCat("HTTP ", res.status);
    if (res.status == 404) {
      code = "NOT_FOUND";
      message = StrCat("no endpoint ", req.method, " ", req.path,
                       " (endpoints: GET /v1/subgraphs, POST /v1/subgraphs/NAME:run, "
                       "POST /v1/admin/reload, GET /healthz, GET /metrics)");
    } else if (res.status == 413) {
      code = "RESOURCE_EXHAUSTED";
      message = "the request body is larger than the server's max_body_bytes";
    }
    res.set_content(ErrorBody(code, message), "application/json");
  });
  const int port = m.options.port == 0 ? http.bind_to_any_port(m.options.host)
                                       : (http.bind_to_port(m.options.host, m.options.port)
                                              ? m.options.port
                                              : -1);
  if (port < 0) {
    throw AbortedError(StrCat("serve: cannot listen on ", m.options.host, ":", m.options.port,
                              " (in use, or not an address of this machine)"));
  }
  m.port = port;
  if (m.options.enable_batching) {
    for (const auto& [name, spec] : m.specs) {
      for (int i = 0; i < m.options.num_batch_threads; ++i) {
        m.batch_threads.emplace_back([&m, name = name] { m.BatchLoop(name); });
      }
    }
  }
  m.listen_thread = std::thread([&m] { m.http.listen_after_bind(); });
  if (!m.options.watch_logdir.empty()) {
    m.watch_thread = std::thread([this] { impl_->WatchLoop(this); });
  }
  return port;
}

void InferenceServer::Stop() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> stop_lock(m.stop_mu);
  if (!m.started || m.stopped) return;
  m.stopping = true;
  m.http.stop();  // no new connections; the handlers in flight run to their end
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.draining = true;
    m.paused = false;
  }
  m.cv.notify_all();
  if (m.listen_thread.joinable()) m.listen_thread.join();  // joins the HTTP worker threads
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.batch_stop = true;
  }
  m.cv.notify_all();
  for (auto& t : m.batch_threads) t.join();
  {
    std::lock_guard<std::mutex> lock(m.watch_mu);
    m.watch_stop = true;
  }
  m.watch_cv.notify_all();
  if (m.watch_thread.joinable()) m.watch_thread.join();
  m.stopped = true;
}

int64_t InferenceServer::Reload(const std::string& checkpoint) {
  Impl& m = *impl_;
  std::string path = checkpoint;
  if (path.empty()) {
    if (m.options.watch_logdir.empty()) {
      throw InvalidArgumentError("reload: give a \"checkpoint\" (the server watches no logdir)");
    }
    const std::string dir = JoinPath(m.options.watch_logdir, "train");
    const auto latest = Saver::LatestCheckpoint(dir);
    if (!latest) throw NotFoundError(StrCat("reload: no checkpoint in '", dir, "'"));
    path = *latest;
  }
  try {
    m.predictor->Load(path);
  } catch (...) {
    std::lock_guard<std::mutex> lock(m.metrics_mu);
    ++m.reloads_failed;
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(m.watch_mu);
    m.last_watched = path;
  }
  const int64_t step = m.predictor->global_step();
  std::lock_guard<std::mutex> lock(m.metrics_mu);
  ++m.reloads_ok;
  LOG(INFO) << "serving the weights of '" << path << "' (global step " << step << ")";
  return step;
}

std::string InferenceServer::MetricsText() const { return impl_->Metrics(); }
int64_t InferenceServer::in_flight() const { return impl_->in_flight.load(); }
int64_t InferenceServer::queued() const { return impl_->Queued(); }

void InferenceServer::PauseBatching() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->paused = true;
}

void InferenceServer::ResumeBatching() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->paused = false;
  }
  impl_->cv.notify_all();
}

}  // namespace glossa
