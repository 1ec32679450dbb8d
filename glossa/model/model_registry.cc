#include "glossa/model/model_registry.h"

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
  if (Split(key, '.').size() < 3) {
    throw InvalidArgumentError(StrCat("model key '", key, "' must be <task>.<module>.<Class>"));
  }
  std::lock_guard<std::mutex> lock(Mu());
  if (Models().count(key))
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

Params SimpleProgramScheduleParams() {
  Params p;
  p.Define("train_executions_per_eval", 1,
           "Train loops between runs of the eval and decode programs.");
  p.Define("eval_dataset_names", ParamValue::List{},
           "Datasets evaluated/decoded in the trainer, e.g. ['Dev'].");
  p.Define("eval_steps_per_loop", 0,
           "Eval batches per eval program; -1: until OutOfRange; 0: no eval.");
  p.Define("decode_steps_per_loop", 0,
           "Decode batches per decode program; -1: until OutOfRange; 0: no decode.");
  Params ml;
  ml.Define("enabled", false,
            "Emit MLPerf :::MLLOG lines and stop at the decoder metric threshold.");
  ml.Define("benchmark_name", "", "MLPerf benchmark name (run_start metadata).");
  ml.Define("decoder_metric_name", "", "Decoder metric reported as eval_accuracy.");
  ml.Define("decoder_metric_success_threshold", 0.0,
            "Stop with status success once the metric reaches it.");
  ml.Define("steps_per_epoch", 0,
            "Steps per epoch for epoch numbers (0: train_executions_per_eval loops).");
  p.Define("ml_perf", ml, "MLPerf logging (Lingvo's TrainAndDecodeProgram).");
  return p;
}

Params ModelParamsBase::ProgramSchedule() const { return SimpleProgramScheduleParams(); }

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
  Params task = model->Task();
  task.Set("input", it->second());
  Params p = SingleTaskModel::Params();
  p.Set("name", key.substr(0, key.find('.')));
  p.Set("task", task);
  p.Set("program_schedule", model->ProgramSchedule());
  if (!override_text.empty()) {
    std::string text = override_text;
    for (char& c : text) {
      if (c == ';') c = '\n';
    }
    try {
      p.FromText(text);
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

glossa::Params SingleTaskModel::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<SingleTaskModel>());
  p.Set("name", "model");
  p.Define("task", nullptr, "The task's Params.");
  p.Define("program_schedule", SimpleProgramScheduleParams(), "The executor's program schedule.");
  return p;
}

SingleTaskModel::SingleTaskModel(const glossa::Params& p) : BaseLayer(p) {
  if (!params().IsSet("task"))
    throw InvalidArgumentError(StrCat("model '", path(), "': task is not set"));
  CreateChild("task", params().GetParams("task"));
}

GLOSSA_REGISTER_CLASS(SingleTaskModel, "glossa.model.SingleTaskModel");

}  // namespace glossa
