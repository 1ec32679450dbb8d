#include "glossa/inference/server.h"

#include <ATen/ATen.h>
#include <glog/logging.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/base/thread_state.h"
#include "glossa/inference/connection_guard.h"
#include "glossa/inference/batch_queue.h"
#include "glossa/inference/continuous_batching.h"
#include "glossa/inference/event_stream.h"
#include "glossa/inference/json_io.h"
#include "glossa/inference/serve_metrics.h"
#include "glossa/inference/predictor.h"
#include "glossa/checkpoint/saver.h"

namespace glossa {

namespace {

using Clock = std::chrono::steady_clock;

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

}  // namespace

struct InferenceServer::Impl {
  Predictor* predictor;
  ServeOptions options;
  httplib::Server http;
  std::thread listen_thread, watch_thread;
  std::atomic<bool> started{false}, stopping{false}, stopped{false};
  std::atomic<int64_t> in_flight{0};
  // :stream answers being written; Stop waits for them (cpp-httplib's stop cuts a chunked answer).
  int64_t streams = 0;
  std::mutex streams_mu;
  std::condition_variable streams_cv;
  std::mutex stop_mu;

  // Connections (connection_guard.h).
  std::shared_ptr<ConnectionTable> connections;
  int port = 0;

  // The watched logdir.
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool watch_stop = false;
  std::string last_watched;

  ServeMetrics metrics;
  std::unique_ptr<BatchQueue> batches;  // with enable_batching
  // With continuous_batching: the subgraphs that generate token by token.
  std::map<std::string, std::unique_ptr<ContinuousBatcher>> generators;

  const std::map<std::string, InferenceSubgraphSpec> specs;

  Impl(Predictor* p, ServeOptions o)
      : predictor(p), options(std::move(o)), specs(p->ListSubgraphs()) {}

  // --- HTTP ---------------------------------------------------------------------------------


  // Runs the feeds: through the batch queue, answered by `start` + request_timeout_secs or
  // UnavailableError; or on this thread without batching.
  Clock::time_point Deadline(Clock::time_point start) const {
    return options.request_timeout_secs > 0
               ? start + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(options.request_timeout_secs))
               : Clock::time_point::max();
  }

  std::pair<InferenceMap, int64_t> RunFeeds(const std::string& subgraph, InferenceMap feeds,
                                            Clock::time_point start) {
    std::pair<InferenceMap, int64_t> result;
    if (!options.enable_batching) {
      result.first = predictor->Run(subgraph, feeds, {}, true, &result.second);
      return result;
    }
    const auto deadline = Deadline(start);
    if (auto g = generators.find(subgraph); g != generators.end()) {
      // Joins the running batch; its tokens are not streamed here, only the answer.
      std::shared_ptr<GenerationStream> stream = g->second->Enqueue(std::move(feeds), deadline);
      GenerationEvent e;
      do {
        if (!stream->Next(&e, deadline)) {
          throw UnavailableError(StrCat("no answer within request_timeout_secs = ",
                                        options.request_timeout_secs,
                                        " s (the server is overloaded): try again later"));
        }
      } while (e.kind == GenerationEvent::kJoined || e.kind == GenerationEvent::kToken);
      if (e.kind == GenerationEvent::kError) std::rethrow_exception(e.error);
      return {std::move(e.fetches), e.global_step};
    }
    std::future<BatchQueue::Result> answer =
        batches->Enqueue(subgraph, std::move(feeds), deadline);
    if (options.request_timeout_secs > 0 &&
        answer.wait_until(deadline) != std::future_status::ready) {
      throw UnavailableError(StrCat("no answer within request_timeout_secs = ",
                                    options.request_timeout_secs,
                                    " s (the server is overloaded): try again later"));
    }
    return answer.get();
  }

  // :run, or with `stream` :stream (server-sent events, glossa/inference/event_stream.h).
  void HandleRun(const httplib::Request& req, const std::string& request_body,
                 httplib::Response& res, bool stream = false) {
    const auto start = Clock::now();
    ++in_flight;
    std::string subgraph = req.matches[1];
    const std::string label = specs.count(subgraph) ? subgraph : std::string("(unknown)");
    try {
      if (stopping) throw UnavailableError("the server is stopping");
      auto spec = specs.find(subgraph);
      if (spec == specs.end()) predictor->Validate(subgraph, {});  // NotFound listing subgraphs
      std::vector<std::string> fetch_keys;
      nlohmann::json body = ParseRunRequest(request_body, fetch_keys);
      InferenceMap feeds =
          FeedsFromJson(body["feeds"], spec->second, StrCat("subgraph '", subgraph, "'"));
      predictor->Validate(subgraph, feeds, fetch_keys);
      if (stream) {
        auto g = generators.find(subgraph);
        if (g == generators.end()) {
          throw FailedPreconditionError(StrCat(
              "subgraph '", subgraph, "' cannot stream: ",
              options.enable_batching && options.continuous_batching
                  ? "it does not generate token by token"
                  : "streaming needs continuous batching (off with --no_batching or "
                    "--no_continuous_batching)"));
        }
        const auto wait = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
            options.request_timeout_secs > 0 ? options.request_timeout_secs : 86400.0 * 365));
        auto events = g->second->Enqueue(std::move(feeds), Deadline(start));
        {
          std::lock_guard<std::mutex> lock(streams_mu);
          ++streams;
        }
        AnswerWithEventStream(std::move(events), fetch_keys, wait, res, [this, label, start](bool) {
          metrics.CountRequest(label, 200,
                               std::chrono::duration<double>(Clock::now() - start).count());
          --in_flight;
          std::lock_guard<std::mutex> lock(streams_mu);
          if (--streams == 0) streams_cv.notify_all();
        });
        return;  // counted when the stream ends
      }
      const std::pair<InferenceMap, int64_t> result = RunFeeds(subgraph, std::move(feeds), start);
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
    metrics.CountRequest(label, res.status,
                         std::chrono::duration<double>(Clock::now() - start).count());
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

  int64_t Queued() const {
    int64_t n = batches ? batches->queued() : 0;
    for (const auto& [name, g] : generators) n += g->queued();
    return n;
  }

  std::string Metrics() const {
    ServeMetrics::Gauges g;
    g.queued = Queued();
    g.in_flight = in_flight.load();
    if (connections) {
      g.connections = connections->open();
      g.connections_refused = connections->refused_total();
      g.connections_timed_out = connections->timed_out_total();
    }
    g.global_step = predictor->global_step();
    return metrics.Text(g);
  }

  // --- routes -------------------------------------------------------------------------------

  // Connection limits (connection_guard.h) and what is answered before a body is read.
  void InstallGuards() {
    connections = std::make_shared<ConnectionTable>(options.connection_limits);
    http.new_task_queue = [this] { return new ConnectionQueue(connections, port); };
    http.set_payload_max_length(options.max_body_bytes);
    // cpp-httplib would close a silent connection after its keep-alive wait, uncounted; past the
    // header timeout instead, the table's watcher closes it and counts it as timed out.
    http.set_keep_alive_timeout(
        static_cast<time_t>(std::ceil(options.connection_limits.header_timeout_secs)) + 1);
    http.set_tcp_nodelay(true);  // no Nagle delay between the header and body writes
    http.set_read_timeout(30);
    // Before any body is read: the header is complete (the connection's header clock stops), a
    // declared body over the limit is answered 413 at once, and a POST to no endpoint 404 (neither
    // is read).
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      connections->HeaderDone(req.remote_addr, req.remote_port);
      const bool post = req.method == "POST";
      const bool known_post = post && (req.path == "/v1/admin/reload" ||
                                       (req.path.rfind("/v1/subgraphs/", 0) == 0 &&
                                        req.path.size() > 18 &&
                                        (req.path.compare(req.path.size() - 4, 4, ":run") == 0 ||
                                         req.path.compare(req.path.size() - 7, 7, ":stream") == 0)));
      const uint64_t declared = req.has_header("Content-Length")
                                    ? std::strtoull(req.get_header_value("Content-Length").c_str(),
                                                    nullptr, 10)
                                    : 0;
      const bool chunked = req.get_header_value("Transfer-Encoding") == "chunked";
      // A body up to 64 times the limit is read and dropped by cpp-httplib (413), so that the
      // client, still sending it, sees the answer; beyond, the connection stops being read.
      if (declared > 64 * static_cast<uint64_t>(options.max_body_bytes)) {
        res.status = 413;
      } else if (post && !known_post && chunked) {
        res.status = 404;
      } else {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      connections->StopReading(req.remote_addr, req.remote_port);
      return httplib::Server::HandlerResponse::Handled;
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response&) {
      connections->Answered(req.remote_addr, req.remote_port);
    });
  }

  // POST bodies are read here, chunked or not, and stop at max_body_bytes (413).
  bool ReadBody(const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader, std::string* body) {
    bool too_large = false;
    const bool read = reader([&](const char* data, size_t n) {
      if (body->size() + n > options.max_body_bytes) {
        too_large = true;
        return false;
      }
      body->append(data, n);
      return true;
    });
    connections->BodyDone(req.remote_addr, req.remote_port);
    if (read) return true;
    if (!too_large && res.status != 413) {  // cut short by the client, or malformed chunks
      res.status = 400;
      res.set_content(ErrorBody("INVALID_ARGUMENT", "the request body could not be read whole"),
                      "application/json");
      return false;
    }
    // Over the limit: cpp-httplib has dropped a declared body; a chunked one stops being read.
    if (too_large) connections->StopReading(req.remote_addr, req.remote_port);
    res.status = 413;
    res.set_content(ErrorBody("RESOURCE_EXHAUSTED",
                              StrCat("the request body is larger than the server's "
                                     "max_body_bytes (", options.max_body_bytes, ")")),
                    "application/json");
    return false;
  }

  // A request to POST /v1/subgraphs/NAME:run answered before HandleRun, in requests_total.
  void CountRefusedRun(const std::string& path, int status) {
    static const std::string prefix = "/v1/subgraphs/";
    if (path.rfind(prefix, 0) != 0 || path.size() < prefix.size() + 5 ||
        path.compare(path.size() - 4, 4, ":run") != 0) {
      return;
    }
    const std::string name = path.substr(prefix.size(), path.size() - prefix.size() - 4);
    metrics.CountRefused(specs.count(name) ? name : std::string("(unknown)"), status);
  }

  // The endpoints; `self` for reloads.
  void InstallEndpoints(InferenceServer* self) {
    http.Post(R"(/v1/subgraphs/([^/]+):run)",
              [this](const httplib::Request& req, httplib::Response& res,
                              const httplib::ContentReader& reader) {
                std::string body;
                if (ReadBody(req, res, reader, &body)) HandleRun(req, body, res);
              });
    http.Post(R"(/v1/subgraphs/([^/]+):stream)",
              [this](const httplib::Request& req, httplib::Response& res,
                     const httplib::ContentReader& reader) {
                std::string body;
                if (ReadBody(req, res, reader, &body)) HandleRun(req, body, res, /*stream=*/true);
              });
    http.Get("/v1/subgraphs",
             [this](const httplib::Request&, httplib::Response& res) { HandleSubgraphs(res); });
    http.Post("/v1/admin/reload", [this, self](const httplib::Request& req,
                                                    httplib::Response& res,
                                                    const httplib::ContentReader& reader) {
      std::string body;
      if (ReadBody(req, res, reader, &body)) HandleReload(body, res, self);
    });
    http.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
      const bool ok = !stopping;
      res.status = ok ? 200 : 503;
      res.set_content(nlohmann::json({{"status", ok ? "ok" : "stopping"},
                                      {"global_step", predictor->global_step()}})
                          .dump(),
                      "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(Metrics(), "text/plain; version=0.0.4");
    });
    // Answers cpp-httplib makes itself (unknown paths 404, oversized bodies 413) get a JSON body.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      // Every answer of 400 or more passes here once: a :run refused for its size (413, by the
      // pre-routing handler, cpp-httplib or ReadBody) never reached HandleRun; count it.
      if (res.status == 413) CountRefusedRun(req.path, res.status);
      if (!res.body.empty()) return;
      std::string code = "INVALID_ARGUMENT", message = StrCat("HTTP ", res.status);
      if (res.status == 404) {
        code = "NOT_FOUND";
        message = StrCat("no endpoint ", req.method, " ", req.path,
                         " (endpoints: GET /v1/subgraphs, POST /v1/subgraphs/NAME:run, POST /v1/subgraphs/NAME:stream, "
                         "POST /v1/admin/reload, GET /healthz, GET /metrics)");
      } else if (res.status == 413) {
        code = "RESOURCE_EXHAUSTED";
        message = "the request body is larger than the server's max_body_bytes";
      }
      res.set_content(ErrorBody(code, message), "application/json");
    });
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
  m.InstallGuards();
  m.InstallEndpoints(this);
  const int port = m.options.port == 0 ? http.bind_to_any_port(m.options.host)
                                       : (http.bind_to_port(m.options.host, m.options.port)
                                              ? m.options.port
                                              : -1);
  if (port < 0) {
    throw AbortedError(StrCat("serve: cannot listen on ", m.options.host, ":", m.options.port,
                              " (in use, or not an address of this machine)"));
  }
  m.port = port;
  if (!WidenListenBacklog(port)) {
    LOG(WARNING) << "serve: the listening socket on port " << port
                 << " was not found; its backlog stays cpp-httplib's 5";
  }
  if (m.options.enable_batching) {
    BatchQueue::Options bo;
    bo.max_batch_size = m.options.max_batch_size;
    bo.batch_timeout_micros = m.options.batch_timeout_micros;
    bo.max_enqueued_requests = m.options.max_enqueued_requests;
    bo.num_batch_threads = m.options.num_batch_threads;
    m.batches = std::make_unique<BatchQueue>(m.predictor, bo,
                                             [&m](int64_t n) { m.metrics.ObserveBatch(n); });
    std::vector<std::string> names;
    for (const auto& [name, spec] : m.specs) {
      if (m.options.continuous_batching && m.predictor->StartGeneration(name) != nullptr) {
        auto g = std::make_unique<ContinuousBatcher>(
            m.predictor, name,
            ContinuousBatcher::Options{.max_batch_rows = m.options.max_batch_size,
                                       .max_enqueued_requests = m.options.max_enqueued_requests,
                                       .num_threads = m.options.num_batch_threads});
        g->Start();
        m.generators[name] = std::move(g);
      } else {
        names.push_back(name);
      }
    }
    m.batches->Start(names);
  }
  m.listen_thread = StartThread(ThreadState::Fresh(), [&m] { m.http.listen_after_bind(); });
  if (!m.options.watch_logdir.empty()) {
    m.watch_thread = StartThread(ThreadState::Fresh(), [this] { impl_->WatchLoop(this); });
  }
  return port;
}

void InferenceServer::Stop() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> stop_lock(m.stop_mu);
  if (!m.started || m.stopped) return;
  m.stopping = true;  // new requests are answered 503
  {
    // The streams in flight end first (their batches keep running), for request_timeout_secs
    // at most: cpp-httplib's stop would cut them.
    std::unique_lock<std::mutex> lock(m.streams_mu);
    const auto done = [&] { return m.streams == 0; };
    if (m.options.request_timeout_secs > 0) {
      m.streams_cv.wait_for(lock, std::chrono::duration<double>(m.options.request_timeout_secs), done);
    } else {
      m.streams_cv.wait(lock, done);
    }
  }
  m.http.stop();  // no new connections; the handlers in flight run to their end
  if (m.batches) m.batches->Drain();
  for (auto& [name, g] : m.generators) g->Drain();
  if (m.listen_thread.joinable()) m.listen_thread.join();  // joins the HTTP worker threads
  if (m.batches) m.batches->Stop();
  for (auto& [name, g] : m.generators) g->Stop();
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
    m.metrics.CountReload(false);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(m.watch_mu);
    m.last_watched = path;
  }
  const int64_t step = m.predictor->global_step();
  m.metrics.CountReload(true);
  LOG(INFO) << "serving the weights of '" << path << "' (global step " << step << ")";
  return step;
}

std::string InferenceServer::MetricsText() const { return impl_->Metrics(); }

std::vector<std::string> InferenceServer::ContinuousSubgraphs() const {
  std::vector<std::string> names;
  for (const auto& [name, g] : impl_->generators) names.push_back(name);
  return names;
}
int64_t InferenceServer::in_flight() const { return impl_->in_flight.load(); }
int64_t InferenceServer::queued() const { return impl_->Queued(); }

void InferenceServer::PauseBatching() {
  if (impl_->batches) impl_->batches->Pause();
  for (auto& [name, g] : impl_->generators) g->Pause();
}

void InferenceServer::ResumeBatching() {
  if (impl_->batches) impl_->batches->Resume();
  for (auto& [name, g] : impl_->generators) g->Resume();
}

}  // namespace glossa
