#include "glossa/runtime/program_schedule.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/io/event_file.h"
#include "glossa/runtime/program.h"

namespace glossa {
ProgramSchedule::ProgramSchedule(BaseModel& model,
                                 const std::map<std::string, Params>& dataset_params,
                                 std::string logdir, std::function<void(const std::string&)> log,
                                 std::function<double()> clock)
    : model_(model),
      sched_(model.params().GetParams("program_schedule")),
      logdir_(std::move(logdir)),
      log_(std::move(log)),
      clock_(std::move(clock)) {
  const std::string input_path = EvalTaskParamsPath(model_) + ".input";
  // A dataset gives every task its input; the programs read the eval task's. The model's Params
  // are frozen at their top level only: the tasks' are still mutable.
  auto without_inputs = [&](Params p) {
    for (const auto& name : model_.task_names()) {
      p.GetParams(model_.is_multi_task() ? StrCat("task_params.", name) : name)
          .Set("input", nullptr);
    }
    return p;
  };
  const Params trained = without_inputs(model_.params().Copy());
  for (const auto& v : sched_.Get("eval_dataset_names").AsList()) {
    const std::string ds = v.AsString();
    auto it = dataset_params.find(ds);
    if (it == dataset_params.end()) {
      throw InvalidArgumentError(StrCat("program_schedule.eval_dataset_names has '", ds,
                                        "' but the executor was given no model params for it"));
    }
    if (!it->second.IsSet(input_path)) {
      throw InvalidArgumentError(StrCat("dataset ", ds, ": its model params have no ", input_path));
    }
    input_params_[ds] = it->second.GetParams(input_path).Copy();
    // The programs run the trained tasks: a dataset may change their inputs only.
    const Params rest = without_inputs(it->second.Copy());
    if (!(rest == trained)) {
      throw InvalidArgumentError(StrCat("dataset ", ds, ": model params differ from the trained ",
                                        "model's beyond the tasks' inputs:\n",
                                        rest.TextDiff(trained)));
    }
  }
  has_programs_ = !input_params_.empty() && (sched_.GetInt("eval_steps_per_loop") != 0 ||
                                             sched_.GetInt("decode_steps_per_loop") != 0);
  ml_perf_ = sched_.GetBool("ml_perf.enabled");
  per_eval_ = std::max<int64_t>(1, sched_.GetInt("train_executions_per_eval"));
  steps_per_loop_ = std::max<int64_t>(1, model_.task().train_params().GetInt("steps_per_loop"));
  steps_per_epoch_ = sched_.GetInt("ml_perf.steps_per_epoch") > 0
                         ? sched_.GetInt("ml_perf.steps_per_epoch")
                         : per_eval_ * steps_per_loop_;
}

ProgramSchedule::~ProgramSchedule() {
  for (auto& [dir, w] : writers_) w->Close();
}

void ProgramSchedule::MlLog(const std::string& key, const std::string& event_type,
                            const std::string& value_json, const std::string& metadata_json) {
  const auto ms = static_cast<int64_t>(clock_() * 1000);
  log_(StrCat(":::MLLOG {\"namespace\": \"\", \"time_ms\": ", ms, ", \"event_type\": \"",
              event_type, "\", \"key\": \"", key, "\", \"value\": ", value_json,
              ", \"metadata\": ", metadata_json, "}"));
}

void ProgramSchedule::RunStart() {
  if (!ml_perf_) return;
  MlLog("run_start", "INTERVAL_START", "null",
        StrCat("{\"benchmark\": ",
               nlohmann::json(sched_.GetString("ml_perf.benchmark_name")).dump(), "}"));
}

void ProgramSchedule::BeforeTrainLoop(int64_t global_step) {
  if (!ml_perf_ || loops_ % per_eval_ != 0) return;
  MlLog("block_start", "INTERVAL_START", "null",
        StrCat("{\"first_epoch_num\": ", global_step / steps_per_epoch_, ", \"epoch_count\": ",
               std::max<int64_t>(1, per_eval_ * steps_per_loop_ / steps_per_epoch_), "}"));
}

bool ProgramSchedule::AfterTrainLoop(int64_t global_step, int64_t steps, bool last) {
  ++loops_;
  if (!has_programs_ || steps == 0 || (loops_ % per_eval_ != 0 && !last)) return false;
  if (ml_perf_) {
    MlLog("block_stop", "INTERVAL_END", "null",
          StrCat("{\"first_epoch_num\": ", (global_step - steps) / steps_per_epoch_, "}"));
  }
  return RunEvalPrograms(global_step, global_step / steps_per_epoch_);
}

void ProgramSchedule::RunStop(bool success) {
  if (!ml_perf_) return;
  MlLog("run_stop", "INTERVAL_END", "null",
        StrCat("{\"status\": \"", success ? "success" : "aborted", "\"}"));
}

BaseInputGenerator& ProgramSchedule::Input(const std::string& dataset) {
  auto& input = inputs_[dataset];
  if (!input) {
    // As the task would build it as its child: the task's base params flow down.
    Params p = input_params_.at(dataset).Copy();
    BaseLayer::CopyBaseParams(model_.task().params(), p);
    input = InstantiateLayer<BaseInputGenerator>(p);
  }
  return *input;
}

EventWriter& ProgramSchedule::Writer(const std::string& dir) {
  auto& w = writers_[dir];
  if (!w) w = std::make_unique<EventWriter>(dir, 10.0, clock_);
  return *w;
}

bool ProgramSchedule::RunEvalPrograms(int64_t global_step, int64_t epoch) {
  const int64_t eval_steps = sched_.GetInt("eval_steps_per_loop");
  const int64_t decode_steps = sched_.GetInt("decode_steps_per_loop");
  bool success = false;
  for (const auto& v : sched_.Get("eval_dataset_names").AsList()) {
    const std::string ds = v.AsString();
    TaskInputScope scope(model_.task(), Input(ds));
    if (eval_steps != 0) {
      EvalProgram eval(model_, &Writer(ProgramDir(JobKind::kEval, logdir_, ds)));
      std::string line;
      for (const auto& [k, m] : eval.Run(global_step, eval_steps))
        line += StrCat(", ", k, ": ", PyFloatRepr(m.first));
      log_(StrCat("eval ", ds, " step ", global_step, line));
    }
    if (decode_steps == 0) continue;
    const std::string dir = ProgramDir(JobKind::kDecode, logdir_, ds);
    CreateDirectories(dir);
    DecodeProgram decode(model_, &Writer(dir));
    auto r = decode.Run(global_step, decode_steps, dir);
    std::string line;
    for (const auto& [k, m] : r.metrics) line += StrCat(", ", k, ": ", PyFloatRepr(m));
    log_(StrCat("decode ", ds, " step ", global_step, line));
    if (!ml_perf_) continue;
    const std::string metric = sched_.GetString("ml_perf.decoder_metric_name");
    auto mit = r.metrics.find(metric);
    if (mit == r.metrics.end()) {
      throw InvalidArgumentError(StrCat("program_schedule.ml_perf.decoder_metric_name '", metric,
                                        "' is not a decoder metric of ", ds));
    }
    MlLog("eval_accuracy", "POINT_IN_TIME", PyFloatRepr(mit->second),
          StrCat("{\"epoch_num\": ", epoch, "}"));
    if (mit->second >= sched_.GetFloat("ml_perf.decoder_metric_success_threshold")) success = true;
  }
  return success;
}

}  // namespace glossa
