#include "glossa/metrics/wer.h"

#include <algorithm>
#include <sstream>

namespace glossa {

ErrorCounts& ErrorCounts::operator+=(const ErrorCounts& o) {
  substitutions += o.substitutions;
  insertions += o.insertions;
  deletions += o.deletions;
  reference_length += o.reference_length;
  return *this;
}

double ErrorCounts::rate() const {
  if (reference_length == 0) return errors() == 0 ? 0.0 : 1.0;
  return static_cast<double>(errors()) / static_cast<double>(reference_length);
}

ErrorCounts EditDistance(const std::vector<std::string>& ref, const std::vector<std::string>& hyp) {
  const size_t n = ref.size(), m = hyp.size();
  struct Cell {
    int64_t cost = 0, sub = 0, ins = 0, del = 0;
  };
  std::vector<Cell> prev(m + 1), cur(m + 1);
  for (size_t j = 0; j <= m; ++j) prev[j] = {static_cast<int64_t>(j), 0, static_cast<int64_t>(j), 0};
  for (size_t i = 1; i <= n; ++i) {
    cur[0] = {static_cast<int64_t>(i), 0, 0, static_cast<int64_t>(i)};
    for (size_t j = 1; j <= m; ++j) {
      const bool same = ref[i - 1] == hyp[j - 1];
      Cell diag = prev[j - 1];
      diag.cost += same ? 0 : 1;
      diag.sub += same ? 0 : 1;
      Cell del = prev[j];
      ++del.cost;
      ++del.del;
      Cell ins = cur[j - 1];
      ++ins.cost;
      ++ins.ins;
      Cell best = diag;
      if (del.cost < best.cost) best = del;
      if (ins.cost < best.cost) best = ins;
      cur[j] = best;
    }
    std::swap(prev, cur);
  }
  ErrorCounts e;
  e.substitutions = prev[m].sub;
  e.insertions = prev[m].ins;
  e.deletions = prev[m].del;
  e.reference_length = static_cast<int64_t>(n);
  return e;
}

namespace {

std::vector<std::string> Words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::vector<std::string> Chars(const std::string& s) {
  const std::vector<std::string> words = Words(s);
  std::vector<std::string> out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out.push_back(" ");
    for (char c : words[i]) out.emplace_back(1, c);
  }
  return out;
}

}  // namespace

ErrorCounts WordErrors(const std::string& ref, const std::string& hyp) {
  return EditDistance(Words(ref), Words(hyp));
}

ErrorCounts CharErrors(const std::string& ref, const std::string& hyp) {
  return EditDistance(Chars(ref), Chars(hyp));
}

}  // namespace glossa
