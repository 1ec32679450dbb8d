// Small string helpers shared by every layer: concatenation, joining, Python-compatible reprs (the
// params text format is Python's), and Lingvo's "did you mean" similarity.
//
//   throw NotFoundError(StrCat("key '", key, "' not found in ", Join(keys, ", ")));
//   PyFloatRepr(1e-6) == "1e-06";  PyStrRepr("it's") == "\"it's\"";
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace glossa {

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

std::string Join(const std::vector<std::string>& parts, std::string_view sep);

// Splits at every occurrence of `sep` (empty pieces kept).
std::vector<std::string> Split(std::string_view s, char sep);

// Removes leading and trailing ASCII whitespace.
std::string_view Strip(std::string_view s);

// Python's repr() of a float: shortest round-trip digits, fixed notation for decimal exponents in
// [-4, 16), otherwise exponent notation with at least two exponent digits ("1e-06", "1e+16");
// integral values keep ".0"; "inf", "-inf", "nan".
std::string PyFloatRepr(double value);

// Python 3's repr() of a str: single quotes unless the string contains ' and no ", backslash and
// the chosen quote escaped, \n \r \t and other control bytes escaped; bytes >= 0x80 kept (UTF-8).
std::string PyStrRepr(std::string_view s);

// Lingvo's similarity rule for misspelled keys: the keys in which more than half of `name`'s
// 3-character substrings occur. Lingvo counts len(name) - 3 substrings (its range() stops one
// short), and so do we, so suggestions match Lingvo's exactly. Result sorted.
std::vector<std::string> SimilarKeys(std::string_view name, const std::vector<std::string>& keys);

// "name (did you mean: [a,b])" when similar keys exist, else "name (keys are ['a', 'b'])", as in
// Lingvo's Params error messages.
std::string KeyErrorString(std::string_view name, std::vector<std::string> keys);

}  // namespace glossa
