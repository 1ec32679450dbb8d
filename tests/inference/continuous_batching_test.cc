// Continuous batching in the server (glossa/inference/continuous_batching.h) and its
// server-sent events (glossa/inference/event_stream.h): a short generation joins a long one's
// running batch at the next step and draws its first token in that step; every answer equals the
// Predictor's alone; streams end with the :run answer; what cannot stream is refused before any
// event.
#include "glossa/inference/continuous_batching.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/inference/batch_queue.h"
#include "glossa/inference/event_stream.h"
#include "glossa/inference/json_io.h"
#include "glossa/inference/predictor.h"
#include "glossa/inference/server.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/base/strings.h"
#include "tests/inference/test_bundle.h"

namespace glossa {
namespace {

using nlohmann::json;

struct Event {
  std::string name;
  json data;
};

// POSTs `body` to `path` and calls on_event for each server-sent event as it arrives; returns the
// HTTP status and, when the answer is not an event stream, its body.
std::pair<int, std::string> PostStream(int port, const std::string& path, const json& body,
                                       const std::function<void(const Event&)>& on_event) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(120);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buffer;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string block = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      Event e;
      const size_t data_at = block.find("\ndata: ");
      if (block.rfind("event: ", 0) != 0 || data_at == std::string::npos) {
        ADD_FAILURE() << "not an event: " << block;
        return false;
      }
      e.name = block.substr(7, data_at - 7);
      e.data = json::parse(block.substr(data_at + 7));
      on_event(e);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  cli.send(req, res, error);
  return {error == httplib::Error::Success ? res.status : -1, buffer};
}

json Generate(std::vector<std::string> prompts, int64_t max_new, int64_t seed) {
  return {{"feeds", {{"prompt", prompts}, {"max_new_tokens", max_new}, {"seed", seed},
                     {"temperature", 1.0}}}};
}

// Whether `got` is the Predictor's answer alone: bit for bit under the batch-invariant kernels;
// with GLOSSA_KERNELS=reference (ATen's kernels, not batch-invariant: a draw may differ in its
// last bits and so in its token) only the answer's shape.
void ExpectAlone(const json& got, const json& want, const std::string& what) {
  if (KernelsForcedToReference()) {
    EXPECT_EQ(got["text"].size(), want["text"].size()) << what;
    return;
  }
  EXPECT_EQ(got, want) << what;
}

// The Predictor's answer alone, as JSON.
json Alone(const Predictor& p, const json& request) {
  const InferenceMap feeds =
      FeedsFromJson(request["feeds"], p.ListSubgraphs().at("generate"), "test");
  return json::parse(FetchesToJson(p.Run("generate", feeds)).dump());
}

// A long generation (512 tokens for each of 4 prompts) runs; a short one sent while it runs joins
// its batch at once (at most one step queued) and draws its first token at the step it joined,
// while the long one goes on drawing. Both streams end with the Predictor's answer alone; the
// long one's token events are its answer's ids, one step after another.
TEST(ContinuousBatching, AShortGenerationJoinsALongOnesBatchAndDrawsAtOnce) {
  PredictorOptions po;
  po.batch_invariant = true;  // what glossa serve runs
  Predictor predictor(ExportedBundle(), po);
  ServeOptions o;
  o.num_batch_threads = 1;  // one replica: both requests in one batch
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  const json long_request = Generate(std::vector<std::string>(4, "Elizabeth"), 512, 7);
  const json short_request = Generate({"Mr. Darcy"}, 3, 2);
  std::mutex mu;
  std::vector<int64_t> long_steps;  // of each token of row 0
  std::vector<int64_t> long_ids;
  json long_done;
  std::atomic<int> long_tokens{0};
  std::thread long_client([&] {
    const auto [status, body] =
        PostStream(port, "/v1/subgraphs/generate:stream", long_request, [&](const Event& e) {
          std::lock_guard<std::mutex> lock(mu);
          if (e.name == "token" && e.data["row"] == 0) {
            long_steps.push_back(e.data["step"].get<int64_t>());
            long_ids.push_back(e.data["id"].get<int64_t>());
          }
          if (e.name == "token") ++long_tokens;
          if (e.name == "done") long_done = e.data;
        });
    EXPECT_EQ(status, 200) << body;
  });
  // Event-driven: the long one has drawn some tokens.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (long_tokens.load() < 8 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
  }
  if (long_tokens.load() < 8) {  // (the client thread is joined before the test returns)
    server.Stop();
    long_client.join();
    FAIL() << "the long generation drew " << long_tokens.load() << " tokens in a minute";
  }
  int64_t joined = -1, queued = -1, first = -1;
  json short_done;
  const auto [status, body] =
      PostStream(port, "/v1/subgraphs/generate:stream", short_request, [&](const Event& e) {
        if (e.name == "joined") {
          joined = e.data["step"].get<int64_t>();
          queued = e.data["queued_steps"].get<int64_t>();
        }
        if (e.name == "token" && first < 0) first = e.data["step"].get<int64_t>();
        if (e.name == "done") short_done = e.data;
      });
  EXPECT_EQ(status, 200) << body;
  long_client.join();
  ASSERT_FALSE(long_done.is_null());
  ASSERT_FALSE(short_done.is_null());
  const json long_alone = Alone(predictor, long_request);
  ExpectAlone(long_done["fetches"], long_alone, "long");
  ExpectAlone(short_done["fetches"], Alone(predictor, short_request), "short");
  // The streamed tokens are the answer's, one per step.
  ASSERT_FALSE(long_steps.empty());
  for (size_t i = 0; i < long_ids.size(); ++i) {
    EXPECT_EQ(long_ids[i], long_done["fetches"]["ids"][0][i].get<int64_t>()) << i;
    if (i > 0) {
      EXPECT_EQ(long_steps[i], long_steps[i - 1] + 1) << i;
    }
  }
  // Joined within one step of arriving, first token in the step it joined: within 2 steps.
  EXPECT_LE(queued, 1);
  EXPECT_EQ(first, joined);
  // ... while the long one was running (it drew tokens before and after).
  EXPECT_LT(long_steps.front(), joined);
  if (long_done["fetches"]["lengths"][0].get<int64_t>() >
      static_cast<int64_t>(long_steps.size()) - 1) {
    EXPECT_GT(long_steps.back(), joined);
  }
  server.Stop();
}

// :run on a generation subgraph joins the running batch too: concurrent requests get the
// Predictor's answers alone. What cannot stream is refused with a JSON error before any event.
TEST(ContinuousBatching, RunAnswersAloneAndWhatCannotStreamIsRefused) {
  PredictorOptions po;
  po.batch_invariant = true;
  Predictor predictor(ExportedBundle(), po);
  InferenceServer server(&predictor, ServeOptions{});
  const int port = server.Start();
  std::vector<json> requests;
  for (int i = 0; i < 6; ++i) {
    requests.push_back(Generate({i % 2 ? "Elizabeth" : "It is a truth", "She"}, 5 + 7 * i, i));
  }
  std::vector<json> answers(requests.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_read_timeout(120);
      auto res = cli.Post("/v1/subgraphs/generate:run", requests[i].dump(), "application/json");
      ASSERT_TRUE(res);
      ASSERT_EQ(res->status, 200) << res->body;
      answers[i] = json::parse(res->body);
    });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    ExpectAlone(answers[i]["fetches"], Alone(predictor, requests[i]), StrCat("request ", i));
  }
  auto refused = [&](const std::string& path, const json& body, int want, const std::string& text) {
    bool any_event = false;
    const auto [status, answer] = PostStream(port, path, body, [&](const Event&) { any_event = true; });
    EXPECT_EQ(status, want) << path << " " << answer;
    EXPECT_FALSE(any_event) << path;
    EXPECT_NE(answer.find(text), std::string::npos) << answer;
  };
  refused("/v1/subgraphs/default:stream", {{"feeds", {{"text", {"a"}}}}}, 400,
          "does not generate token by token");
  refused("/v1/subgraphs/nope:stream", Generate({"a"}, 1, 1), 404, "nope");
  refused("/v1/subgraphs/generate:stream", Generate({"a"}, 100000, 1), 400, "max_new_tokens");
  refused("/v1/subgraphs/generate:stream", {{"feeds", {{"prompt", 3}}}}, 400, "prompt");
  server.Stop();
  // Without continuous batching, generations batch as scoring does and :stream is refused.
  ServeOptions off;
  off.continuous_batching = false;
  InferenceServer plain(&predictor, off);
  const int plain_port = plain.Start();
  bool any_event = false;
  const auto [status, answer] = PostStream(plain_port, "/v1/subgraphs/generate:stream",
                                           Generate({"a"}, 2, 1), [&](const Event&) { any_event = true; });
  EXPECT_EQ(status, 400);
  EXPECT_FALSE(any_event);
  EXPECT_NE(answer.find("streaming needs continuous batching"), std::string::npos) << answer;
  plain.Stop();
}

// Stop() with a stream in flight lets it end with its answer (cpp-httplib's own stop would cut
// it), then stops.
TEST(ContinuousBatching, StopFinishesTheStreamsInFlight) {
  PredictorOptions po;
  po.batch_invariant = true;
  Predictor predictor(ExportedBundle(), po);
  InferenceServer server(&predictor, ServeOptions{});
  const int port = server.Start();
  std::atomic<int> tokens{0};
  std::atomic<bool> done{false};
  std::thread client([&] {
    const auto [status, body] = PostStream(
        port, "/v1/subgraphs/generate:stream", Generate(std::vector<std::string>(4, "She"), 300, 4),
        [&](const Event& e) {
          if (e.name == "token") ++tokens;
          if (e.name == "done") done = true;
        });
    EXPECT_EQ(status, 200) << body;
  });
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (tokens.load() == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  EXPECT_GT(tokens.load(), 0);
  server.Stop();
  client.join();
  EXPECT_TRUE(done.load()) << "the stream was cut after " << tokens.load() << " tokens";
}

// A client that goes away mid-stream: its request leaves the batch at the next step. With room
// for 4 rows, a second request of 4 rows can only join once the first one's have left, which it
// does within a few steps, not after the first one's 512.
TEST(ContinuousBatching, AStreamWhoseClientWentAwayLeavesTheBatch) {
  PredictorOptions po;
  po.batch_invariant = true;
  Predictor predictor(ExportedBundle(), po);
  ContinuousBatcher gen(&predictor, "generate", {.max_batch_rows = 4});
  gen.Start();
  auto four = [](int64_t max_new) {
    return InferenceMap{{"prompt", InferenceValue::Strings(std::vector<std::string>(4, "She"))},
                        {"max_new_tokens", InferenceValue::Of(at::scalar_tensor(max_new, at::kLong))},
                        {"temperature", InferenceValue::Of(at::scalar_tensor(1.0, at::kFloat))}};
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  auto first = gen.Enqueue(four(512));
  GenerationEvent e;
  do {
    ASSERT_TRUE(first->Next(&e, deadline));
  } while (e.kind != GenerationEvent::kToken);
  first->Cancel();
  auto second = gen.Enqueue(four(3));
  ASSERT_TRUE(second->Next(&e, deadline));
  ASSERT_EQ(e.kind, GenerationEvent::kJoined);
  EXPECT_LT(e.queued_steps, 20) << "the cancelled request's rows did not leave";
  do {
    ASSERT_TRUE(second->Next(&e, deadline));
  } while (e.kind == GenerationEvent::kToken);
  EXPECT_EQ(e.kind, GenerationEvent::kDone);
  gen.Stop();
  EXPECT_FALSE(first->ended());  // no answer for a request nobody waits for
}

// A stream's events as text, and a request that waits past its deadline ends with UNAVAILABLE
// without joining.
TEST(ContinuousBatching, EventsAreServerSentEventLinesAndLateRequestsAreDropped) {
  GenerationEvent joined;
  joined.kind = GenerationEvent::kJoined;
  joined.step = 41;
  joined.queued_steps = 1;
  EXPECT_EQ(EventStreamText(joined, {}), "event: joined\ndata: {\"step\":41,\"queued_steps\":1}\n\n");
  GenerationEvent token;
  token.token = {0, 2, 17, "\xe2\x96\x81the"};
  token.step = 42;
  EXPECT_EQ(EventStreamText(token, {}),
            "event: token\ndata: {\"row\":2,\"id\":17,\"piece\":\"\xe2\x96\x81the\",\"step\":42}\n\n");
  GenerationEvent bad;
  bad.kind = GenerationEvent::kError;
  bad.error = std::make_exception_ptr(InvalidArgumentError("no"));
  EXPECT_EQ(EventStreamText(bad, {}),
            "event: error\ndata: {\"error\":{\"code\":\"INVALID_ARGUMENT\",\"message\":\"no\"}}\n\n");
  PredictorOptions po;
  po.batch_invariant = true;
  Predictor predictor(ExportedBundle(), po);
  ContinuousBatcher gen(&predictor, "generate", {.max_batch_rows = 4});
  gen.Pause();
  gen.Start();
  auto late = gen.Enqueue({{"prompt", InferenceValue::Strings({"a"})}},
                          std::chrono::steady_clock::now() - std::chrono::seconds(1));
  auto fine = gen.Enqueue({{"prompt", InferenceValue::Strings({"a"})},
                           {"max_new_tokens", InferenceValue::Of(at::scalar_tensor(2, at::kLong))}});
  EXPECT_EQ(gen.queued(), 2);
  gen.Resume();
  GenerationEvent e;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  ASSERT_TRUE(late->Next(&e, deadline));
  EXPECT_EQ(e.kind, GenerationEvent::kError);
  EXPECT_NE(EventStreamText(e, {}).find("UNAVAILABLE"), std::string::npos);
  std::vector<GenerationEvent::Kind> kinds;
  do {
    ASSERT_TRUE(fine->Next(&e, deadline));
    kinds.push_back(e.kind);
  } while (e.kind != GenerationEvent::kDone && e.kind != GenerationEvent::kError);
  EXPECT_EQ(kinds.front(), GenerationEvent::kJoined);
  EXPECT_EQ(kinds.back(), GenerationEvent::kDone);
  EXPECT_LE(kinds.size(), 4u);  // joined, at most 2 tokens, done
  // Draining (SIGTERM's first step) already refuses new requests, and so does a stopped batcher.
  gen.Drain();
  EXPECT_THROW(gen.Enqueue({{"prompt", InferenceValue::Strings({"a"})}}), UnavailableError);
  gen.Stop();
  EXPECT_THROW(gen.Enqueue({{"prompt", InferenceValue::Strings({"a"})}}), UnavailableError);
}

}  // namespace
}  // namespace glossa
