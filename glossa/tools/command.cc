#include "glossa/tools/command.h"

#include <algorithm>
#include <utility>

namespace glossa {
namespace cli {
namespace {

struct Entry {
  int order;
  std::function<std::unique_ptr<Command>()> make;
};

std::vector<Entry>& Registry() {
  static auto* entries = new std::vector<Entry>();
  return *entries;
}

}  // namespace

bool RegisterCommand(int order, std::function<std::unique_ptr<Command>()> make) {
  Registry().push_back({order, std::move(make)});
  return true;
}

std::vector<std::unique_ptr<Command>> MakeCommands() {
  std::vector<Entry> entries = Registry();
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.order < b.order; });
  std::vector<std::unique_ptr<Command>> out;
  for (const auto& e : entries) out.push_back(e.make());
  return out;
}

}  // namespace cli
}  // namespace glossa
