#include "glossa/runtime/executor.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/io/event_file.h"
#include "glossa/runtime/jobs.h"
#include "glossa/runtime/program.h"

namespace glossa {
namespace {

double SystemNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string ModelAnalysis(const BaseModel& model) {
  std::ostringstream out;
  int64_t total = 0;
  for (const auto& [info, t] : model.AllVariables()) {
    std::vector<std::string> dims;
    for (int64_t d : t.sizes()) dims.push_back(std::to_string(d));
    out << info.full_name << "    [" << Join(dims, ", ") << "]    " << t.numel() << "\n";
    total += t.numel();
  }
  out << "====================\ntotal #params: " << total << "\n";
  return out.str();
}

std::map<std::string, at::Tensor> CheckpointTensors(const BaseModel& model,
                                                    const ExponentialMovingAverage* ema,
                                                    int64_t global_step) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [info, t] : model.AllVariables()) out[info.full_name] = t;
  // Learner slots; a multi-task model's under "<task>/" (each task has its own learner).
  for (const auto& task_name : model.task_names()) {
    const std::string prefix = model.is_multi_task() ? task_name + "/" : "";
    for (const auto& [name, t] : model.GetTask(task_name).learner().Slots()) out[prefix + name] = t;
  }
  if (ema) {
    for (const auto& [name, t] : ema->Shadows()) out[name] = t;
  }
  out["global_step"] = at::full({}, global_step, at::kLong);
  return out;
}

namespace {
bool IsEmaName(const std::string& name) {
  const std::string suffix = ExponentialMovingAverage::kSuffix;
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

std::shared_ptr<ExponentialMovingAverage> MakeModelEma(BaseModel& model) {
  const Params& tp = model.task().train_params();
  if (!(tp.GetFloat("ema_decay") > 0) && !tp.IsSet("ema_schedule")) return nullptr;
  Params ep = ExponentialMovingAverage::Params();
  ep.Set("decay", tp.GetFloat("ema_decay") > 0 ? tp.GetFloat("ema_decay") : 0.999);
  if (tp.IsSet("ema_schedule")) ep.Set("ema_schedule", tp.Get("ema_schedule"));
  auto ema = std::make_shared<ExponentialMovingAverage>(ep);
  ema->Track(model);
  model.SetEma(ema);
  return ema;
}

std::optional<int64_t> RestoreForEval(const SafetensorsContents& ckpt, BaseModel& model,
                                      ExponentialMovingAverage* ema) {
  std::map<std::string, at::Tensor> vars;
  for (const auto& [info, t] : model.AllVariables()) vars[info.full_name] = t;
  RestoreVariables(ckpt, vars);
  if (ema) {
    for (const auto& [name, t] : ckpt.tensors) {
      if (IsEmaName(name)) ema->SetShadow(name, t);
    }
  }
  auto it = ckpt.tensors.find("global_step");
  if (it == ckpt.tensors.end()) return std::nullopt;
  return it->second.item<int64_t>();
}

int64_t RestoreCheckpoint(const SafetensorsContents& ckpt, BaseModel& model,
                          ExponentialMovingAverage* ema) {
  const std::optional<int64_t> step = RestoreForEval(ckpt, model, ema);
  if (!step) throw DataLossError("checkpoint has no global_step");
  std::set<std::string> vars;
  for (const auto& [info, t] : model.AllVariables()) vars.insert(info.full_name);
  for (const auto& [name, t] : ckpt.tensors) {
    if (vars.count(name) || name == "global_step" || IsEmaName(name)) continue;
    // Optimizer slots and tracker state.
    if (!model.is_multi_task()) {
      model.task().learner().SetSlot(name, t);
      continue;
    }
    const auto slash = name.find('/');
    const std::string task_name = slash == std::string::npos ? "" : name.substr(0, slash);
    const auto names = model.task_names();
    if (std::find(names.begin(), names.end(), task_name) == names.end()) {
      throw DataLossError(
          StrCat("checkpoint tensor '", name, "' is neither a variable nor a task's learner slot"));
    }
    model.GetTask(task_name).learner().SetSlot(name.substr(slash + 1), t);
  }
  return *step;
}

Executor::Executor(const Params& model_params, ExecutorOptions options)
    : params_(model_params.Copy()), options_(std::move(options)) {
  if (options_.logdir.empty()) throw InvalidArgumentError("executor: --logdir is required");
  if (!options_.clock) options_.clock = SystemNow;
  train_dir_ = JoinPath(options_.logdir, "train");
  CreateDirectories(train_dir_);
  CreateDirectories(JoinPath(options_.logdir, "control"));
  model_ = InstantiateLayer<BaseModel>(params_);
  const Params& tp = model_->task().train_params();
  ema_ = MakeModelEma(*model_);
  SaverOptions so;
  so.dir = train_dir_;
  so.keep_latest_n = tp.GetInt("save_max_to_keep");
  so.keep_every_n_hours = tp.GetFloat("save_keep_checkpoint_every_n_hours");
  so.async = tp.GetBool("async_checkpointing");
  so.clock = options_.clock;
  saver_ = std::make_unique<Saver>(so);
  if (tp.GetBool("checkpoint_finite_check")) saver_->AddIsFiniteCheck(".*");
  saver_->AddInRangeCheck(
      "global_step", 0, static_cast<double>(tp.GetInt("max_steps") + tp.GetInt("steps_per_loop")));
  AtomicWriteFile(JoinPath(JoinPath(options_.logdir, "control"), "params.txt"), params_.ToText());
  AtomicWriteFile(JoinPath(JoinPath(options_.logdir, "control"), "model_analysis.txt"),
                  ModelAnalysis(*model_));
}

Executor::~Executor() = default;

void Executor::Log(const std::string& line) {
  if (options_.log) {
    options_.log(line);
  } else {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

void Executor::Save() {
  saver_->Save(global_step_, CheckpointTensors(*model_, ema_.get(), global_step_));
}

void Executor::MlLog(const std::string& key, const std::string& event_type,
                     const std::string& value_json, const std::string& metadata_json) {
  const auto ms = static_cast<int64_t>(options_.clock() * 1000);
  Log(StrCat(":::MLLOG {\"namespace\": \"\", \"time_ms\": ", ms, ", \"event_type\": \"", event_type,
             "\", \"key\": \"", key, "\", \"value\": ", value_json,
             ", \"metadata\": ", metadata_json, "}"));
}

bool Executor::RunEvalPrograms(int64_t epoch) {
  const Params& sched = params_.GetParams("program_schedule");
  const int64_t eval_steps = sched.GetInt("eval_steps_per_loop");
  const int64_t decode_steps = sched.GetInt("decode_steps_per_loop");
  // The values programs see: the EMA when the model keeps one (as Lingvo's evaluation does).
  std::map<std::string, at::Tensor> values;
  std::map<std::string, at::Tensor> shadows;
  if (ema_) shadows = ema_->Shadows();
  for (const auto& [info, t] : model_->AllVariables()) {
    auto it = shadows.find(info.full_name + ExponentialMovingAverage::kSuffix);
    values[info.full_name] = it != shadows.end() ? it->second : t;
  }
  bool success = false;
  for (const auto& v : sched.Get("eval_dataset_names").AsList()) {
    const std::string ds = v.AsString();
    auto pit = options_.dataset_params.find(ds);
    if (pit == options_.dataset_params.end()) {
      throw InvalidArgumentError(StrCat("program_schedule.eval_dataset_names has '", ds,
                                        "' but the executor was given no model params for it"));
    }
    auto& model = eval_models_[ds];
    if (!model) model = InstantiateLayer<BaseModel>(pit->second);
    {
      at::NoGradGuard no_grad;
      for (const auto& [info, t] : model->AllVariables()) {
        auto it = values.find(info.full_name);
        if (it == values.end() || !it->second.sizes().equals(t.sizes())) {
          throw InvalidArgumentError(StrCat("dataset ", ds, ": variable ", info.full_name,
                                            " does not match the trained model's"));
        }
        t.copy_(it->second);
      }
    }
    if (eval_steps != 0) {
      const std::string dir = ProgramDir(JobKind::kEval, options_.logdir, ds);
      auto& w = eval_writers_[dir];
      if (!w) w = std::make_unique<EventWriter>(dir, 10.0, options_.clock);
      EvalProgram eval(*model, w.get());
      std::string line;
      for (const auto& [k, m] : eval.Run(global_step_, eval_steps))
        line += StrCat(", ", k, ": ", PyFloatRepr(m.first));
      Log(StrCat("eval ", ds, " step ", global_step_, line));
    }
    if (decode_steps != 0) {
      const std::string dir = ProgramDir(JobKind::kDecode, options_.logdir, ds);
      CreateDirectories(dir);
      auto& w = eval_writers_[dir];
      if (!w) w = std::make_unique<EventWriter>(dir, 10.0, options_.clock);
      DecodeProgram decode(*model, w.get());
      auto r = decode.Run(global_step_, decode_steps, dir);
      std::string line;
      for (const auto& [k, m] : r.metrics) line += StrCat(", ", k, ": ", PyFloatRepr(m));
      Log(StrCat("decode ", ds, " step ", global_step_, line));
      if (sched.GetBool("ml_perf.enabled")) {
        const std::string metric = sched.GetString("ml_perf.decoder_metric_name");
        auto mit = r.metrics.find(metric);
        if (mit == r.metrics.end()) {
          throw InvalidArgumentError(
              StrCat("ml_perf.decoder_metric_name '", metric, "' is not a decoder metric of ", ds));
        }
        MlLog("eval_accuracy", "POINT_IN_TIME", PyFloatRepr(mit->second),
              StrCat("{\"epoch_num\": ", epoch, "}"));
        if (mit->second >= sched.GetFloat("ml_perf.decoder_metric_success_threshold"))
          success = true;
      }
    }
  }
  return success;
}

int64_t Executor::Run() {
  const Params& tp = model_->task().train_params();
  if (auto latest = Saver::LatestCheckpoint(train_dir_)) {
    global_step_ = RestoreCheckpoint(LoadCheckpoint(*latest), *model_, ema_.get());
    Log(StrCat("restored ", *latest, " at step ", global_step_));
  } else if (!tp.Get("init_from_checkpoint_rules").AsDict().empty()) {
    std::map<std::string, InitRules> rules;
    for (const auto& [ckpt, v] : tp.Get("init_from_checkpoint_rules").AsDict()) {
      const auto& pair = v.AsList();
      if (pair.size() != 2) {
        throw InvalidArgumentError(StrCat("init_from_checkpoint_rules['", ckpt,
                                          "'] must be [[(regex, format), ...], [ignore, ...]]"));
      }
      InitRules r;
      for (const auto& rule : pair[0].AsList())
        r.rules.emplace_back(rule.AsList().at(0).AsString(), rule.AsList().at(1).AsString());
      for (const auto& ig : pair[1].AsList()) r.ignore.push_back(ig.AsString());
      rules[ckpt] = r;
    }
    std::map<std::string, at::Tensor> vars;
    for (const auto& [info, t] : model_->AllVariables()) vars[info.full_name] = t;
    const auto done = InitFromCheckpointRules(rules, vars);
    Log(StrCat("initialized ", done.size(), " variables from init_from_checkpoint_rules"));
  }
  EventWriter writer(train_dir_, 10.0, options_.clock);
  TrainProgram train(*model_, &writer, ema_.get(), [this](const std::string& l) { Log(l); });
  const int64_t max_steps = tp.GetInt("max_steps");
  int64_t last_save_step = global_step_;
  double last_save_time = options_.clock();
  const Params& sched = params_.GetParams("program_schedule");
  const bool has_programs =
      !sched.Get("eval_dataset_names").AsList().empty() &&
      (sched.GetInt("eval_steps_per_loop") != 0 || sched.GetInt("decode_steps_per_loop") != 0);
  const bool ml_perf = sched.GetBool("ml_perf.enabled");
  const int64_t per_eval = std::max<int64_t>(1, sched.GetInt("train_executions_per_eval"));
  const int64_t steps_per_epoch =
      sched.GetInt("ml_perf.steps_per_epoch") > 0
          ? sched.GetInt("ml_perf.steps_per_epoch")
          : per_eval * std::max<int64_t>(1, tp.GetInt("steps_per_loop"));
  int64_t loops = 0;
  bool ml_success = false;
  if (ml_perf) {
    MlLog("run_start", "INTERVAL_START", "null",
          StrCat("{\"benchmark\": ",
                 nlohmann::json(sched.GetString("ml_perf.benchmark_name")).dump(), "}"));
  }
  while (global_step_ < max_steps && !stop_.load()) {
    if (ml_perf && loops % per_eval == 0) {
      MlLog("block_start", "INTERVAL_START", "null",
            StrCat("{\"first_epoch_num\": ", global_step_ / steps_per_epoch, ", \"epoch_count\": ",
                   std::max<int64_t>(1, per_eval * tp.GetInt("steps_per_loop") / steps_per_epoch),
                   "}"));
    }
    auto r = train.RunLoop(&global_step_, [this] { return stop_.load(); });
    ++loops;
    if (has_programs && r.steps > 0 && (loops % per_eval == 0 || global_step_ >= max_steps)) {
      if (ml_perf) {
        MlLog("block_stop", "INTERVAL_END", "null",
              StrCat("{\"first_epoch_num\": ", (global_step_ - r.steps) / steps_per_epoch, "}"));
      }
      if (RunEvalPrograms(global_step_ / steps_per_epoch)) {
        ml_success = true;
        Log(StrCat("decoder metric reached its threshold at step ", global_step_, "; stopping"));
        break;
      }
    }
    if (r.input_exhausted) {
      Log(StrCat("training input exhausted at step ", global_step_));
      break;
    }
    const bool by_steps = tp.IsSet("save_interval_steps") &&
                          global_step_ - last_save_step >= tp.GetInt("save_interval_steps");
    const bool by_time = !tp.IsSet("save_interval_steps") &&
                         options_.clock() - last_save_time >= tp.GetFloat("save_interval_seconds");
    if ((by_steps || by_time) && global_step_ < max_steps) {
      Save();
      last_save_step = global_step_;
      last_save_time = options_.clock();
    }
    if (r.steps == 0) break;
  }
  if (ml_perf) {
    MlLog("run_stop", "INTERVAL_END", "null",
          StrCat("{\"status\": \"", ml_success ? "success" : "aborted", "\"}"));
  }
  if (global_step_ != last_save_step || !Saver::LatestCheckpoint(train_dir_)) Save();
  saver_->Wait();
  writer.Close();
  Log(StrCat("saved ", Saver::CheckpointPrefix(train_dir_, global_step_),
             stop_.load() ? " (stopped)" : ""));
  return global_step_;
}

}  // namespace glossa
