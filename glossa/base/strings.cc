#include "glossa/base/strings.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <system_error>

namespace glossa {

std::string Join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out.append(sep);
    out.append(parts[i]);
  }
  return out;
}

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      out.emplace_back(s.substr(start));
      return out;
    }
    out.emplace_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string_view Strip(std::string_view s) {
  auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string PyFloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // Shortest round-trip digits in scientific form: [-]d[.ddd]e[+-]XX.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  int exponent = std::atoi(sci.c_str() + e_pos + 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  const int n = static_cast<int>(digits.size());
  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    out += 'e';
    out += exponent < 0 ? '-' : '+';
    std::string exp_digits = std::to_string(std::abs(exponent));
    if (exp_digits.size() < 2) exp_digits = "0" + exp_digits;
    out += exp_digits;
  } else if (exponent >= 0) {
    if (n <= exponent + 1) {
      out += digits + std::string(exponent + 1 - n, '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out += "0." + std::string(-exponent - 1, '0') + digits;
  }
  return out;
}

std::string PyStrRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\' || c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      static const char* kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::vector<std::string> SimilarKeys(std::string_view name, const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (const auto& key : keys) {
    int matches = 0, trials = 0;
    for (int i = 0; i + 3 < static_cast<int>(name.size()); ++i) {
      ++trials;
      if (key.find(name.substr(i, 3)) != std::string::npos) ++matches;
    }
    if (trials > 0 && static_cast<double>(matches) / trials > 0.5) out.push_back(key);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string KeyErrorString(std::string_view name, std::vector<std::string> keys) {
  auto similar = SimilarKeys(name, keys);
  if (!similar.empty()) return StrCat(name, " (did you mean: [", Join(similar, ","), "])");
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> quoted;
  for (const auto& k : keys) quoted.push_back(PyStrRepr(k));
  return StrCat(name, " (keys are [", Join(quoted, ", "), "])");
}

}  // namespace glossa
