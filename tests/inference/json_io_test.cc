// JSON feeds and fetches (glossa/inference/json_io.h): what predict and serve read and write.
#include "glossa/inference/json_io.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace glossa {
namespace {

using nlohmann::json;

InferenceSubgraphSpec Spec() {
  InferenceSubgraphSpec s;
  s.feeds["text"] = {"string", 1, false, ""};
  s.feeds["ids"] = {"int64", 2, true, ""};
  s.feeds["scale"] = {"float32", 0, true, ""};
  return s;
}

TEST(JsonIo, FeedsFromJsonBuildsTypedValues) {
  const InferenceMap m = FeedsFromJson(
      json::parse(R"({"text": ["a", "b c"], "ids": [[1, 2, 3], [4, 5, 6]], "scale": 0.5})"),
      Spec(), "w");
  EXPECT_EQ(m.at("text").strings, (std::vector<std::string>{"a", "b c"}));
  EXPECT_TRUE(at::equal(m.at("ids").tensor, at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({2, 3})));
  EXPECT_EQ(m.at("scale").tensor.dim(), 0);
  EXPECT_EQ(m.at("scale").tensor.scalar_type(), at::kFloat);
  EXPECT_EQ(m.at("scale").tensor.item<float>(), 0.5f);
}

TEST(JsonIo, BadFeedsNameTheFeedAndTheProblem) {
  auto bad = [](const char* text, const char* message) {
    EXPECT_ERROR_CONTAINS(FeedsFromJson(json::parse(text), Spec(), "w"), InvalidArgumentError,
                          message);
  };
  bad(R"([1])", "w: feeds must be a JSON object, got array");
  bad(R"({"txt": []})", "w: unknown feed 'txt' (feeds: ids, scale, text)");
  bad(R"({"text": "a"})", "feed 'text' must be an array of strings, got string");
  bad(R"({"text": ["a", null]})", "feed 'text'[1] must be a string, got null");
  bad(R"({"ids": [[1, 2], [3]]})", "feed 'ids' is ragged");
  bad(R"({"ids": [3, [1, 2]]})", "feed 'ids' is ragged");
  bad(R"({"ids": [[1, 2], [3, 4.5]]})", "feed 'ids' must hold integers, got 4.5");
  bad(R"({"ids": [[1, "x"]]})", "feed 'ids' holds string, expected numbers");
  bad(R"({"ids": [[18446744073709551615]]})", "beyond int64");
  bad(R"({"ids": [1, 2]})", "feed 'ids' must have rank 2, got rank 1");
  bad(R"({"scale": [1.0]})", "feed 'scale' must have rank 0, got rank 1");
}

TEST(JsonIo, PerTokenFetchesAreCutToTheirLengths) {
  InferenceMap f;
  f["log_probs"] = InferenceValue::Of(at::tensor({-1.0, -2.0, 0.0, -3.0, 0.0, 0.0}).view({2, 3}));
  f["lengths"] = InferenceValue::Of(at::tensor({2, 1}, at::kLong));
  f["text"] = InferenceValue::Strings({"x", "y"});
  f["step"] = InferenceValue::Of(at::scalar_tensor(7, at::kLong));
  EXPECT_EQ(json::parse(FetchesToJson(f).dump()),
            json::parse(R"({"lengths": [2, 1], "log_probs": [[-1.0, -2.0], [-3.0]],
                            "step": 7, "text": ["x", "y"]})"));
  EXPECT_EQ(json::parse(FetchRowToJson(f, 1).dump()),
            json::parse(R"({"lengths": 1, "log_probs": [-3.0], "step": 7, "text": "y"})"));
}

}  // namespace
}  // namespace glossa
