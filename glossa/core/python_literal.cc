#include "glossa/core/python_literal.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/params.h"
#include "glossa/core/params_repr.h"

namespace glossa {
namespace internal {
namespace {

class LiteralParser {
 public:
  explicit LiteralParser(std::string_view text) : s_(text) {}

  ParamValue ParseAll() {
    ParamValue v = ParseValue();
    SkipSpace();
    if (pos_ != s_.size()) Fail("unexpected trailing text");
    return v;
  }

 private:
  [[noreturn]] void Fail(std::string_view why) {
    throw InvalidArgumentError(
        StrCat("cannot parse Python literal at offset ", pos_, ": ", why, " in ", PyStrRepr(s_)));
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    size_t end = pos_ + w.size();
    if (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_')) {
      return false;
    }
    pos_ = end;
    return true;
  }

  // Nesting deeper than this is an error rather than a stack overflow on hostile input.
  static constexpr int kMaxDepth = 100;

  ParamValue ParseValue() {
    SkipSpace();
    if (pos_ >= s_.size()) Fail("unexpected end");
    char c = s_[pos_];
    if (c == '[' || c == '(' || c == '{') {
      if (++depth_ > kMaxDepth) Fail(StrCat("nesting deeper than ", kMaxDepth));
      ParamValue v = c == '[' ? ParseList(']') : c == '(' ? ParseParenthesized() : ParseDict();
      --depth_;
      return v;
    }
    if (c == '\'' || c == '"') return ParseString();
    if (ConsumeWord("None")) return ParamValue();
    if (ConsumeWord("True")) return ParamValue(true);
    if (ConsumeWord("False")) return ParamValue(false);
    return ParseNumber();
  }

  ParamValue ParseList(char close, bool* saw_comma = nullptr) {
    ++pos_;
    ParamValue::List items;
    while (true) {
      if (Consume(close)) break;
      items.push_back(ParseValue());
      if (Consume(',')) {
        if (saw_comma) *saw_comma = true;
        continue;
      }
      if (Consume(close)) break;
      Fail(StrCat("expected ',' or '", close, "'"));
    }
    return ParamValue(std::move(items));
  }

  // `(x)` is x; `()`, `(x,)` and `(x, y)` are tuples, which Glossa keeps as lists.
  ParamValue ParseParenthesized() {
    bool saw_comma = false;
    ParamValue v = ParseList(')', &saw_comma);
    if (!saw_comma && v.AsList().size() == 1) return v.AsList()[0];
    return v;
  }

  ParamValue ParseDict() {
    ++pos_;
    ParamValue::Dict items;
    while (true) {
      if (Consume('}')) break;
      SkipSpace();
      if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) {
        Fail("dict keys must be strings");
      }
      std::string key = ParseString().AsString();
      if (!Consume(':')) Fail("expected ':' after dict key");
      items[key] = ParseValue();
      if (Consume(',')) continue;
      if (Consume('}')) break;
      Fail("expected ',' or '}'");
    }
    return ParamValue(std::move(items));
  }

  static void AppendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t CheckCodePoint(uint32_t cp) {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      Fail(StrCat("escape \\U", cp, " is not a valid Unicode scalar value"));
    }
    return cp;
  }

  uint32_t ParseHex(size_t digits) {
    if (pos_ + digits > s_.size()) Fail("truncated escape");
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        Fail("bad hex digit in escape");
    }
    return v;
  }

  ParamValue ParseString() {
    const char quote = s_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) Fail("unterminated string");
      char c = s_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) Fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;  // line continuation
        case 'x': AppendUtf8(out, ParseHex(2)); break;
        case 'u': AppendUtf8(out, CheckCodePoint(ParseHex(4))); break;
        case 'U': AppendUtf8(out, CheckCodePoint(ParseHex(8))); break;
        case '0':
        case '1':
        case '2':
        case '3':
        case '4':
        case '5':
        case '6':
        case '7': {
          // Octal: up to three digits, as in Python.
          uint32_t v = e - '0';
          for (int i = 0; i < 2 && pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '7'; ++i) {
            v = v * 8 + (s_[pos_++] - '0');
          }
          AppendUtf8(out, v);
          break;
        }
        default: out += '\\'; out += e;  // Python keeps unknown escapes verbatim
      }
    }
    return ParamValue(std::move(out));
  }

  ParamValue ParseNumber() {
    const size_t start = pos_;
    bool negative = false;
    if (s_[pos_] == '-' || s_[pos_] == '+') {
      negative = s_[pos_] == '-';
      ++pos_;
      SkipSpace();  // Python accepts `- 5`
    }
    // inf and nan are not Python literals, but ToText writes them (repr of a float); accept them.
    if (ConsumeWord("inf")) return ParamValue(negative ? -HUGE_VAL : HUGE_VAL);
    if (ConsumeWord("nan")) return ParamValue(std::nan(""));
    if (pos_ >= s_.size() ||
        !(std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.')) {
      pos_ = start;
      Fail("expected a value");
    }
    const size_t num_start = pos_;
    bool is_float = false;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c)) || c == '_') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E') {
        is_float = true;
        ++pos_;
        if ((c == 'e' || c == 'E') && pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) {
          ++pos_;
        }
      } else {
        break;
      }
    }
    std::string digits = negative ? "-" : "";
    for (size_t i = num_start; i < pos_; ++i) {
      if (s_[i] != '_') digits += s_[i];
    }
    if (!is_float) {
      int64_t v = 0;
      auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (res.ec != std::errc() || res.ptr != digits.data() + digits.size()) {
        pos_ = start;
        Fail("integer out of int64 range or malformed");
      }
      return ParamValue(v);
    }
    char* end = nullptr;
    double v = std::strtod(digits.c_str(), &end);
    if (end != digits.c_str() + digits.size()) {
      pos_ = start;
      Fail("malformed float");
    }
    return ParamValue(v);
  }

  std::string_view s_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

ParamValue ParsePythonLiteral(std::string_view text) { return LiteralParser(text).ParseAll(); }

}  // namespace internal
}  // namespace glossa
