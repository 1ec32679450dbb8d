#include "glossa/checkpoint/trained_params.h"

#include <map>
#include <utility>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"

namespace glossa {

namespace {

bool IsKeyStart(std::string_view line) {
  const size_t sep = line.find(" : ");
  if (sep == std::string_view::npos || sep == 0) return false;
  for (char c : line.substr(0, sep)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '[' || c == ']';
    if (!ok) return false;
  }
  return true;
}

// "key : value" lines by key; the continuation lines of a multi-line string stay with its key.
std::map<std::string, std::string> TextLines(const std::string& text) {
  std::map<std::string, std::string> out;
  std::string key;
  for (const auto& line : Split(text, '\n')) {
    if (IsKeyStart(line)) {
      key = std::string(line.substr(0, line.find(" : ")));
      out[key] = std::string(line);
    } else if (!key.empty() && !line.empty()) {
      out[key] += "\n" + std::string(line);
    }
  }
  return out;
}

std::string ValueOf(const std::string& line) { return line.substr(line.find(" : ") + 3); }

bool Covers(const std::string& override_key, const std::string& key) {
  if (key == override_key) return true;
  return key.size() > override_key.size() && key.compare(0, override_key.size(), override_key) == 0 &&
         (key[override_key.size()] == '.' || key[override_key.size()] == '[');
}

}  // namespace

std::vector<std::string> OverrideKeys(const std::string& override_text) {
  std::vector<std::string> keys;
  for (const auto& raw : Split(override_text, '\n')) {
    const std::string_view line = Strip(raw);
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    keys.emplace_back(Strip(line.substr(0, colon)));
  }
  return keys;
}

bool IsTokenizerKey(const std::string& key) {
  bool input = false;
  for (const auto& raw : Split(key, '.')) {
    std::string part(raw);
    const size_t bracket = part.find('[');
    if (bracket != std::string::npos) part.resize(bracket);
    if (input && part.rfind("tokenizer", 0) == 0) return true;
    input = part == "input";
  }
  return false;
}

bool IsRunSettingKey(const std::string& key) {
  if (key.rfind("program_schedule", 0) == 0) return true;
  if (IsTokenizerKey(key)) return false;             // the ids the model was trained on
  if (key.rfind("datasets.", 0) == 0) return false;  // the run's data: datasets.train, ...

  for (const auto& raw : Split(key, '.')) {
    std::string part(raw);
    const size_t bracket = part.find('[');
    if (bracket != std::string::npos) part.resize(bracket);
    if (part == "input" || part == "train" || part == "eval") return true;
  }
  const size_t dot = key.rfind('.');
  return key.substr(dot == std::string::npos ? 0 : dot + 1) == "random_seed";
}

std::vector<std::string> ApplyTrainedParams(Params& p, const std::string& logdir,
                                            const std::vector<std::string>& override_keys,
                                            bool allow_change) {
  const std::string path = JoinPath(JoinPath(logdir, "control"), "params.txt");
  if (!FileExists(path)) return {};
  const std::map<std::string, std::string> trained = TextLines(ReadFileToString(path, 64 << 20));
  const std::map<std::string, std::string> given = TextLines(p.ToText());
  std::vector<std::string> taken, kept, refused, data;
  std::string apply;
  for (const auto& [key, line] : trained) {
    if (IsRunSettingKey(key)) continue;
    auto it = given.find(key);
    // The data the run's datasets read: a job reads the same unless its overrides say otherwise
    // (a new test set is not a change of the model).
    if (key.rfind("datasets.", 0) == 0) {
      bool overridden = false;
      for (const auto& o : override_keys) overridden = overridden || Covers(o, key);
      if (it != given.end() && it->second != line && !overridden) {
        data.push_back(StrCat("  ", key, ": ", ValueOf(line)));
        apply += line + "\n";
      }
      continue;
    }
    if (it == given.end()) {
      throw InvalidArgumentError(StrCat(
          path, ": the run was trained with '", key,
          "', which the model's Params no longer have (the model changed since the run?)"));
    }
    if (it->second == line) continue;
    bool overridden = false;
    for (const auto& o : override_keys) overridden = overridden || Covers(o, key);
    const std::string change =
        StrCat("  ", key, ": trained ", ValueOf(line), ", given ", ValueOf(it->second));
    if (!overridden) {
      taken.push_back(change);
      apply += line + "\n";
    } else if (allow_change) {
      kept.push_back(change);
    } else {
      refused.push_back(change);
    }
  }
  if (!refused.empty()) {
    throw InvalidArgumentError(StrCat(
        "the overrides change ", refused.size(), " key(s) of the model the run in ", logdir,
        " was trained with (", path, "):\n", Join(refused, "\n"),
        "\nthe model is read from the run: drop these overrides, or pass --allow_params_change "
        "to apply them anyway"));
  }
  std::vector<std::string> notes;
  if (!apply.empty()) {
    try {
      p.FromText(apply);
    } catch (const Error& e) {
      ThrowError(e.code(), StrCat(path, ": ", e.message()));
    }
  }
  if (!data.empty()) {
    notes.push_back(
        StrCat("reading the data the run was trained with (", path, "):\n", Join(data, "\n")));
  }
  if (!taken.empty()) {
    notes.push_back(StrCat("using the model Params the run was trained with (", path, "); ",
                           taken.size(), " key(s) differ from the registered model's:\n",
                           Join(taken, "\n")));
  }
  if (!kept.empty()) {
    notes.push_back(StrCat("--allow_params_change: ", kept.size(),
                           " key(s) differ from the Params the run was trained with (", path,
                           "):\n", Join(kept, "\n")));
  }
  return notes;
}

}  // namespace glossa
