#include "glossa/runtime/executor.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <sstream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/runtime/program.h"

namespace glossa {
namespace {

double SystemNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string ModelAnalysis(const SingleTaskModel& model) {
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

std::map<std::string, at::Tensor> CheckpointTensors(const SingleTaskModel& model,
                                                    const ExponentialMovingAverage* ema,
                                                    int64_t global_step) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [info, t] : model.AllVariables()) out[info.full_name] = t;
  for (const auto& [name, t] : model.task().learner().Slots()) out[name] = t;
  if (ema) {
    for (const auto& [name, t] : ema->Shadows()) out[name] = t;
  }
  out["global_step"] = at::full({}, global_step, at::kLong);
  return out;
}

int64_t RestoreCheckpoint(const SafetensorsContents& ckpt, SingleTaskModel& model,
                          ExponentialMovingAverage* ema) {
  std::map<std::string, at::Tensor> vars;
  for (const auto& [info, t] : model.AllVariables()) vars[info.full_name] = t;
  RestoreVariables(ckpt, vars);
  const std::string suffix = ExponentialMovingAverage::kSuffix;
  for (const auto& [name, t] : ckpt.tensors) {
    if (vars.count(name) || name == "global_step") continue;
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      if (ema) ema->SetShadow(name, t);
      continue;
    }
    model.task().learner().SetSlot(name, t);  // optimizer slots and tracker state
  }
  auto it = ckpt.tensors.find("global_step");
  if (it == ckpt.tensors.end()) throw DataLossError("checkpoint has no global_step");
  return it->second.item<int64_t>();
}

Executor::Executor(const Params& model_params, ExecutorOptions options)
    : params_(model_params.Copy()), options_(std::move(options)) {
  if (options_.logdir.empty()) throw InvalidArgumentError("executor: --logdir is required");
  if (!options_.clock) options_.clock = SystemNow;
  train_dir_ = JoinPath(options_.logdir, "train");
  CreateDirectories(train_dir_);
  CreateDirectories(JoinPath(options_.logdir, "control"));
  model_ = InstantiateLayer<SingleTaskModel>(params_);
  const Params& tp = model_->task().train_params();
  if (tp.GetFloat("ema_decay") > 0 || tp.IsSet("ema_schedule")) {
    Params ep = ExponentialMovingAverage::Params();
    ep.Set("decay", tp.GetFloat("ema_decay") > 0 ? tp.GetFloat("ema_decay") : 0.999);
    if (tp.IsSet("ema_schedule")) ep.Set("ema_schedule", tp.Get("ema_schedule"));
    ema_ = std::make_shared<ExponentialMovingAverage>(ep);
    ema_->Track(*model_);
    model_->SetEma(ema_);
  }
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
  while (global_step_ < max_steps && !stop_.load()) {
    auto r = train.RunLoop(&global_step_, [this] { return stop_.load(); });
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
  if (global_step_ != last_save_step || !Saver::LatestCheckpoint(train_dir_)) Save();
  saver_->Wait();
  writer.Close();
  Log(StrCat("saved ", Saver::CheckpointPrefix(train_dir_, global_step_),
             stop_.load() ? " (stopped)" : ""));
  return global_step_;
}

}  // namespace glossa
