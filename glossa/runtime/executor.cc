#include "glossa/runtime/executor.h"

#include <ATen/ATen.h>

#include <chrono>
#include <optional>
#include <set>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/io/event_file.h"
#include "glossa/checkpoint/saver.h"
#include "glossa/optim/learner.h"
#include "glossa/runtime/data_parallel.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/gradient_sync.h"
#include "glossa/runtime/mesh.h"
#include "glossa/model/metric_history.h"
#include "glossa/runtime/program.h"
#include "glossa/layers/process_seed.h"
#include "glossa/runtime/program_schedule.h"
#include "glossa/base/progress.h"

namespace glossa {
namespace {

double SystemNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What would make training lie or fail late, refused before anything is written.
void ValidateTrainParams(BaseModel& model) {
  for (const auto& name : model.task_names()) {
    BaseTask& task = model.GetTask(name);
    const std::string where = model.is_multi_task() ? StrCat("task '", name, "': ") : "";
    const Params& tp = task.train_params();
    const double lr = task.learner().params().GetFloat("learning_rate");
    if (!std::isfinite(lr) || lr <= 0) {
      throw InvalidArgumentError(StrCat(where, "train.learner.learning_rate must be finite and > 0, got ",
                                        PyFloatRepr(lr)));
    }
    const int64_t max_steps = tp.GetInt("max_steps"), per_loop = tp.GetInt("steps_per_loop");
    // Checkpoint names and the global-step range check add these: keep them far from overflow.
    constexpr int64_t kMaxSteps = int64_t{1} << 53;
    if (max_steps < 0 || max_steps > kMaxSteps) {
      throw InvalidArgumentError(
          StrCat(where, "train.max_steps must be in [0, 2^53], got ", max_steps));
    }
    if (per_loop < 1 || per_loop > kMaxSteps) {
      throw InvalidArgumentError(
          StrCat(where, "train.steps_per_loop must be in [1, 2^53], got ", per_loop));
    }
    if (tp.GetInt("summary_interval_steps") < 1) {
      throw InvalidArgumentError(StrCat(where, "train.summary_interval_steps must be >= 1, got ",
                                        tp.GetInt("summary_interval_steps")));
    }
    if (tp.IsSet("save_interval_steps") && tp.GetInt("save_interval_steps") < 1) {
      throw InvalidArgumentError(StrCat(where, "train.save_interval_steps must be >= 1, got ",
                                        tp.GetInt("save_interval_steps")));
    }
    if (tp.GetInt("max_consecutive_skipped_steps") < 0) {
      throw InvalidArgumentError(StrCat(where, "train.max_consecutive_skipped_steps must be >= 0"));
    }
    const double skipped_fraction = tp.GetFloat("max_skipped_steps_fraction");
    if (!(skipped_fraction >= 0 && skipped_fraction <= 1)) {
      throw InvalidArgumentError(StrCat(where, "train.max_skipped_steps_fraction must be in [0, 1], got ",
                                        PyFloatRepr(skipped_fraction)));
    }
  }
}

// Said once, by the process whose initialization the run starts from (rank 0 of a data-parallel
// job), and only when it does start from it: the seed, and how to repeat the run.
std::string ProcessSeedNote() {
  const int64_t seed = ProcessRandomSeed();
  return StrCat("No random_seed is set: the variables were initialized from random seed ", seed,
                "; set `random_seed : ", seed, "` on the model (or --random_seed=", seed,
                ") to repeat this run");
}


// Steps after the restored checkpoint are replayed: their old lines of metrics.jsonl (and a torn
// last line) are dropped, lest they appear twice.
void DropReplayedMetricLines(const std::string& train_dir, int64_t global_step,
                             const std::function<void(const std::string&)>& log) {
  const std::string metrics = JoinPath(train_dir, "metrics.jsonl");
  TruncateTornLastLine(metrics);
  if (const int64_t n = DropMetricLinesAfter(metrics, global_step); n > 0) {
    log(StrCat("dropped ", n, " line(s) of ", metrics, " after step ", global_step,
               " (the steps this run replays from its checkpoint)"));
  }
}

// The console of a run: a concise line per loop, and on a terminal a bar between them.
struct Console {
  std::chrono::steady_clock::time_point run_start;
  int64_t max_steps = 0;
  int64_t first_step = 0;
  int64_t steps_per_loop = 1;  // at least 1
  double rate = 0;             // recent steps/s (the last loop's)
  double last_line_time = 0;   // Elapsed() at the last console line
  int64_t loop_start_step = 0;
  int64_t last_line_step = 0;

  // Seconds since the run started.
  double Elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  }
};

// After every step of `train`: with `heartbeat`, the run's first step and then a line at least
// every heartbeat_seconds inside a loop; and the bar, when it is enabled.
void ShowStepsOnConsole(TrainProgram& train, Console& console, bool heartbeat,
                        const ExecutorOptions& options, const std::unique_ptr<ProgressBar>& bar,
                        std::function<void(const std::string&)> log) {
  train.SetStepCallback([&console, heartbeat, &options, &bar, log](int64_t step) {
    const double now = console.Elapsed();
    // steps/s of this run
    const double average = (step - console.first_step) / std::max(now, 1e-9);
    // Inside a loop: the run's first step, then a line at least every heartbeat_seconds.
    if (heartbeat && step < console.max_steps &&
        step - console.loop_start_step < console.steps_per_loop &&
        (step == console.first_step + 1 ||
         now - console.last_line_time >= options.heartbeat_seconds)) {
      console.last_line_time = now;
      ProgressLine pl;
      pl.step = step;
      pl.max_steps = console.max_steps;
      pl.steps_per_sec = average;
      pl.elapsed_seconds = now;
      log(StrCat(FormatProgressLine(pl),
                 step == console.first_step + 1 ? " \xC2\xB7 first step" : ""));
    }
    if (bar && bar->enabled()) {
      bar->Update(step, console.max_steps, console.rate > 0 ? console.rate : average);
    }
  });
}

// After a loop that ran steps: the progress line with the loop's metrics (verbosity >= 1), at
// most every log_every_n_steps steps and always after the last.
void LogLoopLine(Console& console, const TrainProgram::LoopResult& r, const TrainProgram& train,
                 int64_t global_step, const ExecutorOptions& options,
                 const std::function<void(const std::string&)>& log) {
  const bool last = global_step >= console.max_steps;
  if (options.verbosity >= 1 &&
      (last || global_step - console.last_line_step >=
                   std::max<int64_t>(options.log_every_n_steps, 1))) {
    console.last_line_step = global_step;
    ProgressLine pl;
    pl.step = global_step;
    pl.max_steps = console.max_steps;
    auto metric = [&](const char* name) -> std::optional<double> {
      auto it = r.metrics.find(name);
      if (it == r.metrics.end()) return std::nullopt;
      return it->second.first;
    };
    pl.loss = metric("loss");
    pl.log_pplx = metric("log_pplx");
    pl.learning_rate = metric("learning_rate");
    pl.steps_per_sec = r.steps_per_sec;
    pl.tokens_per_sec = r.tokens_per_sec;
    pl.elapsed_seconds = console.Elapsed();
    std::string line = FormatProgressLine(pl);
    if (train.total_skipped() > 0) {
      line += StrCat(" \xC2\xB7 skipped ", r.skipped_steps, " steps (", train.total_skipped(),
                     " in this run)");
    }
    log(line);
    console.last_line_time = console.Elapsed();
  }
}

// A run that ends inside a streak of skipped steps, or skipped much of what it ran, diverged
// however short it was (max_consecutive_skipped_steps alone misses a 60-step run): the message
// saying so, or none. `ran`: the run's steps; `fraction`: max_skipped_steps_fraction.
std::optional<std::string> SkippedStepsDivergence(const TrainProgram& train, int64_t ran,
                                                  double fraction) {
  if (train.consecutive_skipped() > 0) {
    return StrCat("training diverged: the run ended inside a streak of ",
                  train.consecutive_skipped(), " skipped steps (non-finite loss or "
                  "gradients, or a gradient norm over grad_norm_to_clip_to_zero; ",
                  train.total_skipped(), " of its ", ran, " steps were skipped)");
  }
  if (ran > 0 && static_cast<double>(train.total_skipped()) > fraction * ran) {
    return StrCat("training diverged: ", train.total_skipped(), " of the run's ", ran,
                  " steps were skipped, more than task.train.max_skipped_steps_fraction (",
                  PyFloatRepr(fraction), ")");
  }
  return std::nullopt;
}

// The run's last line: the checkpoint it saved at `step` (its files, as they are on disk now), or
// that this checkpoint already was the latest.
void LogFinalCheckpoint(const std::string& train_dir, int64_t step, bool saved, bool stopped,
                        const std::function<void(const std::string&)>& log) {
  const std::string prefix = Saver::CheckpointPrefix(train_dir, step);
  if (saved) {
    // The files written, as they are on disk now.
    log(StrCat("saved ", Join(SafetensorsFiles(prefix), ", "), stopped ? " (stopped)" : ""));
  } else {
    log(StrCat("checkpoint ", prefix, " is already the latest", stopped ? " (stopped)" : ""));
  }
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
  Distributed* dist = options_.distributed;
  chief_ = dist == nullptr || dist->rank() == 0;
  const std::string config_text = params_.ToText();
  BuildModel();
  ValidateTrainParams(*model_);
  train_dir_ = JoinPath(options_.logdir, "train");
  ema_ = MakeModelEma(*model_);
  if (!chief_) return;  // rank 0 alone touches the logdir
  CreateDirectories(train_dir_);
  lock_ = std::make_unique<DirectoryLock>(train_dir_, ".trainer.lock", "trainer");
  // What a killed run left half-written: temporary files of atomic writes (checkpoints among
  // them), and a torn last line of metrics.jsonl (the event writer drops it when it opens).
  const std::vector<std::string> stale = RemoveStaleTempFiles(train_dir_);
  if (!stale.empty()) {
    Log(StrCat("removed ", stale.size(), " temporary file(s) an interrupted run left in ",
               train_dir_, " (", stale.front(), stale.size() > 1 ? ", ..." : "", ")"));
  }
  CreateDirectories(JoinPath(options_.logdir, "control"));
  checkpointer_ = std::make_unique<Checkpointer>(train_dir_, *model_, ema_.get(), options_.clock);
  if (plan_ && !plan_->layout().empty()) {
    checkpointer_->SetShards(plan_->layout(), plan_->checkpoint_files());
  }
  checkpointer_->SetStopRequested([this] { return stop_.load(); });
  AtomicWriteFile(JoinPath(JoinPath(options_.logdir, "control"), "params.txt"), config_text);
  AtomicWriteFile(JoinPath(JoinPath(options_.logdir, "control"), "model_analysis.txt"),
                  ModelAnalysis(*model_));
}

void Executor::Diverged(const std::string& message, EventWriter* writer) {
  // No final save: the diverged weights must not become the latest checkpoint.
  if (!chief_) throw TrainingDivergedError(message);
  checkpointer_->Wait();
  writer->Close();
  const auto healthy = Saver::LastHealthyCheckpoint(train_dir_);
  throw TrainingDivergedError(StrCat(
      message, ". The last checkpoint of healthy training is ",
      healthy ? *healthy : std::string("none (it diverged before the first save)"),
      healthy ? "; to go on from it, train in a new logdir with "
                "task.train.init_from_checkpoint_rules (docs/training.md, 'Failure behaviour')"
              : ""));
}

std::string Executor::GradientSyncSummary() const {
  if (syncs_.empty()) return "";
  DataParallelGradientSync::Stats total;
  for (const auto& s : syncs_) {
    const auto st = s->stats();
    total.steps += st.steps;
    total.bytes += st.bytes;
    total.buckets += st.buckets;
    total.early_buckets += st.early_buckets;
    total.exposed_seconds += st.exposed_seconds;
  }
  if (total.steps == 0) return "";
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "gradient allreduce over %d ranks: %.2f MB per step in %.1f buckets (%.0f%% started "
                "during the backward pass), %.2f ms per step not hidden by the backward pass",
                options_.distributed->world_size(), total.bytes / 1e6 / total.steps,
                static_cast<double>(total.buckets) / total.steps,
                total.buckets ? 100.0 * total.early_buckets / total.buckets : 0.0,
                1e3 * total.exposed_seconds / total.steps);
  return buf;
}

Executor::~Executor() = default;

void Executor::Log(const std::string& line) {
  if (bar_) bar_->Clear();
  if (options_.log) {
    options_.log(line);
  } else {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

bool Executor::EarlyStopCheck() {
  const Params& es = model_->task().train_params().GetParams("early_stop");
  if (es.GetInt("window") <= 0) return false;
  const std::string path =
      MetricHistoryPath(options_.logdir, es.GetString("metric_history.jobname"),
                        es.GetString("metric_history.metric"));
  const BestStep b =
      ComputeBestStep(path, es.GetFloat("tolerance"), es.GetBool("metric_history.minimize"));
  const bool stop = ShouldStopEarly(b, es.GetInt("window"), es.GetInt("min_steps"));
  if (es.GetBool("verbose")) {
    Log(StrCat("early stop check: best_step=", b.best_step, ", last_step=", b.last_step,
               ", stop=", stop ? 1 : 0));
  }
  return stop;
}

// What Run shares with its train loops: the programs, the console, and how the loops ended.
struct Executor::RunState {
  TrainProgram& train;
  ProgramSchedule& schedule;
  EventWriter* writer;  // null off rank 0
  Console console;
  int64_t skipped_since_save = 0;
  bool stopped = false;  // by a stop request (here or on another rank)
};

int64_t Executor::Run() {
  const Params& tp = model_->task().train_params();
  auto log = [this](const std::string& l) { Log(l); };
  Distributed* dist = options_.distributed;
  // Metrics average over the ranks whose batches differ (one per batch shard).
  DistributedScope dist_scope(dist, plan_ ? plan_->batch_group() : dist);
  if (chief_) global_step_ = checkpointer_->RestoreOrInitialize(log);
  if (chief_ && !checkpointer_->restored() && used_process_seed_) Log(ProcessSeedNote());
  if (dist != nullptr) JoinRanks(*dist);
  ProgramSchedule schedule(*model_, options_.dataset_params, options_.logdir, log, options_.clock);
  std::unique_ptr<EventWriter> writer;
  if (chief_ && checkpointer_->restored()) DropReplayedMetricLines(train_dir_, global_step_, log);
  if (chief_) writer = std::make_unique<EventWriter>(train_dir_, 10.0, options_.clock);
  TrainProgram train(*model_, writer.get(), ema_.get(),
                     options_.verbosity >= 2 ? log : std::function<void(const std::string&)>());
  const int64_t max_steps = tp.GetInt("max_steps");
  // The console: a concise line per loop, and on a terminal a bar between them.
  const auto run_start = std::chrono::steady_clock::now();
  if (!options_.log && chief_ && options_.verbosity >= 1) bar_ = std::make_unique<ProgressBar>(stdout);
  const int64_t first_step = global_step_;
  RunState run{train, schedule, writer.get(),
               Console{run_start, max_steps, first_step,
                       std::max<int64_t>(1, tp.GetInt("steps_per_loop")), 0.0, 0.0, global_step_,
                       global_step_}};
  const bool heartbeat = chief_ && options_.verbosity >= 1 && options_.heartbeat_seconds >= 0;
  if ((bar_ && bar_->enabled()) || heartbeat) {
    ShowStepsOnConsole(train, run.console, heartbeat, options_, bar_, log);
  }
  run.schedule.RunStart();
  {
    // Each rank's rows of the global batch draw their rows of one process's masks.
    std::optional<BatchShardScope> shard;
    if (plan_ && plan_->batch_shards() > 1) shard.emplace(plan_->batch_shard(), plan_->batch_shards());
    TrainLoops(run);
  }
  run.schedule.RunStop();
  run.stopped = run.stopped || stop_.load();
  if (!run.stopped) {
    const int64_t ran = global_step_ - first_step;
    const double fraction = tp.GetFloat("max_skipped_steps_fraction");
    if (const std::optional<std::string> message = SkippedStepsDivergence(train, ran, fraction)) {
      Diverged(*message, writer.get());
    }
  }
  if (const std::string s = GradientSyncSummary(); !s.empty()) Log(s);
  LogModelParallelSummary(first_step);
  const bool saved =
      SaveCheckpoint(chief_ && checkpointer_->IsNew(global_step_), run.skipped_since_save == 0);
  if (!chief_) return global_step_;
  checkpointer_->Wait();
  writer->Close();
  LogFinalCheckpoint(train_dir_, global_step_, saved, run.stopped, log);
  return global_step_;
}

// The train loops of a run, until max_steps, a stop request, the end of the input, or the program
// schedule or early stopping ends it; saves on the checkpointer's cadence between loops.
void Executor::TrainLoops(RunState& run) {
  const Params& tp = model_->task().train_params();
  Distributed* dist = options_.distributed;
  // The ranks agree on every decision that changes which collectives run next.
  auto agree = [dist](bool v) { return dist != nullptr ? dist->AnyTrue(v) : v; };
  Console& console = run.console;
  const int64_t max_steps = console.max_steps;
  while (global_step_ < max_steps) {
    if (agree(stop_.load())) {
      run.stopped = true;
      break;
    }
    run.schedule.BeforeTrainLoop(global_step_);
    TrainProgram::LoopResult r;
    console.loop_start_step = global_step_;
    try {
      r = run.train.RunLoop(&global_step_, [this] { return stop_.load(); });
    } catch (const TrainingDivergedError& e) {
      Diverged(e.message(), run.writer);
    }
    run.skipped_since_save += r.skipped_steps;
    if (r.steps > 0) {
      console.rate = r.steps_per_sec;
      LogLoopLine(console, r, run.train, global_step_, options_,
                  [this](const std::string& l) { Log(l); });
    }
    if (r.steps < tp.GetInt("steps_per_loop") && !r.input_exhausted &&
        global_step_ < max_steps) {
      run.stopped = true;  // the ranks agreed to stop inside the loop
    }
    if (run.schedule.AfterTrainLoop(global_step_, r.steps, global_step_ >= max_steps)) {
      Log(run.schedule.ml_success()
              ? StrCat("decoder metric passed its threshold at step ", global_step_, "; stopping")
              : StrCat("MLPerf: max_steps_to_train reached at step ", global_step_, "; stopping"));
      break;
    }
    if (agree(chief_ && EarlyStopCheck())) break;
    if (r.input_exhausted) {
      Log(StrCat("training input exhausted at step ", global_step_));
      break;
    }
    if (global_step_ < max_steps &&
        SaveCheckpoint(chief_ && checkpointer_->SaveDue(global_step_),
                       run.skipped_since_save == 0)) {
      run.skipped_since_save = 0;
    }
    if (r.steps == 0) break;
  }
}

}  // namespace glossa
