#include "glossa/metrics/bleu.h"

#include <cmath>
#include <map>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {

namespace {

// Decodes the UTF-8 code point at s[i] (its length in *len); -1 for an invalid sequence (one byte).
int32_t CodePoint(std::string_view s, size_t i, size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) {
    *len = 1;
    return -1;
  }
  int32_t cp = n == 1 ? b : b & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 0x2) {
      *len = 1;
      return -1;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  *len = static_cast<size_t>(n);
  return cp;
}

// Python's str.isspace().
bool IsSpace(int32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string ReplaceAll(std::string s, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out.append(to);
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// Python's str.strip() (Unicode whitespace at both ends).
std::string StripUnicode(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end) {
    size_t len = 0;
    const int32_t cp = CodePoint(s, begin, &len);
    if (!IsSpace(cp)) break;
    begin += len;
  }
  while (end > begin) {  // back up to the start of the last code point
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) >> 6) == 0x2) --start;
    size_t len = 0;
    const int32_t cp = CodePoint(s, start, &len);
    if (start + len != end || !IsSpace(cp)) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

}  // namespace

std::vector<std::string> SplitOnUnicodeWhitespace(std::string_view text) {
  std::vector<std::string> out;
  std::string token;
  for (size_t i = 0; i < text.size();) {
    size_t len = 0;
    const int32_t cp = CodePoint(text, i, &len);
    if (IsSpace(cp)) {
      if (!token.empty()) out.push_back(std::move(token));
      token.clear();
    } else {
      token.append(text.substr(i, len));
    }
    i += len;
  }
  if (!token.empty()) out.push_back(std::move(token));
  return out;
}

std::string Unsegment(std::string_view text, const std::string& separator_type) {
  if (separator_type.empty()) return std::string(text);
  if (separator_type == "bpe") return StripUnicode(ReplaceAll(std::string(text), "@@ ", ""));
  if (separator_type == "wpm" || separator_type == "spm") {
    return StripUnicode(ReplaceAll(ReplaceAll(std::string(text), " ", ""), "\xe2\x96\x81", " "));
  }
  throw InvalidArgumentError(StrCat("BLEU: separator_type must be '', 'bpe', 'wpm' or 'spm', got '",
                                    separator_type, "'"));
}

BleuScorer::BleuScorer(int max_ngram, std::string separator_type)
    : max_ngram_(max_ngram),
      separator_type_(std::move(separator_type)),
      matches_(max_ngram > 0 ? max_ngram : 0, 0),
      counts_(max_ngram > 0 ? max_ngram : 0, 0) {
  if (max_ngram < 1) throw InvalidArgumentError(StrCat("BLEU: max_ngram must be >= 1, got ", max_ngram));
  Unsegment("", separator_type_);  // checks the type
}

void BleuScorer::AddSentence(std::string_view ref, std::string_view hyp) {
  const std::vector<std::string> r = SplitOnUnicodeWhitespace(Unsegment(ref, separator_type_));
  const std::vector<std::string> h = SplitOnUnicodeWhitespace(Unsegment(hyp, separator_type_));
  num_ref_tokens_ += static_cast<int64_t>(r.size());
  num_hyp_tokens_ += static_cast<int64_t>(h.size());
  for (int n = 1; n <= max_ngram_; ++n) {
    std::map<std::vector<std::string>, int64_t> ref_counts, hyp_counts;
    for (size_t i = 0; i + n <= r.size(); ++i) ++ref_counts[{r.begin() + i, r.begin() + i + n}];
    for (size_t i = 0; i + n <= h.size(); ++i) ++hyp_counts[{h.begin() + i, h.begin() + i + n}];
    int64_t matched = 0, total = 0;
    for (const auto& [gram, count] : hyp_counts) {
      total += count;
      auto it = ref_counts.find(gram);
      if (it != ref_counts.end()) matched += std::min(count, it->second);
    }
    matches_[n - 1] += matched;
    counts_[n - 1] += total;
  }
}

double BleuScorer::ComputeOverallScore() const {
  double log_sum = 0;
  int orders = 0;
  for (int i = 0; i < max_ngram_; ++i) {
    if (matches_[i] > 0 && counts_[i] > 0) {
      log_sum += std::log(static_cast<double>(matches_[i]) / static_cast<double>(counts_[i]));
      ++orders;
    }
  }
  if (orders == 0) return 0.0;
  const double precision = std::exp(log_sum / orders);
  double brevity = 1.0;
  if (num_hyp_tokens_ < num_ref_tokens_) {
    brevity = std::exp(1.0 - static_cast<double>(num_ref_tokens_) /
                                 static_cast<double>(num_hyp_tokens_));
  }
  return brevity * precision;
}

double SentenceBleu(std::string_view ref, std::string_view hyp, int max_ngram,
                    const std::string& separator_type) {
  BleuScorer s(max_ngram, separator_type);
  s.AddSentence(ref, hyp);
  return s.ComputeOverallScore();
}

}  // namespace glossa
