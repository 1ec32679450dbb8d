// The model registry: experiment configurations registered under "<task>.<module>.<Class>" (e.g.
// "lm.austen.TransformerLmTiny"), each giving its task Params and its datasets' input Params.
// GetModelParams builds a SingleTaskModel's Params for one dataset and applies
// --model_params_override / --model_params_file_override text.
//
//   class TransformerLmTiny : public ModelParamsBase {
//     Params Task() const override;
//     std::map<std::string, std::function<Params()>> Datasets() const override;  // Train, Dev, ...
//   };
//   GLOSSA_REGISTER_MODEL(TransformerLmTiny, "lm.austen.TransformerLmTiny");
//   Params p = GetModelParams("lm.austen.TransformerLmTiny", "Train", "task.train.max_steps : 10");
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "glossa/core/params.h"
#include "glossa/layers/base_layer.h"
#include "glossa/model/base_task.h"

namespace glossa {

class ModelParamsBase {
 public:
  virtual ~ModelParamsBase() = default;
  // The task's Params (without input). Multi-task models override MultiTaskModelParams instead.
  virtual Params Task() const;
  // Multi-task models: MultiTaskModel Params (task_params without inputs, task_probs); their
  // datasets return Params with one input per task name.
  virtual std::optional<Params> MultiTaskModelParams() const { return std::nullopt; }
  // The executor's program schedule (SimpleProgramSchedule Params); by default train only.
  virtual Params ProgramSchedule() const;
  // Dataset name -> its input generator Params.
  virtual std::map<std::string, std::function<Params()>> Datasets() const = 0;
};

using ModelParamsFactory = std::function<std::unique_ptr<ModelParamsBase>()>;
// InvalidArgument for a malformed (fewer than three dotted parts) or duplicate key.
void RegisterModel(const std::string& key, ModelParamsFactory factory);
std::vector<std::string> ModelKeys();
// NotFound (with near names) for unknown models.
std::unique_ptr<ModelParamsBase> GetModelParamsClass(const std::string& key);

// Lingvo's SimpleProgramSchedule: after every train_executions_per_eval train loops, an eval
// program (eval_steps_per_loop batches; -1: until OutOfRange; 0: none) and a decode program
// (decode_steps_per_loop) on each of eval_dataset_names, in the trainer. With ml_perf.enabled the
// run is Lingvo's TrainAndDecode: MLPerf ":::MLLOG {json}" lines (run_start, block_start,
// eval_accuracy, block_stop, run_stop) and a stop once ml_perf.decoder_metric_name reaches
// ml_perf.decoder_metric_success_threshold.
Params SimpleProgramScheduleParams();

// SingleTaskModel Params for `key` with task.input from `dataset`, then the overrides:
// `override_text` ("key : value" lines separated by newlines or ';') or the file
// `override_file` (both given: InvalidArgument). Unknown dataset: NotFound with near names.
Params GetModelParams(const std::string& key, const std::string& dataset,
                      const std::string& override_text = "", const std::string& override_file = "");

// What the programs and the executor run: one or more tasks. Single-task models have exactly one;
// a MultiTaskModel samples the task each training step trains, and evaluates and decodes its
// main task.
class BaseModel : public BaseLayer {
 public:
  // + program_schedule.
  static glossa::Params Params();
  explicit BaseModel(const glossa::Params& p) : BaseLayer(p) {}
  // The task eval and decode programs run (the only task, or a MultiTaskModel's main_task).
  virtual BaseTask& task() const = 0;
  // Task names and tasks, in a fixed order.
  virtual std::vector<std::string> task_names() const = 0;
  virtual BaseTask& GetTask(const std::string& name) const = 0;
  // The task trained at `global_step` (deterministic in the step and the model's random_seed).
  virtual BaseTask& SampleTask(int64_t global_step) const {
    (void)global_step;
    return task();
  }
  bool is_multi_task() const { return task_names().size() > 1; }
};

// A model with one task (Lingvo's SingleTaskModel): the task is child "task".
class SingleTaskModel : public BaseModel {
 public:
  // + task.
  static glossa::Params Params();
  explicit SingleTaskModel(const glossa::Params& p);
  BaseTask& task() const override { return GetChildAs<BaseTask>("task"); }
  std::vector<std::string> task_names() const override { return {"task"}; }
  BaseTask& GetTask(const std::string& name) const override { return GetChildAs<BaseTask>(name); }
};

// Lingvo's MultiTaskModel: tasks from task_params (name -> task Params), each a child under its
// name with its own input and learner; each step trains one task sampled with probabilities
// task_probs (name -> weight, normalized; Lingvo's ConstantScheduler). Learner slots are saved
// under "<task>/" prefixes. Eval and decode run main_task (default: the first name).
class MultiTaskModel : public BaseModel {
 public:
  // + task_params, task_probs, main_task.
  static glossa::Params Params();
  explicit MultiTaskModel(const glossa::Params& p);
  BaseTask& task() const override { return GetChildAs<BaseTask>(main_task_); }
  std::vector<std::string> task_names() const override { return names_; }
  BaseTask& GetTask(const std::string& name) const override;
  BaseTask& SampleTask(int64_t global_step) const override;
  const std::vector<double>& probs() const { return probs_; }

 private:
  std::vector<std::string> names_;
  std::vector<double> probs_;  // normalized, in names_ order
  std::string main_task_;
  uint64_t seed_ = 0;
};

#define GLOSSA_MODEL_CONCAT_INNER(a, b) a##b
#define GLOSSA_MODEL_CONCAT(a, b) GLOSSA_MODEL_CONCAT_INNER(a, b)
#define GLOSSA_REGISTER_MODEL(Class, key)                                                   \
  [[maybe_unused]] static const bool GLOSSA_MODEL_CONCAT(glossa_model_, __COUNTER__) = [] { \
    ::glossa::RegisterModel(key, [] { return std::make_unique<Class>(); });                 \
    return true;                                                                            \
  }()

}  // namespace glossa
