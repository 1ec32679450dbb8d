#include "glossa/core/registry.h"

#include <cxxabi.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <regex>
#include <unordered_map>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/params.h"

namespace glossa {
namespace {

struct State {
  std::mutex mu;
  std::map<std::string, ClassRegistry::Entry> entries;  // sorted keys
  std::unordered_map<std::type_index, std::string> keys_by_type;
};

State& GetState() {
  static State* state = new State;  // never destroyed: used during static init and exit
  return *state;
}

std::string LastComponent(std::string_view key) {
  size_t dot = key.rfind('.');
  return std::string(dot == std::string_view::npos ? key : key.substr(dot + 1));
}

// Registry keys share long module prefixes, so Lingvo's trigram rule is applied to the class names
// (the last component); without near names every key is listed.
std::string NearKeysMessage(std::string_view key, const State& s) {
  std::vector<std::string> keys, near;
  for (const auto& [k, v] : s.entries) {
    keys.push_back(k);
    if (!SimilarKeys(LastComponent(key), {LastComponent(k)}).empty()) near.push_back(k);
  }
  if (!near.empty()) return StrCat(key, " (did you mean: [", Join(near, ","), "])");
  std::vector<std::string> quoted;
  for (const auto& k : keys) quoted.push_back(PyStrRepr(k));
  return StrCat(key, " (keys are [", Join(quoted, ", "), "])");
}

}  // namespace

std::string Demangle(const char* mangled_name) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled_name, nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) return mangled_name;
  std::string out(demangled);
  std::free(demangled);
  return out;
}

void ClassRegistry::Register(Entry entry) {
  static const std::regex kKey(R"([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+)");
  if (!std::regex_match(entry.key, kKey)) {
    throw InvalidArgumentError(StrCat("invalid class registry key '", entry.key,
                                      "': expected <module>.<Name>, e.g. 'glossa.layers.Linear'"));
  }
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.entries.find(entry.key);
  if (it != s.entries.end()) {
    throw InvalidArgumentError(StrCat("class registry key '", entry.key,
                                      "' is already registered (by ", it->second.type_name,
                                      "); cannot register ", entry.type_name));
  }
  s.keys_by_type.emplace(entry.type, entry.key);
  std::string key = entry.key;
  s.entries.emplace(std::move(key), std::move(entry));
}

const ClassRegistry::Entry& ClassRegistry::Get(std::string_view key) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.entries.find(std::string(key));
  if (it == s.entries.end()) {
    throw NotFoundError(StrCat("unregistered class ", NearKeysMessage(key, s)));
  }
  return it->second;  // entries are never removed, so the reference stays valid
}

bool ClassRegistry::Contains(std::string_view key) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.entries.count(std::string(key)) > 0;
}

std::vector<std::string> ClassRegistry::Keys() {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<std::string> keys;
  for (const auto& [k, v] : s.entries) keys.push_back(k);
  return keys;
}

std::string ClassRegistry::KeyOfType(const std::type_index& type) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.keys_by_type.find(type);
  if (it == s.keys_by_type.end()) {
    throw NotFoundError(
        StrCat("class ", Demangle(type.name()), " is not registered (GLOSSA_REGISTER_CLASS)"));
  }
  return it->second;
}

void ClassRegistry::NotDerivedError(const Entry& entry, const std::type_info& base) {
  throw InvalidArgumentError(StrCat("class '", entry.key, "' (", entry.type_name,
                                    ") does not derive from ", Demangle(base.name())));
}

}  // namespace glossa
