#include "glossa/model/model_registry.h"

#include <algorithm>
#include <mutex>
#include <random>

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
  p.Set("name", key.substr(0, key.find('.')));
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

glossa::Params BaseModel::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("name", "model");
  p.Define("program_schedule", SimpleProgramScheduleParams(), "The executor's program schedule.");
  return p;
}

glossa::Params SingleTaskModel::Params() {
  glossa::Params p = BaseModel::Params();
  p.Set("cls", ClsOf<SingleTaskModel>());
  p.Define("task", nullptr, "The task's Params.");
  return p;
}

SingleTaskModel::SingleTaskModel(const glossa::Params& p) : BaseModel(p) {
  if (!params().IsSet("task"))
    throw InvalidArgumentError(StrCat("model '", path(), "': task is not set"));
  CreateChild("task", params().GetParams("task"));
}

glossa::Params MultiTaskModel::Params() {
  glossa::Params p = BaseModel::Params();
  p.Set("cls", ClsOf<MultiTaskModel>());
  p.Define("task_params", glossa::Params(), "Task name -> the task's Params.");
  p.Define("task_probs", glossa::Params(), "Task name -> sampling weight (normalized).");
  p.Define("main_task", "", "The task eval and decode run; empty: the first task name.");
  return p;
}

MultiTaskModel::MultiTaskModel(const glossa::Params& p) : BaseModel(p) {
  const glossa::Params& tasks = p.GetParams("task_params");
  const glossa::Params& probs = p.GetParams("task_probs");
  double total = 0;
  for (const auto& e : tasks) {
    names_.push_back(e.name);
    if (!probs.Contains(e.name)) {
      throw InvalidArgumentError(
          StrCat("model '", path(), "': task_probs has no weight for task '", e.name, "'"));
    }
    const double w = probs.GetFloat(e.name);
    if (!(w >= 0))
      throw InvalidArgumentError(
          StrCat("model '", path(), "': task_probs.", e.name, " must be >= 0"));
    probs_.push_back(w);
    total += w;
  }
  for (const auto& e : probs) {
    if (!tasks.Contains(e.name)) {
      throw InvalidArgumentError(StrCat("model '", path(), "': task_probs names unknown task ",
                                        KeyErrorString(e.name, names_)));
    }
  }
  if (names_.empty())
    throw InvalidArgumentError(StrCat("model '", path(), "': task_params is empty"));
  if (!(total > 0)) throw InvalidArgumentError(StrCat("model '", path(), "': task_probs sum to 0"));
  for (double& w : probs_) w /= total;
  main_task_ = p.GetString("main_task").empty() ? names_.front() : p.GetString("main_task");
  if (std::find(names_.begin(), names_.end(), main_task_) == names_.end()) {
    throw InvalidArgumentError(
        StrCat("model '", path(), "': main_task ", KeyErrorString(main_task_, names_)));
  }
  seed_ = p.IsSet("random_seed") ? static_cast<uint64_t>(p.GetInt("random_seed")) : 0;
  for (const auto& name : names_) CreateChild(name, tasks.GetParams(name));
}

BaseTask& MultiTaskModel::GetTask(const std::string& name) const {
  if (std::find(names_.begin(), names_.end(), name) == names_.end()) {
    throw NotFoundError(StrCat("model '", path(), "': no task ", KeyErrorString(name, names_)));
  }
  return GetChildAs<BaseTask>(name);
}

BaseTask& MultiTaskModel::SampleTask(int64_t global_step) const {
  // A uniform draw keyed by (random_seed, step): the same task at the same step in every run,
  // resumed or not.
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                    static_cast<uint32_t>(global_step),
                    static_cast<uint32_t>(static_cast<uint64_t>(global_step) >> 32)};
  std::mt19937_64 rng(seq);
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  double acc = 0;
  for (size_t i = 0; i < names_.size(); ++i) {
    acc += probs_[i];
    if (u < acc && probs_[i] > 0) return GetChildAs<BaseTask>(names_[i]);
  }
  for (size_t i = names_.size(); i-- > 0;) {
    if (probs_[i] > 0) return GetChildAs<BaseTask>(names_[i]);
  }
  return task();
}

Params ModelParamsBase::Task() const {
  throw UnimplementedError("this model class defines neither Task() nor MultiTaskModelParams()");
}

GLOSSA_REGISTER_CLASS(SingleTaskModel, "glossa.model.SingleTaskModel");
GLOSSA_REGISTER_CLASS(MultiTaskModel, "glossa.model.MultiTaskModel");

}  // namespace glossa
