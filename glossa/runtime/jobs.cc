#include "glossa/runtime/jobs.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/io/event_file.h"
#include "glossa/optim/ema.h"
#include "glossa/checkpoint/checkpointer.h"
#include "glossa/runtime/data_parallel.h"
#include "glossa/runtime/distributed.h"
#include "glossa/model/metric_history.h"
#include "glossa/model/params_passes.h"
#include "glossa/runtime/program.h"
#include "glossa/base/progress.h"

namespace glossa {

namespace {

std::set<std::string> ReadProcessed(const std::string& path) {
  std::set<std::string> out;
  if (!FileExists(path)) return out;
  for (const auto& line : Split(ReadFileToString(path), '\n')) {
    if (!line.empty()) out.insert(std::string(line));
  }
  return out;
}

int64_t StepOf(const std::string& ckpt) {
  const auto dash = ckpt.rfind('-');
  try {
    return std::stoll(ckpt.substr(dash + 1));
  } catch (const std::exception&) {
    throw DataLossError(StrCat("checkpoint name '", ckpt, "' has no step number"));
  }
}

// --once: the latest checkpoint on disk is the last one to process, from step 0 on, alone.
void OnceParams(Params& p, const std::string& train_dir) {
  const CheckpointState existing = ExistingCheckpoints(train_dir);
  if (existing.model_checkpoint_path.empty()) {
    throw NotFoundError(StrCat("no checkpoint in ", train_dir));
  }
  const std::string task = MainTaskPath(p);
  p.Set(task + ".eval.start_eval_after", 0);
  p.Set(task + ".eval.start_decoder_after", 0);
  p.Set(task + ".eval.eval_all_checkpoints", false);
  p.Set(task + ".eval.decode_all_checkpoints", false);
  p.Set(task + ".train.max_steps", StepOf(existing.model_checkpoint_path));
}

// A line of the job's log: options.log, or stdout.
void JobLog(const JobOptions& options, const std::string& l) {
  if (options.log) {
    options.log(l);
  } else {
    std::printf("%s\n", l.c_str());
    std::fflush(stdout);
  }
}

// Sleeps `s` seconds: options.sleep, or a real sleep.
void JobSleep(const JobOptions& options, double s) {
  if (options.sleep) {
    options.sleep(s);
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
  }
}

// A logdir no trainer has touched is most often a mistyped one: refuse it (creating nothing)
// rather than wait forever, unless asked to wait for a run that has not started yet.
void RefuseUntouchedLogdir(const JobOptions& options, const Params& ep,
                           const std::string& train_dir) {
  if (!options.wait_for_train && !ep.IsSet("load_checkpoint_from") && !FileExists(train_dir) &&
      !FileExists(JoinPath(options.logdir, "control"))) {
    throw NotFoundError(StrCat("--logdir '", options.logdir,
                               "' holds no training run (it has no train/ and no control/): a "
                               "mistyped path? To wait for a run that has not started yet, pass "
                               "--wait_for_train"));
  }
}

// What one checkpoint job shares between its polls and the checkpoints it processes.
struct Job {
  const JobKind kind;
  const JobOptions& options;
  const std::string train_dir;
  const std::string job_dir;
  Distributed* const dist;
  const bool chief;
  BaseModel& model;
  const Params& tp;
  const Params& ep;
  const std::string processed_file;
  const std::shared_ptr<ExponentialMovingAverage> ema;
  const int64_t max_steps;
  const bool all;
  const int64_t start_after;
  std::unique_ptr<EventWriter> writer = nullptr;  // rank 0 only
  std::set<std::string> processed = {};
  // Waiting for checkpoints: seconds waited since the last checkpoint (-1: not waiting), and
  // when the last line was logged.
  double waited = -1;
  double last_line = 0;
  std::set<std::string> gone = {};  // deleted by retention before we got to them
  int64_t count = 0;
  double backoff = 1;

  void Log(const std::string& l) const { JobLog(options, l); }
};

// Waiting for checkpoints: a line naming what the job waits for, then after each poll a
// heartbeat once heartbeat_seconds have passed since the last line.
void WaitForCheckpoint(Job& job, double seconds, const std::string& newest) {
  if (job.waited < 0) {
    job.waited = 0;
    job.last_line = 0;
    job.Log(StrCat(job.kind == JobKind::kEval ? "evaler" : "decoder",
                   ": waiting for a new checkpoint in ", job.train_dir, " (", newest,
                   "; the job ends after the checkpoint at step ", job.max_steps, ")"));
  }
  JobSleep(job.options, seconds);
  job.waited += seconds;
  if (job.waited - job.last_line >= job.options.heartbeat_seconds) {
    job.last_line = job.waited;
    job.Log(StrCat("still waiting for a new checkpoint in ", job.train_dir, " (",
                   FormatDuration(job.waited), " so far; ", newest, ")"));
  }
}

// Every rank loads the checkpoint at `prefix`; when one cannot (retention deleted it
// meanwhile), all skip it (NotFound).
std::optional<SafetensorsContents> LoadOnEveryRank(const Job& job, const std::string& prefix) {
  std::optional<SafetensorsContents> contents;
  std::optional<NotFoundError> missing;
  try {
    contents = LoadCheckpoint(prefix);
  } catch (const NotFoundError& e) {
    missing = e;
  }
  if (job.dist != nullptr ? job.dist->AnyTrue(missing.has_value()) : missing.has_value()) {
    throw missing ? *missing : NotFoundError(StrCat(prefix, ": another rank could not load it"));
  }
  return contents;
}

// What the eval or decode program made of one checkpoint.
struct ProgramOutcome {
  std::map<std::string, double> values;
  int64_t examples = 0;
};

// Runs the job's program (eval or decode) on the model as restored at `step`.
ProgramOutcome RunJobProgram(Job& job, int64_t step) {
  ProgramOutcome out;
  if (job.kind == JobKind::kEval) {
    EvalProgram eval(job.model, job.writer.get());
    for (const auto& [k, v] : eval.Run(step)) out.values[k] = v.first;
    out.examples = eval.last_samples();
  } else {
    DecodeProgram decode(job.model, job.writer.get());
    const JobOptions& options = job.options;
    decode.SetProgressLog([&options](const std::string& l) { JobLog(options, l); },
                          options.heartbeat_seconds);
    const DecodeProgram::Result r =
        decode.Run(step, -1, job.chief ? job.job_dir : std::string());
    out.values = r.metrics;
    out.examples = static_cast<int64_t>(r.lines.size());
  }
  return out;
}

// The headline of a checkpoint's log line: the tracked metrics this job produced, each with its
// best so far (each entry led by `sep`).
std::string Headline(const Job& job, const std::string& job_name, int64_t step,
                     const std::map<std::string, double>& values, const char* sep) {
  std::string headline;
  for (const auto& [metric, b] : TrackBestSteps(job.model.task().params(),
                                                 job.model.task().TrackedMetrics(),
                                                 job.options.logdir, job_name, step, values)) {
    char buf[128];
    std::snprintf(buf, sizeof(buf), "%s %.4f (best %.4f at step %lld)", metric.c_str(),
                  values.at(metric), b.best_value, static_cast<long long>(b.best_step));
    headline += StrCat(sep, buf);
  }
  return headline;
}

// Rank 0, after a checkpoint's program: the score file, the metric history, the best steps,
// processed_ckpts.txt and the log line.
void RecordCheckpoint(Job& job, const std::string& ckpt, int64_t step,
                      const ProgramOutcome& out) {
  const std::map<std::string, double>& values = out.values;
  const std::string score_file = WriteScoreFile(job.job_dir, step, values);
  // The metric history early stopping reads (Lingvo's MetricHistory.ConditionalAppend).
  const std::string job_name = job.job_dir.substr(job.job_dir.rfind('/') + 1);
  MaybeAppendMetricHistory(job.tp.GetParams("early_stop"), job.options.logdir, job_name, step,
                           values);
  const char* sep = " \xC2\xB7 ";  // " · "
  const std::string headline = Headline(job, job_name, step, values, sep);
  job.processed.insert(ckpt);
  std::string all_processed;
  for (const auto& p : job.processed) all_processed += p + "\n";
  AtomicWriteFile(job.processed_file, all_processed);
  ++job.count;
  // What was evaluated, how much, and the headline; every metric is in the score file.
  job.Log(StrCat(job.kind == JobKind::kEval ? "eval " : "decode ", job.options.dataset, sep,
                 ckpt.substr(ckpt.rfind('/') + 1), " (step ", step, ")", sep, out.examples,
                 job.kind == JobKind::kEval ? " examples" : " decoded", headline, sep,
                 "all metrics: ", score_file));
}

// Loads, restores and evaluates or decodes one checkpoint (a name in train/, or a prefix with a
// '/'), then records it; returns its step.
int64_t ProcessCheckpoint(Job& job, const std::string& ckpt) {
  const std::string prefix =
      ckpt.find('/') != std::string::npos ? ckpt : JoinPath(job.train_dir, ckpt);
  const std::optional<SafetensorsContents> contents = LoadOnEveryRank(job, prefix);
  const int64_t checked = CheckedGlobalStep(*contents, prefix).value_or(StepOf(ckpt));
  const int64_t step = RestoreForEval(*contents, job.model, job.ema.get()).value_or(checked);
  const ProgramOutcome out = RunJobProgram(job, step);
  if (!job.chief) {
    job.processed.insert(ckpt);
    return step;
  }
  RecordCheckpoint(job, ckpt, step, out);
  return step;
}

// One poll on a rank other than 0: processes the checkpoints in rank 0's list (skipping those
// it cannot load) and backs off when there were none. Returns true once the job is finished.
bool FollowerPoll(Job& job) {
  // Rank 0's list: "<finished>\n<checkpoint>\n...".
  const std::vector<std::string> lines = Split(job.dist->AllGatherStrings("")[0], '\n');
  const bool finished = !lines.empty() && lines[0] == "1";
  std::vector<std::string> todo;
  for (size_t i = 1; i < lines.size(); ++i) {
    if (!lines[i].empty()) todo.push_back(lines[i]);
  }
  for (const auto& c : todo) {
    try {
      ProcessCheckpoint(job, c);
    } catch (const NotFoundError&) {
      job.gone.insert(c);
    }
  }
  if (finished) return true;
  if (todo.empty()) JobSleep(job.options, job.backoff);
  job.backoff = todo.empty() ? std::min(job.backoff * 2, job.options.max_backoff_seconds) : 1;
  return false;
}

// The checkpoints of `state` rank 0 processes in this poll.
std::vector<std::string> CheckpointsToProcess(const Job& job, const CheckpointState& state) {
  std::vector<std::string> todo;
  for (const auto& c : state.all_model_checkpoint_paths) {
    if (!job.processed.count(c) && !job.gone.count(c) && StepOf(c) >= job.start_after) {
      todo.push_back(c);
    }
  }
  // Without *_all_checkpoints only the newest checkpoint matters, processed or not; one
  // deleted under us is not retried (the next poll sees what replaced it).
  if (!job.all) {
    const auto& paths = state.all_model_checkpoint_paths;
    todo.clear();
    if (!paths.empty() && !job.processed.count(paths.back()) && !job.gone.count(paths.back()) &&
        StepOf(paths.back()) >= job.start_after) {
      todo.push_back(paths.back());
    }
  }
  return todo;
}

// Rank 0 processes `todo` (skipping what retention deleted meanwhile); returns whether it
// processed the checkpoint at max_steps.
bool ProcessTodo(Job& job, const std::vector<std::string>& todo) {
  bool reached_max = false;
  for (const auto& c : todo) {
    // Retention may delete a checkpoint between reading the state file and loading it (the
    // trainer keeps the latest N): skip it and go on.
    try {
      if (ProcessCheckpoint(job, c) >= job.max_steps) reached_max = true;
    } catch (const NotFoundError& e) {
      if (!SafetensorsFiles(JoinPath(job.train_dir, c)).empty() && job.dist == nullptr) throw;
      job.Log(StrCat("skipped ", c, ": removed by the trainer's retention before it was ",
                     job.kind == JobKind::kEval ? "evaluated" : "decoded", " (", e.message(),
                     ")"));
      job.gone.insert(c);
    }
  }
  return reached_max;
}

// --once and a poll with nothing to process: NotFound, naming the newest checkpoint if any.
[[noreturn]] void ThrowNothingLeft(const Job& job, const CheckpointState& state) {
  throw NotFoundError(StrCat(
      "--once: no checkpoint left to ", job.kind == JobKind::kEval ? "evaluate" : "decode",
      " in ", job.train_dir,
      state.all_model_checkpoint_paths.empty()
          ? std::string(" (none exists)")
          : StrCat(" (newest ", state.all_model_checkpoint_paths.back(), ", step ",
                   StepOf(state.all_model_checkpoint_paths.back()), ", is before step ",
                   job.max_steps, " or could not be loaded)")));
}

// One poll on rank 0: picks the checkpoints to process, sends the list to the other ranks,
// processes them, and waits when there were none. Returns true once the job is finished.
bool ChiefPoll(Job& job) {
  // What exists, as the trainer sees it on restore: the state file's entries whose files are
  // there and checkpoints on disk it does not list (a stale or hand-edited state file).
  CheckpointState state = ExistingCheckpoints(job.train_dir);
  const std::vector<std::string> todo = CheckpointsToProcess(job, state);
  bool finished = false;
  // Done once the final checkpoint has been processed (in an earlier run, or now).
  for (const auto& c : job.processed) {
    if (StepOf(c) >= job.max_steps) finished = true;
  }
  for (const auto& c : todo) {
    if (StepOf(c) >= job.max_steps) finished = true;
  }
  if (job.dist != nullptr) {
    std::string list = finished ? "1" : "0";
    for (const auto& c : todo) list += "\n" + c;
    job.dist->AllGatherStrings(list);
  }
  if (ProcessTodo(job, todo)) finished = true;
  if (finished) return true;
  if (job.options.once && todo.empty()) ThrowNothingLeft(job, state);
  if (todo.empty()) {
    WaitForCheckpoint(job, job.backoff,
                      state.all_model_checkpoint_paths.empty()
                          ? std::string("none yet")
                          : StrCat("newest ", state.all_model_checkpoint_paths.back()));
    job.backoff = std::min(job.backoff * 2, job.options.max_backoff_seconds);
  } else {
    job.backoff = 1;
    job.waited = -1;
  }
  return false;
}

// What data a job's scores come from: the input's file_pattern and tokenizer, as params text.
std::string JobDataText(const Params& p) {
  if (!p.Contains("task") || !p.IsSet("task.input")) return "";
  std::string text;
  for (const auto& line : Split(p.GetParams("task.input").ToText(), '\n')) {
    if (line.rfind("file_pattern :", 0) == 0 || line.rfind("tokenizer", 0) == 0) {
      text += StrCat(line, "\n");
    }
  }
  return text;
}

// <job_dir>/data.txt says what data its scores come from; a job that reads other data there is
// refused (its best and its history would mix two corpora), with the difference.
void CheckJobData(const std::string& job_dir, const std::string& data) {
  if (data.empty()) return;
  const std::string file = JoinPath(job_dir, "data.txt");
  if (FileExists(file)) {
    const std::string before = ReadFileToString(file, 1 << 20);
    if (before == data) return;
    std::vector<std::string> diff;
    const std::vector<std::string> a = Split(before, '\n'), b = Split(data, '\n');
    for (const auto& l : a) {
      if (!l.empty() && std::find(b.begin(), b.end(), l) == b.end())
        diff.push_back(StrCat("  was: ", l));
    }
    for (const auto& l : b) {
      if (!l.empty() && std::find(a.begin(), a.end(), l) == a.end())
        diff.push_back(StrCat("  now: ", l));
    }
    throw FailedPreconditionError(StrCat(
        job_dir, " holds the scores of other data (", file, "):\n", Join(diff, "\n"),
        "\nits best and its history would mix the two: evaluate into another --logdir, or remove ",
        job_dir, " to start it afresh"));
  }
  AtomicWriteFile(file, data);
}

// --once found the latest checkpoint processed by an earlier run: say so, and where its scores
// are, instead of ending mute.
void SayAlreadyProcessed(const Job& job, const std::string& ckpt) {
  char name[64];
  std::snprintf(name, sizeof(name), "score-%08lld.txt", static_cast<long long>(StepOf(ckpt)));
  const std::string score = JoinPath(job.job_dir, name);
  const bool eval = job.kind == JobKind::kEval;
  job.Log(StrCat(eval ? "eval " : "decode ", job.options.dataset, ": ", ckpt, " (step ",
                 StepOf(ckpt), ") was already ", eval ? "evaluated" : "decoded", " (",
                 job.processed_file, "); its scores: ",
                 FileExists(score) ? score : StrCat("none kept (", score, " is missing)"),
                 ". Pass --force to ", eval ? "evaluate" : "decode", " it again."));
}

}  // namespace

int64_t RunCheckpointJob(JobKind kind, const Params& model_params, const JobOptions& options) {
  if (options.logdir.empty()) throw InvalidArgumentError("job: --logdir is required");
  if (options.force && !options.once) {
    throw InvalidArgumentError("--force redoes the checkpoint --once processes: pass --once too");
  }
  const std::string train_dir = JoinPath(options.logdir, "train");
  const std::string job_dir = ProgramDir(kind, options.logdir, options.dataset);
  Distributed* dist = options.distributed;
  const bool chief = dist == nullptr || dist->rank() == 0;
  DistributedScope dist_scope(dist);
  // Experts trained sharded over ranks are all here (each rank evaluates its shard of the data
  // with the whole model): the jobs build with no mesh axes, so each such layer builds whole.
  Params params = model_params.Copy();
  if (options.once) OnceParams(params, train_dir);
  if (dist != nullptr && dist->world_size() > 1) {
    CheckSameConfiguration(*dist, params);
    ShardParamsForReplicas(params, dist->world_size(), dist->rank());  // eval: any batch
  }
  auto model = InstantiateLayer<BaseModel>(params);
  const Params& tp = model->task().train_params();
  const Params& ep = model->task().eval_params();
  RefuseUntouchedLogdir(options, ep, train_dir);
  std::unique_ptr<DirectoryLock> lock;
  if (chief) {
    CreateDirectories(job_dir);
    lock = std::make_unique<DirectoryLock>(job_dir, ".job.lock",
                                           kind == JobKind::kEval ? "evaler" : "decoder");
    RemoveStaleTempFiles(job_dir);
    CheckJobData(job_dir, JobDataText(params));
  }
  Job job{kind,
          options,
          train_dir,
          job_dir,
          dist,
          chief,
          *model,
          tp,
          ep,
          JoinPath(job_dir, "processed_ckpts.txt"),
          MakeModelEma(*model),
          tp.GetInt("max_steps"),
          ep.GetBool(kind == JobKind::kEval ? "eval_all_checkpoints" : "decode_all_checkpoints"),
          ep.GetInt(kind == JobKind::kEval ? "start_eval_after" : "start_decoder_after")};
  if (chief) job.writer = std::make_unique<EventWriter>(job_dir);
  if (chief) job.processed = ReadProcessed(job.processed_file);
  // --force: the latest checkpoint (OnceParams made it max_steps) is processed again.
  std::set<std::string> done_before;
  for (const auto& c : job.processed) {
    if (options.once && StepOf(c) >= job.max_steps) done_before.insert(c);
  }
  if (options.force) {
    for (const auto& c : done_before) job.processed.erase(c);
  }

  // eval.load_checkpoint_from: that checkpoint only (a prefix, "<dir>/ckpt-%08d"), then return.
  if (ep.IsSet("load_checkpoint_from")) {
    ProcessCheckpoint(job, ep.GetString("load_checkpoint_from"));
    if (job.writer) job.writer->Close();
    return job.count;
  }
  for (;;) {
    const bool stop = options.stop != nullptr && options.stop->load();
    if (dist != nullptr ? dist->AnyTrue(stop) : stop) break;
    if (chief ? ChiefPoll(job) : FollowerPoll(job)) break;
  }
  if (chief && options.once && job.count == 0 && !options.force && !done_before.empty()) {
    SayAlreadyProcessed(job, *done_before.rbegin());
  }
  if (job.writer) job.writer->Close();
  return job.count;
}

}  // namespace glossa
