#include "glossa/input/shortlist.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <charconv>
#include <sstream>
#include <unordered_map>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"

namespace glossa {

namespace {

// The distinct ids of a sequence, each checked against the vocabulary.
std::vector<int64_t> Distinct(const std::vector<int64_t>& ids, int64_t vocab, size_t pair,
                              const char* side) {
  std::vector<int64_t> out = ids;
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (!out.empty() && (out.front() < 0 || out.back() >= vocab)) {
    throw InvalidArgumentError(StrCat("shortlist: pair ", pair, ": a ", side, " id outside [0, ",
                                      vocab, ")"));
  }
  return out;
}

// Whitespace-separated integers of a line; DataLoss naming file and line otherwise.
std::vector<int64_t> ParseIds(const std::string& line, const std::string& path, int64_t lineno) {
  std::vector<int64_t> out;
  std::istringstream in(line);
  std::string field;
  while (in >> field) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    if (ec != std::errc() || end != field.data() + field.size()) {
      throw DataLossError(StrCat(path, ":", lineno, ": '", field, "' is not an integer id"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

VocabShortlist VocabShortlist::Build(
    const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>& pairs,
    int64_t source_vocab, int64_t target_vocab, int64_t per_source, int64_t frequent) {
  if (source_vocab < 1 || target_vocab < 1 || per_source < 1 || frequent < 0) {
    throw InvalidArgumentError(StrCat("shortlist: needs vocabularies >= 1, per_source >= 1 and ",
                                      "frequent >= 0, got ", source_vocab, ", ", target_vocab,
                                      ", ", per_source, ", ", frequent));
  }
  std::vector<int64_t> c_src(source_vocab, 0), c_tgt(target_vocab, 0);
  std::vector<std::unordered_map<int64_t, int64_t>> co(source_vocab);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const std::vector<int64_t> s = Distinct(pairs[i].first, source_vocab, i, "source");
    const std::vector<int64_t> t = Distinct(pairs[i].second, target_vocab, i, "target");
    for (int64_t a : s) {
      ++c_src[a];
      for (int64_t b : t) ++co[a][b];
    }
    for (int64_t b : t) ++c_tgt[b];
  }
  VocabShortlist out;
  out.source_vocab_ = source_vocab;
  out.target_vocab_ = target_vocab;
  std::vector<int64_t> order(target_vocab);
  for (int64_t b = 0; b < target_vocab; ++b) order[b] = b;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return c_tgt[x] > c_tgt[y]; });
  for (int64_t b : order) {
    if (static_cast<int64_t>(out.frequent_.size()) == frequent || c_tgt[b] == 0) break;
    out.frequent_.push_back(b);
  }
  std::sort(out.frequent_.begin(), out.frequent_.end());
  out.per_source_.resize(source_vocab);
  for (int64_t a = 0; a < source_vocab; ++a) {
    std::vector<std::pair<double, int64_t>> scored;
    for (const auto& [b, c] : co[a]) {
      scored.emplace_back(2.0 * static_cast<double>(c) / static_cast<double>(c_src[a] + c_tgt[b]),
                          b);
    }
    std::sort(scored.begin(), scored.end(), [](const auto& x, const auto& y) {
      return x.first != y.first ? x.first > y.first : x.second < y.second;
    });
    if (static_cast<int64_t>(scored.size()) > per_source) scored.resize(per_source);
    for (const auto& [score, b] : scored) out.per_source_[a].push_back(b);
    std::sort(out.per_source_[a].begin(), out.per_source_[a].end());
  }
  return out;
}

void VocabShortlist::Save(const std::string& path) const {
  std::string text = StrCat("glossa_shortlist 1 ", source_vocab_, " ", target_vocab_, "\n");
  text += "frequent";
  for (int64_t b : frequent_) text += StrCat(" ", b);
  text += "\n";
  for (int64_t a = 0; a < source_vocab_; ++a) {
    if (per_source_[a].empty()) continue;
    text += StrCat(a);
    for (int64_t b : per_source_[a]) text += StrCat(" ", b);
    text += "\n";
  }
  AtomicWriteFile(path, text);
}

VocabShortlist VocabShortlist::Load(const std::string& path) {
  std::istringstream in(ReadFileToString(path));
  std::string line;
  int64_t lineno = 0;
  auto fail = [&](const std::string& what) {
    throw DataLossError(StrCat(path, ":", lineno, ": ", what));
  };
  ++lineno;
  if (!std::getline(in, line) || line.rfind("glossa_shortlist 1 ", 0) != 0) {
    fail("not a glossa shortlist (expected 'glossa_shortlist 1 <source_vocab> <target_vocab>')");
  }
  const std::vector<int64_t> header = ParseIds(line.substr(19), path, lineno);
  if (header.size() != 2 || header[0] < 1 || header[1] < 1) fail("bad vocabulary sizes");
  VocabShortlist out;
  out.source_vocab_ = header[0];
  out.target_vocab_ = header[1];
  out.per_source_.resize(out.source_vocab_);
  auto targets = [&](std::vector<int64_t> ids) {
    for (int64_t b : ids) {
      if (b < 0 || b >= out.target_vocab_) {
        fail(StrCat("target id ", b, " outside [0, ", out.target_vocab_, ")"));
      }
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
  };
  ++lineno;
  if (!std::getline(in, line) || line.rfind("frequent", 0) != 0) fail("expected 'frequent <ids>'");
  out.frequent_ = targets(ParseIds(line.substr(8), path, lineno));
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    std::vector<int64_t> ids = ParseIds(line, path, lineno);
    if (ids.empty()) continue;
    const int64_t a = ids.front();
    if (a < 0 || a >= out.source_vocab_) {
      fail(StrCat("source id ", a, " outside [0, ", out.source_vocab_, ")"));
    }
    if (!out.per_source_[a].empty()) fail(StrCat("source id ", a, " listed twice"));
    ids.erase(ids.begin());
    out.per_source_[a] = targets(std::move(ids));
  }
  return out;
}

at::Tensor VocabShortlist::Candidates(const at::Tensor& ids, const at::Tensor& paddings,
                                      const std::vector<int64_t>& always) const {
  const at::Tensor src = ids.to(at::kLong).contiguous().view({-1});
  const at::Tensor pad = paddings.defined()
                             ? paddings.to(at::kFloat).contiguous().view({-1})
                             : at::zeros({src.numel()}, at::kFloat);
  if (pad.numel() != src.numel()) {
    throw InvalidArgumentError(StrCat("shortlist: paddings ", paddings.sizes(),
                                      " do not match the ids ", ids.sizes()));
  }
  std::vector<bool> in(target_vocab_, false);
  for (int64_t b : frequent_) in[b] = true;
  for (int64_t b : always) {
    if (b < 0 || b >= target_vocab_) {
      throw InvalidArgumentError(StrCat("shortlist: id ", b, " outside the target vocabulary of ",
                                        target_vocab_));
    }
    in[b] = true;
  }
  const int64_t* s = src.data_ptr<int64_t>();
  const float* p = pad.data_ptr<float>();
  for (int64_t i = 0; i < src.numel(); ++i) {
    if (p[i] > 0.5f) continue;
    if (s[i] < 0 || s[i] >= source_vocab_) {
      throw InvalidArgumentError(StrCat("shortlist: source id ", s[i], " outside [0, ",
                                        source_vocab_, ")"));
    }
    for (int64_t b : per_source_[s[i]]) in[b] = true;
  }
  std::vector<int64_t> out;
  for (int64_t b = 0; b < target_vocab_; ++b) {
    if (in[b]) out.push_back(b);
  }
  return at::tensor(out, at::kLong);
}

}  // namespace glossa
