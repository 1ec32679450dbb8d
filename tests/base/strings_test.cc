#include "glossa/base/strings.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace glossa {
namespace {

nlohmann::json Reference() {
  return nlohmann::json::parse(testing::ReadSourceFile("tests/reference/python_repr.json"));
}

TEST(Strings, PyFloatReprMatchesPython) {
  auto ref = Reference();
  ASSERT_GT(ref["floats"].size(), 300u);
  for (const auto& item : ref["floats"]) {
    uint64_t bits = std::stoull(item[0].get<std::string>(), nullptr, 16);
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    EXPECT_EQ(PyFloatRepr(d), item[1].get<std::string>()) << "bits " << item[0];
  }
}

TEST(Strings, PyFloatReprOfNan) { EXPECT_EQ(PyFloatRepr(std::nan("")), "nan"); }

TEST(Strings, PyStrReprMatchesPython) {
  auto ref = Reference();
  for (const auto& item : ref["strings"]) {
    EXPECT_EQ(PyStrRepr(item[0].get<std::string>()), item[1].get<std::string>());
  }
}

TEST(Strings, SimilarKeysUsesLingvosTrigramRule) {
  std::vector<std::string> keys = {"activation", "activations", "cheesecake", "tofu"};
  EXPECT_EQ(SimilarKeys("actuvation", keys),
            (std::vector<std::string>{"activation", "activations"}));
  // Lingvo counts len(name) - 3 trigrams: "abcd" has one trial ("abc"), "abc" has none.
  EXPECT_EQ(SimilarKeys("abcd", {"xabcx", "abd"}), (std::vector<std::string>{"xabcx"}));
  EXPECT_TRUE(SimilarKeys("abc", {"abc"}).empty());
  EXPECT_TRUE(SimilarKeys("zzzzzz", keys).empty());
}

TEST(Strings, KeyErrorStringListsSimilarKeysOrAllKeys) {
  std::vector<std::string> keys = {"tofu", "activation", "activations", "cheesecake"};
  EXPECT_EQ(KeyErrorString("actuvation", keys),
            "actuvation (did you mean: [activation,activations])");
  EXPECT_EQ(KeyErrorString("zzzzzz", keys),
            "zzzzzz (keys are ['activation', 'activations', 'cheesecake', 'tofu'])");
}

TEST(Strings, SplitJoinStrip) {
  EXPECT_EQ(Split("a,,b", ','), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(Join({"a", "b", "c"}, ", "), "a, b, c");
  EXPECT_EQ(Strip("  x y \t\n"), "x y");
  EXPECT_EQ(StrCat("a", 1, 'b', 2.5), "a1b2.5");
}

}  // namespace
}  // namespace glossa
