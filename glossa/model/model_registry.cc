#include "glossa/model/model_registry.h"

#include <algorithm>
#include <mutex>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"

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
  if (!override_file.empty()) {
    try {
      p.FromText(ReadFileToString(override_file, 64 << 20));
    } catch (const Error& e) {
      ThrowError(e.code(), StrCat(override_file, ": ", e.message()));
    }
  }
  return p;
}

Params ModelParamsBase::Task() const {
  throw UnimplementedError("this model class defines neither Task() nor MultiTaskModelParams()");
}

}  // namespace glossa
