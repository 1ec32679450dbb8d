#include "glossa/model/model_registry.h"

#include <algorithm>
#include <cctype>
#include <mutex>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/model/datasets.h"

namespace glossa {
namespace {

std::mutex& Mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<std::string, ModelParamsFactory>& Models() {
  static auto* m = new std::map<std::string, ModelParamsFactory>;
  return *m;
}

std::string NearNames(const std::string& name, const std::vector<std::string>& keys) {
  std::vector<std::string> near;
  const std::string last = name.substr(name.rfind('.') + 1);
  for (const auto& k : keys) {
    if (!SimilarKeys(last, {k.substr(k.rfind('.') + 1)}).empty()) near.push_back(k);
  }
  if (!near.empty()) return StrCat(name, " (did you mean: [", Join(near, ","), "])");
  return KeyErrorString(name, keys);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The Params key of a dataset's data: datasets.<its name lower-cased>.
std::string DataKey(const std::string& dataset) { return StrCat("datasets.", Lower(dataset)); }

// The keys "key : value" override lines set.
std::vector<std::string> KeysOf(const std::string& text) {
  std::vector<std::string> keys;
  for (const auto& raw : Split(text, '\n')) {
    const std::string_view line = Strip(raw);
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos) keys.emplace_back(Strip(line.substr(0, colon)));
  }
  return keys;
}

// Each registered dataset's file_pattern (the datasets whose input has a string one; a dataset
// whose Params cannot be made here, its data missing, say, is left out), in `datasets` order.
std::vector<std::pair<std::string, std::string>> RegisteredDataFiles(
    const std::map<std::string, std::function<Params()>>& datasets, const std::string& dataset,
    const Params& input) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, make] : datasets) {
    // A Params name: the dataset's name lower-cased (Dev: datasets.dev), as its eval_dev/.
    const std::string lower = Lower(name);
    bool ok = !lower.empty() && !std::isdigit(static_cast<unsigned char>(lower[0]));
    for (char c : lower)
      ok = ok && (std::islower(static_cast<unsigned char>(c)) ||
                  std::isdigit(static_cast<unsigned char>(c)) || c == '_');
    if (!ok) continue;
    Params in;
    try {
      in = name == dataset ? input : make();
    } catch (const Error&) {
      continue;
    }
    if (!in.Contains("file_pattern")) continue;
    const ParamValue& v = in.Get("file_pattern");
    if (v.kind() == ParamValue::Kind::kString) out.emplace_back(name, v.AsString());
    if (v.kind() == ParamValue::Kind::kNone) out.emplace_back(name, "");
  }
  return out;
}

// Train reads other data than the registered Train while a dataset no override named still reads
// its registered data: which data is that dataset meant to be? Refused, with the override that
// says it for every dataset.
void RefuseMixedData(const std::string& key, const Params& p,
                     const std::vector<std::pair<std::string, std::string>>& registered,
                     const std::vector<std::string>& override_keys) {
  std::map<std::string, std::string> reg(registered.begin(), registered.end());
  if (!reg.count("Train") || !p.GetParams("datasets").Contains(Lower("Train"))) return;
  const std::string train = p.GetString(DataKey("Train"));
  if (train == reg.at("Train") || reg.at("Train").empty()) return;
  std::vector<std::string> stale, fix;
  for (const auto& [name, pattern] : registered) {
    const std::string now = p.GetString(DataKey(name));
    fix.push_back(StrCat(DataKey(name), " : '", name == "Train" ? train : now, "'"));
    if (name == "Train" || pattern.empty()) continue;
    if (now == pattern && !OverridesCover(override_keys, DataKey(name))) {
      stale.push_back(StrCat(name, " ('", pattern, "')"));
    }
  }
  if (stale.empty()) return;
  throw InvalidArgumentError(StrCat(
      "Train reads '", train, "', not ", key, "'s registered '", reg.at("Train"), "', but ",
      Join(stale, " and "),
      " would still read the registered data: a run trained on your data would be evaluated on "
      "another corpus. Say what each dataset reads (your files in place of the registered ones; "
      "'' for none): --model_params_override=\"",
      Join(fix, "; "), "\""));
}

}  // namespace

void RegisterModel(const std::string& key, ModelParamsFactory factory) {
  // Python model configurations (python/glossa) register as "py:<module>.<Class>"; a module
  // imported again replaces its classes.
  const bool python = key.rfind("py:", 0) == 0;
  if (Split(key, '.').size() < (python ? 2u : 3u)) {
    throw InvalidArgumentError(StrCat("model key '", key, "' must be ",
                                      python ? "py:<module>.<Class>" : "<task>.<module>.<Class>"));
  }
  std::lock_guard<std::mutex> lock(Mu());
  if (Models().count(key) && !python)
    throw InvalidArgumentError(StrCat("model '", key, "' is already registered"));
  Models()[key] = std::move(factory);
}

std::vector<std::string> ModelKeys() {
  std::lock_guard<std::mutex> lock(Mu());
  std::vector<std::string> keys;
  for (const auto& [k, v] : Models()) keys.push_back(k);
  return keys;
}

std::unique_ptr<ModelParamsBase> GetModelParamsClass(const std::string& key) {
  ModelParamsFactory factory;
  {
    std::lock_guard<std::mutex> lock(Mu());
    auto it = Models().find(key);
    if (it != Models().end()) factory = it->second;
  }
  if (!factory) throw NotFoundError(StrCat("unknown model ", NearNames(key, ModelKeys())));
  return factory();
}

Params ModelParamsBase::ProgramSchedule() const { return SimpleProgramScheduleParams(); }

void SelectModelTask(Params& p, const std::string& task, bool training) {
  if (!p.Contains("task_params")) {
    throw InvalidArgumentError(StrCat("--model_task_name is for multi-task models; this model ('",
                                      p.GetString("name"), "') has a single task"));
  }
  const std::vector<std::string> names = p.GetParams("task_params").Keys();
  if (std::find(names.begin(), names.end(), task) == names.end()) {
    throw NotFoundError(StrCat("--model_task_name '", task, "': the model has tasks [",
                               Join(names, ", "), "]"));
  }
  p.Set("main_task", task);
  if (training) {
    for (const auto& name : names) p.Set(StrCat("task_probs.", name), name == task ? 1.0 : 0.0);
  }
}

std::string OverrideLines(const std::string& text) {
  std::string out = text;
  char quote = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (quote != 0) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == ';') {
      out[i] = '\n';
    } else if (c == '\n') {
      quote = 0;
    }
  }
  return out;
}

Params GetModelParams(const std::string& key, const std::string& dataset,
                      const std::string& override_text, const std::string& override_file) {
  if (!override_text.empty() && !override_file.empty()) {
    throw InvalidArgumentError(
        "give --model_params_override or --model_params_file_override, not both");
  }
  auto model = GetModelParamsClass(key);
  const auto datasets = model->Datasets();
  auto it = datasets.find(dataset);
  if (it == datasets.end()) {
    std::vector<std::string> names;
    for (const auto& [k, v] : datasets) names.push_back(k);
    throw NotFoundError(StrCat("model ", key, " has no dataset ", KeyErrorString(dataset, names)));
  }
  Params p;
  std::vector<std::pair<std::string, std::string>> registered;
  if (auto multi = model->MultiTaskModelParams()) {
    p = *multi;
    const Params inputs = it->second();
    for (const auto& e : p.GetParams("task_params")) {
      if (!inputs.Contains(e.name)) {
        throw InvalidArgumentError(
            StrCat("model ", key, ": dataset ", dataset, " has no input for task '", e.name, "'"));
      }
      p.Set(StrCat("task_params.", e.name, ".input"), inputs.GetParams(e.name));
    }
  } else {
    Params task = model->Task();
    task.Set("input", it->second());
    p = SingleTaskModel::Params();
    p.Set("task", task);
    registered = RegisteredDataFiles(datasets, dataset, task.GetParams("input"));
    if (!registered.empty()) {
      Params files;
      for (const auto& [name, pattern] : registered) {
        files.Define(Lower(name), pattern,
                     StrCat("The data dataset ", name, " reads (its input's file_pattern)."));
      }
      p.Define("datasets", files,
               "The data each dataset reads: task.input.file_pattern of a job on that dataset.");
    }
  }
  // "lm" for lm.austen.X; "mymodels" for py:mymodels.X.
  const std::string bare = key.rfind("py:", 0) == 0 ? key.substr(3) : key;
  p.Set("name", bare.substr(0, bare.find('.')));
  p.Set("program_schedule", model->ProgramSchedule());
  if (!override_text.empty()) {
    try {
      p.FromText(OverrideLines(override_text));
    } catch (const Error& e) {
      ThrowError(e.code(), StrCat("--model_params_override: ", e.message()));
    }
  }
  std::string override_keys_text = OverrideLines(override_text);
  if (!override_file.empty()) {
    std::string text;
    try {
      text = ReadFileToString(override_file, 64 << 20);
      p.FromText(text);
    } catch (const Error& e) {
      ThrowError(e.code(), StrCat(override_file, ": ", e.message()));
    }
    override_keys_text += "\n" + text;
  }
  if (!registered.empty()) {
    const std::vector<std::string> keys = KeysOf(override_keys_text);
    ResolveDatasetInput(p, dataset, keys, /*require=*/false);
  }
  return p;
}

void RefuseTrainingOnMixedData(const std::string& model_key, const Params& p,
                               const std::vector<std::string>& override_keys) {
  if (!p.Contains("datasets")) return;
  std::vector<std::pair<std::string, std::string>> registered;
  const Params reg = GetModelParams(model_key, "Train");
  if (!reg.Contains("datasets")) return;
  const auto model = GetModelParamsClass(model_key);
  for (const auto& entry : model->Datasets()) {
    const std::string& name = entry.first;
    if (reg.GetParams("datasets").Contains(Lower(name))) {
      registered.emplace_back(name, reg.GetString(DataKey(name)));
    }
  }
  RefuseMixedData(model_key, p, registered, override_keys);
}

bool OverridesCover(const std::vector<std::string>& override_keys, const std::string& key) {
  for (const auto& o : override_keys) {
    if (key == o || (key.size() > o.size() && key.compare(0, o.size(), o) == 0 &&
                     (key[o.size()] == '.' || key[o.size()] == '['))) {
      return true;
    }
  }
  return false;
}

void ResolveDatasetInput(Params& p, const std::string& dataset,
                         const std::vector<std::string>& override_keys, bool require) {
  if (!p.Contains("datasets") || !p.GetParams("datasets").Contains(Lower(dataset))) return;
  // Packing is for training: Dev and Test are read a sequence a row (decoding needs them so).
  if (Lower(dataset) != "train" && p.Contains("task") && p.Get("task").is_params() &&
      p.GetParams("task").Contains("input") && p.Get("task.input").is_params() &&
      p.GetParams("task.input").Contains("packed_input")) {
    p.Set("task.input.packed_input", false);
  }
  const std::string key = DataKey(dataset);
  if (OverridesCover(override_keys, "task.input.file_pattern")) {
    p.Set(key, p.GetString("task.input.file_pattern"));
    return;
  }
  const std::string pattern = p.Get(key).is_none() ? std::string() : p.GetString(key);
  if (pattern.empty() && !require) {
    p.Set("task.input.file_pattern", "");
    return;
  }
  if (pattern.empty()) {
    std::string lower = dataset;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    throw InvalidArgumentError(
        StrCat("dataset ", dataset, " reads no data: ", key,
               " is unset; say what it reads, e.g. --model_params_override=\"", key,
               " : 'text:/path/to/", lower, ".txt'\""));
  }
  p.Set("task.input.file_pattern", pattern);
}

Params ModelParamsBase::Task() const {
  throw UnimplementedError("this model class defines neither Task() nor MultiTaskModelParams()");
}

}  // namespace glossa
