// The model classes the programs and the executor run (Lingvo's base_model.py): BaseModel, with
// one task (SingleTaskModel) or several sampled per training step (MultiTaskModel), and the
// program schedule Params every model carries (run by glossa/runtime/program_schedule.h).
//
//   Params p = SingleTaskModel::Params();
//   p.Set("task", MyTask::Params());
//   std::unique_ptr<BaseModel> model = InstantiateLayer<BaseModel>(p);   // model->task()
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "glossa/core/params.h"
#include "glossa/layers/base_layer.h"
#include "glossa/model/base_task.h"

namespace glossa {

// Lingvo's SimpleProgramSchedule: after every train_executions_per_eval train loops, an eval
// program (eval_steps_per_loop batches; -1: until OutOfRange; 0: none) and a decode program
// (decode_steps_per_loop) on each of eval_dataset_names, in the trainer. With ml_perf.enabled the
// run is Lingvo's TrainAndDecode: MLPerf ":::MLLOG {json}" lines (run_start, block_start,
// eval_accuracy, block_stop, run_stop) and a stop once ml_perf.decoder_metric_name reaches
// ml_perf.decoder_metric_success_threshold.
Params SimpleProgramScheduleParams();

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
  BaseTask& task() const override { return *task_; }
  std::vector<std::string> task_names() const override { return {"task"}; }
  BaseTask& GetTask(const std::string& name) const override {
    return name == "task" ? *task_ : GetChildAs<BaseTask>(name);  // NotFound for other names
  }

 private:
  BaseTask* task_;
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
  BaseTask& task() const override { return *main_; }
  std::vector<std::string> task_names() const override { return names_; }
  BaseTask& GetTask(const std::string& name) const override;
  BaseTask& SampleTask(int64_t global_step) const override;
  const std::vector<double>& probs() const { return probs_; }
  const std::string& main_task_name() const { return main_task_; }

 private:
  std::vector<std::string> names_;
  std::vector<BaseTask*> tasks_;  // in names_ order
  BaseTask* main_ = nullptr;
  std::vector<double> probs_;  // normalized, in names_ order
  std::string main_task_;
  uint64_t seed_ = 0;
};

// Where the task eval and decode programs run sits in a model's Params: "task", or
// "task_params.<main_task>" for a MultiTaskModel. Its ".input" is what a dataset changes.
std::string EvalTaskParamsPath(const BaseModel& model);

}  // namespace glossa
