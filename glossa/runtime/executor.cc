#include "glossa/runtime/executor.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <sstream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/io/event_file.h"
#include "glossa/runtime/program.h"
#include "glossa/runtime/program_schedule.h"

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

Executor::Executor(const Params& model_params, ExecutorOptions options)
    : params_(model_params.Copy()), options_(std::move(options)) {
  if (options_.logdir.empty()) throw InvalidArgumentError("executor: --logdir is required");
  if (!options_.clock) options_.clock = SystemNow;
  train_dir_ = JoinPath(options_.logdir, "train");
  CreateDirectories(train_dir_);
  CreateDirectories(JoinPath(options_.logdir, "control"));
  model_ = InstantiateLayer<BaseModel>(params_);
  ema_ = MakeModelEma(*model_);
  checkpointer_ = std::make_unique<Checkpointer>(train_dir_, *model_, ema_.get(), options_.clock);
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

int64_t Executor::Run() {
  const Params& tp = model_->task().train_params();
  auto log = [this](const std::string& l) { Log(l); };
  global_step_ = checkpointer_->RestoreOrInitialize(log);
  ProgramSchedule schedule(*model_, options_.dataset_params, options_.logdir, log, options_.clock);
  EventWriter writer(train_dir_, 10.0, options_.clock);
  TrainProgram train(*model_, &writer, ema_.get(), log);
  const int64_t max_steps = tp.GetInt("max_steps");
  bool ml_success = false;
  schedule.RunStart();
  while (global_step_ < max_steps && !stop_.load()) {
    schedule.BeforeTrainLoop(global_step_);
    auto r = train.RunLoop(&global_step_, [this] { return stop_.load(); });
    if (schedule.AfterTrainLoop(global_step_, r.steps, global_step_ >= max_steps)) {
      ml_success = true;
      Log(StrCat("decoder metric reached its threshold at step ", global_step_, "; stopping"));
      break;
    }
    if (r.input_exhausted) {
      Log(StrCat("training input exhausted at step ", global_step_));
      break;
    }
    if (global_step_ < max_steps) checkpointer_->MaybeSave(global_step_);
    if (r.steps == 0) break;
  }
  schedule.RunStop(ml_success);
  checkpointer_->SaveIfNew(global_step_);
  checkpointer_->Wait();
  writer.Close();
  Log(StrCat("saved ", Saver::CheckpointPrefix(train_dir_, global_step_),
             stop_.load() ? " (stopped)" : ""));
  return global_step_;
}

}  // namespace glossa
