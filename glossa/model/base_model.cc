#include "glossa/model/base_model.h"
#include "glossa/model/params_passes.h"

#include <algorithm>
#include <random>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {

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
  ml.Define("max_steps_to_train", nullptr,
            "Stop with run_stop status abort once a run starts at or past this step "
            "(None: task.train.max_steps).");
  ml.Define("global_batch_size", nullptr,
            "Logged as global_batch_size (None: the training input's global batch size).");
  ml.Define("max_sequence_length", nullptr,
            "Logged as max_sequence_length with {method: discard} (None: not logged).");
  ml.Define("optimizer_name", nullptr,
            "Logged as opt_name (None: the learner's optimizer, e.g. adam).");
  ml.Define("base_learning_rate", nullptr,
            "Logged as opt_base_learning_rate (None: the learner's learning_rate).");
  ml.Define("warmup_steps", nullptr, "Logged as opt_learning_rate_warmup_steps (None: 0).");
  ml.Define("train_samples", nullptr, "Logged as train_samples (None: not logged).");
  ml.Define("eval_samples", nullptr, "Logged as eval_samples (None: not logged).");
  p.Define("ml_perf", ml, "MLPerf logging (Lingvo's TrainAndDecodeProgram).");
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
  task_ = &CreateChildAs<BaseTask>("task", params().GetParams("task"));
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
  for (const auto& name : names_) {
    tasks_.push_back(&CreateChildAs<BaseTask>(name, tasks.GetParams(name)));
    if (name == main_task_) main_ = tasks_.back();
  }
}

BaseTask& MultiTaskModel::GetTask(const std::string& name) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  if (it == names_.end()) {
    throw NotFoundError(StrCat("model '", path(), "': no task ", KeyErrorString(name, names_)));
  }
  return *tasks_[static_cast<size_t>(it - names_.begin())];
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
    if (u < acc && probs_[i] > 0) return *tasks_[i];
  }
  for (size_t i = names_.size(); i-- > 0;) {
    if (probs_[i] > 0) return *tasks_[i];
  }
  return task();
}

GLOSSA_REGISTER_CLASS(SingleTaskModel, "glossa.model.SingleTaskModel");
GLOSSA_REGISTER_CLASS(MultiTaskModel, "glossa.model.MultiTaskModel");

std::string EvalTaskParamsPath(const BaseModel& model) { return MainTaskPath(model.params()); }

}  // namespace glossa
