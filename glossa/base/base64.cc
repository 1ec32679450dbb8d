#include "glossa/base/base64.h"

#include <cctype>

namespace glossa {
namespace {
constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  int val = 0, bits = -6;
  for (unsigned char c : bytes) {
    val = (val << 8) + c;
    bits += 8;
    while (bits >= 0) {
      out.push_back(kAlphabet[(val >> bits) & 0x3F]);
      bits -= 6;
    }
  }
  if (bits > -6) out.push_back(kAlphabet[((val << 8) >> (bits + 8)) & 0x3F]);
  while (out.size() % 4 != 0) out.push_back('=');
  return out;
}

std::optional<std::string> Base64Decode(std::string_view text) {
  std::string out;
  int val = 0, bits = -8;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if (c == '=') break;
    const size_t pos = kAlphabet.find(c);
    if (pos == std::string_view::npos) return std::nullopt;
    val = ((val << 6) + static_cast<int>(pos)) & 0xFFFFFF;
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  if (out.empty()) return std::nullopt;
  return out;
}

}  // namespace glossa
