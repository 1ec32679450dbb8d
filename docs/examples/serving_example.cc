// Serving a bundle from C++: the Predictor, and the HTTP server `glossa serve` runs over it.
// Compiled into the test binary (tests/CMakeLists.txt); docs/inference.md shows this file verbatim.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "glossa/inference/predictor.h"
#include "glossa/inference/server.h"
#include "tests/inference/test_bundle.h"  // ExportedBundle(): a bundle of a small Austen LM

TEST(ServingExample, PredictorAndServer) {
  // The Predictor: named feeds in, named fetches out, from any number of threads.
  glossa::Predictor predictor(glossa::ExportedBundle());
  const glossa::InferenceMap out = predictor.Run(
      "default",
      {{"text", glossa::InferenceValue::Strings({"It is a truth universally acknowledged"})}});
  const double log_prob = out.at("total_log_prob").tensor[0].item<double>();
  EXPECT_LT(log_prob, 0);

  // The same over HTTP/JSON: 127.0.0.1, a free port, dynamic batching.
  glossa::InferenceServer server(&predictor, glossa::ServeOptions{});
  const int port = server.Start();
  httplib::Client client("127.0.0.1", port);
  auto res = client.Post("/v1/subgraphs/default:run",
                         R"({"feeds": {"text": ["It is a truth universally acknowledged"]}})",
                         "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const auto answer = nlohmann::json::parse(res->body);
  EXPECT_EQ(answer["fetches"]["total_log_prob"][0].get<double>(), log_prob);
  server.Stop();  // stops accepting, finishes the requests in flight
}
