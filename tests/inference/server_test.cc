// `glossa serve`'s server on an ephemeral 127.0.0.1 port, driven by cpp-httplib's client:
// answers equal the Predictor's, bad requests get their status and message, queued requests are
// merged into one batch, a full queue answers 503, Stop() finishes requests in flight and reloads
// swap weights without failing requests.
#include "glossa/inference/server.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "glossa/inference/json_io.h"
#include "glossa/inference/predictor.h"
#include "glossa/kernels/cpu_features.h"
#include "tests/inference/test_bundle.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

using nlohmann::json;

// Waits for `ready` (an event, not a duration); fails the test after a minute.
template <typename F>
void WaitFor(F ready, const char* what) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!ready()) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "timed out waiting for " << what;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

struct Answer {
  int status = 0;
  json body;
};

// The status and body (parsed when JSON) of an answer; status -1 and the client error when none.
Answer ToAnswer(const httplib::Result& res) {
  if (!res) return {-1, json(httplib::to_string(res.error()))};
  Answer a{res->status, json()};
  try {
    a.body = json::parse(res->body);
  } catch (...) {
    a.body = res->body;
  }
  return a;
}

Answer Post(int port, const std::string& path, const std::string& body) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(120);
  cli.set_tcp_nodelay(true);
  return ToAnswer(cli.Post(path.c_str(), body, "application/json"));
}

Answer Get(int port, const std::string& path) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_tcp_nodelay(true);
  return ToAnswer(cli.Get(path.c_str()));
}

json ScoreRequest(const std::vector<std::string>& texts) {
  return {{"feeds", {{"text", texts}}}};
}

json GenerateRequest(const std::string& prompt, int64_t seed, int64_t max_new = 4) {
  return {{"feeds", {{"prompt", {prompt}}, {"max_new_tokens", max_new}, {"seed", seed},
                     {"temperature", 1.0}}}};
}

std::vector<double> Numbers(const json& j) {
  if (!j.is_array()) return {j.get<double>()};
  std::vector<double> out;
  for (const auto& e : j) {
    const auto n = Numbers(e);
    out.insert(out.end(), n.begin(), n.end());
  }
  return out;
}

// A Prometheus sample's value ("name{labels}" exactly), or -1.
double Metric(const std::string& text, const std::string& sample) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
  }
  return -1;
}

TEST(Serve, AnswersAsThePredictorDoes) {
  Predictor predictor(ExportedBundle(), {.batch_invariant = true});
  InferenceServer server(&predictor, {});
  const int port = server.Start();
  ASSERT_GT(port, 0);
  const Answer specs = Get(port, "/v1/subgraphs");
  ASSERT_EQ(specs.status, 200);
  EXPECT_EQ(specs.body["global_step"], 3);
  EXPECT_EQ(specs.body["subgraphs"]["default"]["feeds"]["text"]["dtype"], "string");
  EXPECT_EQ(specs.body["subgraphs"]["generate"]["feeds"]["seed"]["optional"], true);

  const Answer a = Post(port, "/v1/subgraphs/default:run", ScoreRequest(kTexts).dump());
  ASSERT_EQ(a.status, 200) << a.body;
  // The server runs the Predictor's plan (batch-invariant here, as glossa serve makes it): the
  // Predictor called directly gives the same bits.
  const InferenceMap want = predictor.Run("default", {{"text", InferenceValue::Strings(kTexts)}});
  EXPECT_EQ(a.body["fetches"], json::parse(FetchesToJson(want).dump()));
  for (size_t i = 0; i < kTexts.size(); ++i) {  // the float32 values themselves
    EXPECT_EQ(a.body["fetches"]["total_log_prob"][i].get<double>(),
              want.at("total_log_prob").tensor[static_cast<int64_t>(i)].item<float>());
    // Per-token rows are cut to their lengths.
    EXPECT_EQ(a.body["fetches"]["log_probs"][i].size(),
              want.at("lengths").tensor[static_cast<int64_t>(i)].item<int64_t>());
  }
  EXPECT_EQ(a.body["global_step"], 3);
  // Generation with a seed gives the Predictor's text; fetch_keys select.
  json g = GenerateRequest("Elizabeth", 11);
  g["fetch_keys"] = {"text"};
  const Answer ga = Post(port, "/v1/subgraphs/generate:run", g.dump());
  ASSERT_EQ(ga.status, 200) << ga.body;
  EXPECT_EQ(ga.body["fetches"].size(), 1u);
  const InferenceMap gw = predictor.Run(
      "generate", {{"prompt", InferenceValue::Strings({"Elizabeth"})},
                   {"max_new_tokens", InferenceValue::Of(at::scalar_tensor(4, at::kLong))},
                   {"seed", InferenceValue::Of(at::scalar_tensor(11, at::kLong))},
                   {"temperature", InferenceValue::Of(at::scalar_tensor(1.0, at::kFloat))}});
  EXPECT_EQ(ga.body["fetches"]["text"][0], gw.at("text").strings[0]);

  const Answer health = Get(port, "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body["status"], "ok");
  const std::string metrics = server.MetricsText();
  EXPECT_EQ(Metric(metrics, R"(glossa_serve_requests_total{subgraph="default",code="200"})"), 1);
  EXPECT_EQ(Metric(metrics, R"(glossa_serve_requests_total{subgraph="generate",code="200"})"), 1);
  EXPECT_EQ(Metric(metrics, R"(glossa_serve_request_duration_seconds_count{subgraph="default"})"),
            1);
  EXPECT_EQ(Metric(metrics, "glossa_serve_model_global_step"), 3);
  // The same text over HTTP, but for the open connections (the one asking is open).
  auto without_connections = [](std::string text) {
    const size_t at = text.find("\nglossa_serve_connections ");
    return at == std::string::npos ? text : text.erase(at, text.find('\n', at + 1) - at);
  };
  EXPECT_EQ(without_connections(Get(port, "/metrics").body.get<std::string>()),
            without_connections(server.MetricsText()));
  server.Stop();
}

TEST(Serve, BadRequestsGetTheirStatusAndMessage) {
  Predictor predictor(ExportedBundle());
  ServeOptions o;
  o.max_body_bytes = 1 << 20;
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  auto expect = [&](const std::string& path, const std::string& body, int status,
                    const std::string& code, const std::string& message) {
    const Answer a = Post(port, path, body);
    EXPECT_EQ(a.status, status) << body.substr(0, 80) << " -> " << a.body;
    ASSERT_TRUE(a.body.is_object()) << a.body;
    EXPECT_EQ(a.body["error"]["code"], code) << body.substr(0, 80);
    EXPECT_NE(a.body["error"]["message"].get<std::string>().find(message), std::string::npos)
        << a.body["error"]["message"] << " lacks " << message;
  };
  const std::string run = "/v1/subgraphs/default:run";
  expect(run, "{\"feeds\": {\"text\": [\"a\"]", 400, "INVALID_ARGUMENT", "not valid JSON");
  expect(run, "[1, 2]", 400, "INVALID_ARGUMENT", "must be a JSON object, got array");
  expect(run, "{}", 400, "INVALID_ARGUMENT", "the request has no \"feeds\"");
  expect(run, R"({"feeds": {}, "inputs": 1})", 400, "INVALID_ARGUMENT",
         "unknown request field 'inputs'");
  expect(run, R"({"feeds": {"txt": ["a"]}})", 400, "INVALID_ARGUMENT",
         "unknown feed 'txt' (feeds: text)");
  expect(run, R"({"feeds": {"text": "a"}})", 400, "INVALID_ARGUMENT",
         "feed 'text' must be an array of strings, got string");
  expect(run, R"({"feeds": {"text": ["a", 3]}})", 400, "INVALID_ARGUMENT",
         "feed 'text'[1] must be a string, got number");
  expect(run, R"({"feeds": {"text": []}})", 400, "INVALID_ARGUMENT", "is an empty batch");
  expect(run, R"({"feeds": {}})", 400, "INVALID_ARGUMENT", "missing feed 'text'");
  expect(run, R"({"feeds": {"text": ["a"]}, "fetch_keys": ["logits"]})", 400,
         "INVALID_ARGUMENT", "unknown fetch 'logits'");
  expect("/v1/subgraphs/generate:run", R"({"feeds": {"prompt": ["a"], "max_new_tokens": 2.5}})",
         400, "INVALID_ARGUMENT", "feed 'max_new_tokens' must hold integers, got 2.5");
  expect("/v1/subgraphs/generate:run", R"({"feeds": {"prompt": ["a"], "seed": [1, 2]}})", 400,
         "INVALID_ARGUMENT", "feed 'seed' must have rank 0, got rank 1");
  expect("/v1/subgraphs/translate:run", R"({"feeds": {}})", 404, "NOT_FOUND",
         "no subgraph 'translate' (subgraphs: default, generate)");
  expect("/v1/models", "{}", 404, "NOT_FOUND", "no endpoint POST /v1/models");
  // A 10 MB body over the 1 MiB limit: 413, and the connection is not left broken.
  expect(run, std::string(10 << 20, 'x'), 413, "RESOURCE_EXHAUSTED", "larger than");
  expect("/v1/admin/reload", R"({"checkpoint": "/no/such/ckpt-1"})", 404, "NOT_FOUND",
         "/no/such/ckpt-1");
  expect("/v1/admin/reload", R"({})", 400, "INVALID_ARGUMENT", "watches no logdir");
  // Still serving, on the same weights.
  const Answer ok = Post(port, run, ScoreRequest({"a"}).dump());
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body["global_step"], 3);
  EXPECT_EQ(Metric(server.MetricsText(), R"(glossa_serve_reloads_total{result="error"})"), 1);
}

TEST(Serve, ConcurrentClientsGetTheSequentialResults) {
  Predictor predictor(ExportedBundle());
  ServeOptions o;
  o.max_batch_size = 8;
  o.batch_timeout_micros = 5000;
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  // 200 mixed requests: scoring one or two texts, and seeded generation.
  constexpr int kRequests = 200, kClients = 8;
  auto request = [](int i) -> std::pair<std::string, json> {
    if (i % 3 == 2) return {"generate", GenerateRequest(kTexts[i % 3], i)};
    std::vector<std::string> texts = {kTexts[i % 3]};
    if (i % 2) texts.push_back(kTexts[(i + 1) % 3]);
    return {"default", ScoreRequest(texts)};
  };
  std::vector<json> sequential(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    const auto [subgraph, req] = request(i);
    InferenceMap feeds =
        FeedsFromJson(req["feeds"], predictor.ListSubgraphs().at(subgraph), "test");
    sequential[i] = json::parse(FetchesToJson(predictor.Run(subgraph, feeds)).dump());
  }
  std::vector<Answer> answers(kRequests);
  std::atomic<int> next{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      for (int i = next++; i < kRequests; i = next++) {
        const auto [subgraph, req] = request(i);
        answers[i] = Post(port, "/v1/subgraphs/" + subgraph + ":run", req.dump());
      }
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(answers[i].status, 200) << i << ": " << answers[i].body;
    const json& got = answers[i].body["fetches"];
    const json& want = sequential[i];
    ASSERT_EQ(got.size(), want.size()) << i;
    for (auto it = want.begin(); it != want.end(); ++it) {
      // A merged batch pads differently: scores agree to float rounding, the rest exactly.
      if (it.key() == "total_log_prob" || it.key() == "log_probs") {
        const auto g = at::tensor(Numbers(got[it.key()]), at::kDouble);
        const auto w = at::tensor(Numbers(it.value()), at::kDouble);
        ASSERT_EQ(g.numel(), w.numel()) << i << " " << it.key();
        EXPECT_TRUE(at::allclose(g, w, 1e-5, 1e-4)) << i << " " << it.key();
      } else {
        EXPECT_EQ(got[it.key()], it.value()) << i << " " << it.key();
      }
    }
  }
  const std::string metrics = server.MetricsText();
  EXPECT_EQ(Metric(metrics, R"(glossa_serve_requests_total{subgraph="default",code="200"})") +
                Metric(metrics, R"(glossa_serve_requests_total{subgraph="generate",code="200"})"),
            kRequests);
  EXPECT_LE(Metric(metrics, "glossa_serve_batch_size_count"), kRequests);
}

// Issue 47 item 1: a request's time is bounded. One that gets no answer within
// request_timeout_secs (here: held in a paused queue) is answered 503 and its thread freed; once
// the queue runs again it is dropped unrun, and the server goes on answering.
TEST(Serve, ARequestPastItsTimeoutIs503AndIsDroppedUnrun) {
  Predictor predictor(ExportedBundle());
  ServeOptions o;
  o.request_timeout_secs = 0.2;
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  const std::string run = "/v1/subgraphs/default:run";
  server.PauseBatching();
  const Answer late = Post(port, run, ScoreRequest({kTexts[0]}).dump());
  EXPECT_EQ(late.status, 503) << late.body;
  EXPECT_EQ(late.body["error"]["code"], "UNAVAILABLE");
  EXPECT_NE(late.body["error"]["message"].get<std::string>().find(
                "no answer within request_timeout_secs = 0.2 s"),
            std::string::npos)
      << late.body;
  EXPECT_EQ(server.queued(), 1);
  server.ResumeBatching();
  WaitFor([&] { return server.queued() == 0; }, "the late request taken from the queue");
  const Answer ok = Post(port, run, ScoreRequest({kTexts[1]}).dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
  const std::string metrics = server.MetricsText();
  // One batch ran: the second request's; the late one was dropped unrun.
  EXPECT_EQ(Metric(metrics, "glossa_serve_batch_size_count"), 1);
  EXPECT_EQ(Metric(metrics, R"(glossa_serve_requests_total{subgraph="default",code="503"})"), 1);
}

TEST(Serve, QueuedRequestsMergeIntoOneBatchPerOptions) {
  Predictor predictor(ExportedBundle());
  ServeOptions o;
  o.max_batch_size = 16;
  o.continuous_batching = false;  // generations batch as scoring does (else they join a running
                                  // decoding batch: continuous_batching_test.cc)
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  server.PauseBatching();
  // Four scoring requests (5 texts) and two generations with different max_new_tokens.
  std::vector<std::pair<std::string, json>> reqs = {
      {"default", ScoreRequest({kTexts[0]})},
      {"default", ScoreRequest({kTexts[1], kTexts[2]})},
      {"generate", GenerateRequest("Elizabeth", 1, 3)},
      {"default", ScoreRequest({kTexts[2]})},
      {"generate", GenerateRequest("Elizabeth", 1, 5)},
      {"default", ScoreRequest({kTexts[0]})}};
  std::vector<Answer> answers(reqs.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < reqs.size(); ++i) {
    clients.emplace_back([&, i] {
      answers[i] = Post(port, "/v1/subgraphs/" + reqs[i].first + ":run", reqs[i].second.dump());
    });
  }
  WaitFor([&] { return server.queued() == static_cast<int64_t>(reqs.size()); }, "6 queued");
  EXPECT_EQ(Metric(server.MetricsText(), "glossa_serve_queue_depth"), 6);
  server.ResumeBatching();
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(answers[i].status, 200) << answers[i].body;
    const InferenceMap feeds =
        FeedsFromJson(reqs[i].second["feeds"], predictor.ListSubgraphs().at(reqs[i].first), "t");
    const json want =
        json::parse(FetchesToJson(predictor.Run(reqs[i].first, feeds)).dump());
    if (reqs[i].first == "generate") {
      EXPECT_EQ(answers[i].body["fetches"], want);
    } else {
      EXPECT_EQ(answers[i].body["fetches"]["ids"], want["ids"]);
      EXPECT_NEAR(answers[i].body["fetches"]["total_log_prob"][0].get<double>(),
                  want["total_log_prob"][0].get<double>(), 1e-4);
    }
  }
  // One batch of the 4 texts of 32-63 bytes, one of the shorter text (another length bucket), and
  // one per generation (their option feeds differ).
  const std::string metrics = server.MetricsText();
  EXPECT_EQ(Metric(metrics, "glossa_serve_batch_size_count"), 4);
  EXPECT_EQ(Metric(metrics, "glossa_serve_batch_size_sum"), 7);
  EXPECT_EQ(Metric(metrics, R"(glossa_serve_batch_size_bucket{le="1"})"), 3);
  EXPECT_EQ(Metric(metrics, R"(glossa_serve_batch_size_bucket{le="4"})"), 4);
}

// A scoring answer against another of the same request: the same tokens and step, each token's
// log-probability and the total within float32 rounding.
void ExpectSameTokensAndNearScores(const json& got, const json& want, int n) {
  for (const char* k : {"ids", "lengths", "pieces"}) {
    EXPECT_EQ(got["fetches"][k], want["fetches"][k]) << k << " in a batch of " << n;
  }
  EXPECT_EQ(got["global_step"], want["global_step"]);
  const json& lp = got["fetches"]["log_probs"][0];
  const json& want_lp = want["fetches"]["log_probs"][0];
  ASSERT_EQ(lp.size(), want_lp.size());
  for (size_t t = 0; t < lp.size(); ++t) {
    EXPECT_NEAR(lp[t].get<double>(), want_lp[t].get<double>(), 1e-5)
        << "token " << t << " in a batch of " << n;
  }
  EXPECT_NEAR(got["fetches"]["total_log_prob"][0].get<double>(),
              want["fetches"]["total_log_prob"][0].get<double>(), 1e-4);
}

// Batch-invariant answers (glossa serve's default plan): one request alone, and merged into batches of 2 to 16
// with texts of other token lengths in its length bucket, gets the same bytes.
TEST(Serve, ARequestGetsTheSameBytesAloneOrMergedIntoAnyBatch) {
  Predictor predictor(ExportedBundle(), {.batch_invariant = true});
  ServeOptions o;
  o.max_batch_size = 16;
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  const std::string mine = ScoreRequest({kTexts[1]}).dump();  // 49 bytes
  const Answer alone = Post(port, "/v1/subgraphs/default:run", mine);
  ASSERT_EQ(alone.status, 200) << alone.body;
  const std::vector<std::string> others = {kTexts[0], "Mr. Darcy said nothing at all to her",
                                           "Elizabeth and Jane walked to the town",
                                           "It was a truth universally acknowledged by all"};
  int64_t batches = 0;
  for (int n : {2, 3, 8, 16}) {
    server.PauseBatching();
    std::vector<Answer> answers(n);
    std::vector<std::thread> clients;
    for (int i = 0; i < n; ++i) {
      clients.emplace_back([&, i] {
        const std::string req =
            i == n / 2 ? mine : ScoreRequest({others[i % others.size()]}).dump();
        answers[i] = Post(port, "/v1/subgraphs/default:run", req);
      });
    }
    WaitFor([&] { return server.queued() == n; }, "the batch queued");
    server.ResumeBatching();
    for (auto& t : clients) t.join();
    for (const auto& a : answers) ASSERT_EQ(a.status, 200) << a.body;
    if (KernelsForcedToReference()) {
      // GLOSSA_KERNELS=reference turns the batch-invariant kernels off: ATen's GEMMs pick their
      // kernels by the whole matrix's shape, and which row the request lands on depends on which
      // client the queue heard first. The same tokens, the scores within float rounding.
      ExpectSameTokensAndNearScores(answers[n / 2].body, alone.body, n);
    } else {
      EXPECT_EQ(answers[n / 2].body.dump(), alone.body.dump()) << "in a batch of " << n;
    }
    EXPECT_EQ(Metric(server.MetricsText(), "glossa_serve_batch_size_count"), 1 + ++batches)
        << "the " << n << " requests ran as one batch";
  }
}

TEST(Serve, AFullQueueAnswers503) {
  Predictor predictor(ExportedBundle());
  ServeOptions o;
  o.max_enqueued_requests = 1;
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  server.PauseBatching();
  Answer first;
  std::thread client([&] { first = Post(port, "/v1/subgraphs/default:run",
                                        ScoreRequest({"a"}).dump()); });
  WaitFor([&] { return server.queued() == 1; }, "a queued request");
  const Answer second = Post(port, "/v1/subgraphs/default:run", ScoreRequest({"b"}).dump());
  EXPECT_EQ(second.status, 503);
  EXPECT_EQ(second.body["error"]["code"], "UNAVAILABLE");
  EXPECT_NE(second.body["error"]["message"].get<std::string>().find("the queue is full"),
            std::string::npos);
  server.ResumeBatching();
  client.join();
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(Metric(server.MetricsText(),
                   R"(glossa_serve_requests_total{subgraph="default",code="503"})"),
            1);
}

TEST(Serve, StopFinishesTheRequestsInFlight) {
  Predictor predictor(ExportedBundle());
  // Batches wait up to a minute for more requests: Stop() must not wait for that.
  ServeOptions o;
  o.batch_timeout_micros = 60'000'000;
  auto server = std::make_unique<InferenceServer>(&predictor, o);
  const int port = server->Start();
  server->PauseBatching();
  std::vector<Answer> answers(3);
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&, i] {
      answers[i] = Post(port, "/v1/subgraphs/generate:run", GenerateRequest(kTexts[i], 1).dump());
    });
  }
  WaitFor([&] { return server->in_flight() == 3 && server->queued() == 3; }, "3 in flight");
  server->Stop();  // stops accepting, then lets the three finish
  for (auto& t : clients) t.join();
  for (const auto& a : answers) {
    EXPECT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(a.body["fetches"]["text"].size(), 1u);
  }
  EXPECT_EQ(Post(port, "/v1/subgraphs/default:run", ScoreRequest({"a"}).dump()).status, -1);
  server.reset();
}

// The logdir of the small LM trained on to step 6 (a second checkpoint to reload).
const std::string& LaterLogdir() {
  static const std::string logdir = [] {
    const std::string d = Dir("later");
    fs::copy(TrainedLogdir(), d, fs::copy_options::recursive);
    Executor(GetModelParams("lm.austen.TransformerLmTiny", "Train",
                            std::string(kSmall) + "task.train.max_steps : 6\n"),
             {.logdir = d, .log = [](const std::string&) {}})
        .Run();
    return d;
  }();
  return logdir;
}

TEST(Serve, ReloadsSwapWeightsWithoutFailingRequests) {
  const std::string ckpt3 = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  const std::string ckpt6 = *Saver::LatestCheckpoint(LaterLogdir() + "/train");
  ASSERT_NE(ckpt3, ckpt6);
  Predictor predictor(ExportedBundle());
  InferenceServer server(&predictor, {});
  const int port = server.Start();
  std::atomic<bool> done{false};
  std::atomic<int> served{0};
  std::vector<Answer> failures;
  std::mutex mu;
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      while (!done) {
        const Answer a = Post(port, "/v1/subgraphs/default:run", ScoreRequest({kTexts[c % 3]}).dump());
        const int64_t step = a.status == 200 ? a.body["global_step"].get<int64_t>() : -1;
        if (step != 3 && step != 6) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back(a);
        }
        ++served;
      }
    });
  }
  for (int r = 0; r < 4; ++r) {
    const int before = served;
    const std::string ckpt = r % 2 == 0 ? ckpt6 : ckpt3;
    const Answer a = Post(port, "/v1/admin/reload", json({{"checkpoint", ckpt}}).dump());
    EXPECT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(a.body["global_step"], r % 2 == 0 ? 6 : 3);
    WaitFor([&] { return served >= before + 8; }, "requests after a reload");
  }
  done = true;
  for (auto& t : clients) t.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, e.g. " << failures[0].body;
  EXPECT_EQ(Metric(server.MetricsText(), R"(glossa_serve_reloads_total{result="ok"})"), 4);
  server.Stop();

  // A watched logdir: the server picks up its latest checkpoint by itself, and answers with it.
  Predictor watched(ExportedBundle());
  ServeOptions o;
  o.watch_logdir = LaterLogdir();
  o.watch_interval_secs = 0.05;
  InferenceServer watching(&watched, o);
  const int wport = watching.Start();
  WaitFor([&] { return watched.global_step() == 6; }, "the watched checkpoint");
  const Answer a = Post(wport, "/v1/subgraphs/default:run", ScoreRequest({kTexts[0]}).dump());
  EXPECT_EQ(a.body["global_step"], 6);
  PredictorOptions at6;
  at6.checkpoint = ckpt6;
  const InferenceMap want =
      Predictor(ExportedBundle(), at6).Run("default", {{"text", InferenceValue::Strings({kTexts[0]})}});
  EXPECT_EQ(a.body["fetches"]["total_log_prob"][0].get<double>(),
            want.at("total_log_prob").tensor[0].item<float>());
  const Answer again = Post(wport, "/v1/admin/reload", "");
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.body["global_step"], 6);
}

// A raw TCP connection to the server (for what cpp-httplib's client cannot do: drip a header,
// stream an endless chunked body, hold a connection idle).
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// What the server sends until it closes the connection (or a minute passes).
std::string ReadUntilClosed(int fd) {
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

TEST(Serve, AChunkedBodyIsRefusedWhenItPassesTheLimitNotReadToItsEnd) {
  Predictor predictor(ExportedBundle());
  ServeOptions o;
  o.max_body_bytes = 1 << 20;
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  const int fd = Connect(port);
  ASSERT_TRUE(SendAll(fd, "POST /v1/subgraphs/default:run HTTP/1.1\r\nHost: x\r\n"
                          "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"));
  // Up to 256 MiB in 64 KiB chunks; the server must stop reading long before.
  std::atomic<int64_t> sent{0};
  std::thread sender([&] {
    const std::string chunk = "10000\r\n" + std::string(1 << 16, ' ') + "\r\n";
    while (sent < (int64_t{256} << 20) && SendAll(fd, chunk)) sent += 1 << 16;
  });
  const std::string answer = ReadUntilClosed(fd);
  ::shutdown(fd, SHUT_RDWR);
  sender.join();
  ::close(fd);
  EXPECT_LT(sent.load(), int64_t{256} << 20) << "the whole body was read";
  // The answer, when the client reads it before the reset: 413.
  if (!answer.empty()) {
    EXPECT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u) << answer.substr(0, 200);
  }
  // A declared Content-Length over the limit is refused before any of it is read.
  const int fd2 = Connect(port);
  ASSERT_TRUE(SendAll(fd2, "POST /v1/subgraphs/default:run HTTP/1.1\r\nHost: x\r\n"
                           "Content-Length: 1500000000\r\n\r\n{"));
  EXPECT_EQ(ReadUntilClosed(fd2).rfind("HTTP/1.1 413", 0), 0u);
  ::close(fd2);
  // And a POST to no endpoint is not read either.
  const int fd3 = Connect(port);
  ASSERT_TRUE(SendAll(fd3, "POST /nowhere HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  EXPECT_EQ(ReadUntilClosed(fd3).rfind("HTTP/1.1 404", 0), 0u);
  ::close(fd3);
  EXPECT_EQ(Post(port, "/v1/subgraphs/default:run", ScoreRequest({"a"}).dump()).status, 200);
}

TEST(Serve, SlowHeadersDoNotStarveCompleteRequestsAndAreCutOff) {
  Predictor predictor(ExportedBundle());
  ServeOptions o;
  o.connection_limits.header_timeout_secs = 1;
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  // 64 clients each dripping a header line every 100 ms, never finishing the header: more than
  // any fixed pool of threads would hold.
  constexpr int kSlow = 64;
  std::vector<int> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(Connect(port));
    ASSERT_TRUE(SendAll(slow.back(), "POST /v1/subgraphs/default:run HTTP/1.1\r\n"));
  }
  std::atomic<bool> stop{false};
  std::atomic<int> cut{0};
  std::thread drip([&] {
    std::vector<bool> open(kSlow, true);
    while (!stop) {
      for (int i = 0; i < kSlow; ++i) {
        if (open[i] && !SendAll(slow[i], "X-Drip: 1\r\n")) {
          open[i] = false;
          ++cut;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  // Complete requests are answered meanwhile.
  for (int i = 0; i < 5; ++i) {
    const Answer a = Post(port, "/v1/subgraphs/default:run", ScoreRequest({kTexts[i % 3]}).dump());
    EXPECT_EQ(a.status, 200) << a.body;
  }
  // However slowly it drips, a header gets header_timeout_secs in total: every slow client is cut.
  WaitFor([&] { return cut.load() == kSlow; }, "the slow clients to be cut off");
  stop = true;
  drip.join();
  for (int fd : slow) ::close(fd);
  EXPECT_GE(Metric(server.MetricsText(), "glossa_serve_connections_timed_out_total"), kSlow);
}

TEST(Serve, ASilentConnectionIsClosedAtTheHeaderTimeoutAndCountedAsTimedOut) {
  // A connection that never sends a byte: closed when its header is late (3 s, longer than
  // cpp-httplib's own keep-alive wait once was) and counted like a slow one.
  Predictor predictor(ExportedBundle());
  ServeOptions o;
  o.connection_limits.header_timeout_secs = 3;
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  const int a = Connect(port), b = Connect(port);
  EXPECT_EQ(ReadUntilClosed(a), "");  // waits for the server to close it
  EXPECT_EQ(ReadUntilClosed(b), "");
  ::close(a);
  ::close(b);
  EXPECT_EQ(Metric(server.MetricsText(), "glossa_serve_connections_timed_out_total"), 2);
  EXPECT_EQ(Post(port, "/v1/subgraphs/default:run", ScoreRequest({"a"}).dump()).status, 200);
}

TEST(Serve, ConnectionsArCappedPerClientAndInTotal) {
  Predictor predictor(ExportedBundle());
  ServeOptions o;
  o.connection_limits.max_connections_per_client = 4;
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(Connect(port));
  WaitFor([&] { return Metric(server.MetricsText(), "glossa_serve_connections") == 4; },
          "4 open connections");
  const int extra = Connect(port);
  const std::string answer = ReadUntilClosed(extra);
  ::close(extra);
  EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer;
  EXPECT_NE(answer.find("--max_connections_per_client"), std::string::npos) << answer;
  EXPECT_EQ(Metric(server.MetricsText(), "glossa_serve_connections_refused_total"), 1);
  for (int fd : held) ::close(fd);
  WaitFor([&] { return Metric(server.MetricsText(), "glossa_serve_connections") == 0; },
          "the connections to close");
  EXPECT_EQ(Post(port, "/v1/subgraphs/default:run", ScoreRequest({"a"}).dump()).status, 200);
}

TEST(Serve, ALongGenerationDoesNotHoldUpScoring) {
  Predictor predictor(ExportedBundle());
  InferenceServer server(&predictor, {});
  const int port = server.Start();
  std::atomic<bool> generated{false};
  json g = GenerateRequest("Elizabeth", 1, 512);
  g["feeds"]["prompt"] = std::vector<std::string>(32, "Elizabeth");
  std::thread gen([&] {
    EXPECT_EQ(Post(port, "/v1/subgraphs/generate:run", g.dump()).status, 200);
    generated = true;
  });
  WaitFor([&] { return server.queued() == 0 && Metric(server.MetricsText(),
                                                       "glossa_serve_in_flight_requests") == 1; },
          "the generation to run");
  const Answer a = Post(port, "/v1/subgraphs/default:run", ScoreRequest({"a"}).dump());
  EXPECT_EQ(a.status, 200);
  EXPECT_FALSE(generated.load()) << "scoring waited for the generation";
  gen.join();
}

// Resident memory in bytes (/proc/self/statm).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

TEST(Serve, HotReloadsUnderLoadDoNotGrowMemory) {
  const std::string ckpt3 = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  const std::string ckpt6 = *Saver::LatestCheckpoint(LaterLogdir() + "/train");
  Predictor predictor(ExportedBundle());
  InferenceServer server(&predictor, {});
  const int port = server.Start();
  std::atomic<bool> done{false};
  std::vector<std::thread> clients;
  for (int c = 0; c < 6; ++c) {
    clients.emplace_back([&, c] {
      while (!done) {
        Post(port, c % 2 ? "/v1/subgraphs/default:run" : "/v1/subgraphs/generate:run",
             c % 2 ? ScoreRequest({kTexts[c % 3]}).dump() : GenerateRequest("Eliza", c, 8).dump());
      }
    });
  }
  auto reload = [&](int i) {
    const Answer a = Post(port, "/v1/admin/reload",
                          json({{"checkpoint", i % 2 == 0 ? ckpt6 : ckpt3}}).dump());
    ASSERT_EQ(a.status, 200) << a.body;
  };
  for (int i = 0; i < 40; ++i) reload(i);  // warm: allocator pools reach their working size
  const int64_t before = ResidentBytes();
  for (int i = 0; i < 200; ++i) reload(i);
  const int64_t after = ResidentBytes();
  done = true;
  for (auto& t : clients) t.join();
  // A model copy is about a megabyte here: a leak of one per reload would add ~200 MB.
  std::printf("resident memory %.1f MB -> %.1f MB over 200 reloads\n", before / 1e6, after / 1e6);
  EXPECT_LT(after - before, int64_t{40} << 20);
}

TEST(Serve, EveryOptionIsValidatedWithItsRange) {
  Predictor predictor(ExportedBundle());
  InferenceServer server(&predictor, {});
  const int port = server.Start();
  auto expect = [&](const json& feeds, int status, const std::string& message) {
    const json body = {{"feeds", feeds}};
    const Answer a = Post(port, "/v1/subgraphs/generate:run", body.dump());
    EXPECT_EQ(a.status, status) << feeds << " -> " << a.body;
    if (status != 200) {
      EXPECT_NE(a.body["error"]["message"].get<std::string>().find(message), std::string::npos)
          << a.body;
    }
  };
  const json prompt = {"Elizabeth"};
  expect({{"prompt", prompt}, {"max_new_tokens", -5}}, 400,
         "feed 'max_new_tokens' is -5; it must be in [0, 512]");
  expect({{"prompt", prompt}, {"max_new_tokens", 9223372036854775807LL}}, 400,
         "it must be in [0, 512] (max_new_tokens)");
  expect({{"prompt", prompt}, {"max_new_tokens", 1000000000000LL}}, 400, "[0, 512]");
  expect({{"prompt", prompt}, {"temperature", -1.0}}, 400,
         "feed 'temperature' is -1.0; it must be in [0.0, 100.0]");
  expect({{"prompt", prompt}, {"top_k", -3}}, 400, "feed 'top_k' is -3; it must be in [0, inf]");
  // A tiny temperature is nearly greedy, not NaN.
  expect({{"prompt", prompt}, {"temperature", 1e-45}, {"max_new_tokens", 3}}, 200, "");
  // Invalid UTF-8 in a body: 400 naming the problem, never 500.
  const Answer bad = Post(port, "/v1/subgraphs/default:run", "{\"feeds\": {\"text\": [\"\xff\xfe\"]}}");
  EXPECT_EQ(bad.status, 400) << bad.body;
}

}  // namespace
}  // namespace glossa
