#include "glossa/layers/flops.h"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>

#include "glossa/layers/gpipe.h"

namespace glossa {
namespace {

std::map<std::string, DeclaredFlopsFn>& Declared() {
  static auto* m = new std::map<std::string, DeclaredFlopsFn>();
  return *m;
}
std::mutex& DeclaredMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

}  // namespace

bool RegisterDeclaredFlops(const std::string& cls_key, DeclaredFlopsFn fn) {
  std::lock_guard<std::mutex> lock(DeclaredMutex());
  Declared()[cls_key] = std::move(fn);
  return true;
}

std::optional<double> DeclaredFlopsPerToken(const Params& p) {
  if (!p.Contains("cls")) return std::nullopt;
  DeclaredFlopsFn fn;
  {
    std::lock_guard<std::mutex> lock(DeclaredMutex());
    const auto it = Declared().find(p.ClsKey());
    if (it == Declared().end()) return std::nullopt;
    fn = it->second;
  }
  return fn(p);
}

std::vector<int64_t> BalancedStageEnds(const std::vector<double>& costs, int64_t stages,
                                       double first_extra, double last_extra) {
  const int64_t n = static_cast<int64_t>(costs.size());
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // Stage s holding cells [a, b).
  auto cost = [&](int64_t s, int64_t a, int64_t b) {
    return prefix[b] - prefix[a] + (s == 0 ? first_extra : 0) +
           (s == stages - 1 ? last_extra : 0);
  };
  // best[s][e]: the least costliest stage of cells [0, e) in s stages.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s) {
    for (int64_t e = s; e <= n; ++e) {
      for (int64_t a = s - 1; a < e; ++a) {
        best[s][e] = std::min(best[s][e], std::max(best[s - 1][a], cost(s - 1, a, e)));
      }
    }
  }
  const double bound = best[stages][n] * (1 + 1e-9);
  std::vector<int64_t> ends = EvenStageEnds(n, stages);
  double even = 0;
  for (int64_t s = 0, a = 0; s < stages; a = ends[s++]) even = std::max(even, cost(s, a, ends[s]));
  if (even <= bound) return ends;
  // Front to back: each stage takes the most cells it can within the bound, leaving one for each
  // stage after it (a cheapest split exists, so the rest fits).
  ends.clear();
  int64_t a = 0;
  for (int64_t s = 0; s + 1 < stages; ++s) {
    int64_t e = a + 1;
    while (e < n - (stages - s - 1) && cost(s, a, e + 1) <= bound) ++e;
    ends.push_back(e);
    a = e;
  }
  ends.push_back(n);
  return ends;
}

std::vector<int64_t> StageEndsOf(const std::string& where, const ParamValue& splits,
                                 const std::vector<Params>& cells,
                                 std::pair<double, double> end_flops) {
  const std::vector<int64_t> given =
      StageEndsFromSplits(where, splits, static_cast<int64_t>(cells.size()));
  if (splits.is_list() || given.size() == 1) return given;
  std::vector<double> costs;
  for (const Params& c : cells) {
    const std::optional<double> f = DeclaredFlopsPerToken(c);
    if (!f || !(*f > 0)) return given;
    costs.push_back(*f);
  }
  return BalancedStageEnds(costs, static_cast<int64_t>(given.size()), end_flops.first,
                           end_flops.second);
}

}  // namespace glossa
