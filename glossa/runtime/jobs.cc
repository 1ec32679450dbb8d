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
#include "glossa/runtime/checkpointer.h"
#include "glossa/runtime/data_parallel.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/metric_history.h"
#include "glossa/runtime/program.h"
#include "glossa/runtime/progress.h"

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
  std::string task = "task";
  if (!p.Contains("task")) {
    std::string main = p.GetString("main_task");
    if (main.empty()) main = p.GetParams("task_params").Keys().front();
    task = StrCat("task_params.", main);
  }
  p.Set(task + ".eval.start_eval_after", 0);
  p.Set(task + ".eval.start_decoder_after", 0);
  p.Set(task + ".eval.eval_all_checkpoints", false);
  p.Set(task + ".eval.decode_all_checkpoints", false);
  p.Set(task + ".train.max_steps", StepOf(existing.model_checkpoint_path));
}

}  // namespace

int64_t RunCheckpointJob(JobKind kind, const Params& model_params, const JobOptions& options) {
  if (options.logdir.empty()) throw InvalidArgumentError("job: --logdir is required");
  auto log = [&](const std::string& l) {
    if (options.log) {
      options.log(l);
    } else {
      std::printf("%s\n", l.c_str());
      std::fflush(stdout);
    }
  };
  auto sleep = [&](double s) {
    if (options.sleep) {
      options.sleep(s);
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(s));
    }
  };
  const std::string train_dir = JoinPath(options.logdir, "train");
  const std::string job_dir = ProgramDir(kind, options.logdir, options.dataset);
  Distributed* dist = options.distributed;
  const bool chief = dist == nullptr || dist->rank() == 0;
  DistributedScope dist_scope(dist);
  Params params = model_params.Copy();
  if (options.once) OnceParams(params, train_dir);
  if (dist != nullptr && dist->world_size() > 1) {
    CheckSameConfiguration(*dist, params);
    ShardParamsForReplicas(params, dist->world_size(), dist->rank());  // eval: any batch
  }
  auto model = InstantiateLayer<BaseModel>(params);
  const Params& tp = model->task().train_params();
  const Params& ep = model->task().eval_params();
  // A logdir no trainer has touched is most often a mistyped one: refuse it (creating nothing)
  // rather than wait forever, unless asked to wait for a run that has not started yet.
  if (!options.wait_for_train && !ep.IsSet("load_checkpoint_from") && !FileExists(train_dir) &&
      !FileExists(JoinPath(options.logdir, "control"))) {
    throw NotFoundError(StrCat("--logdir '", options.logdir,
                               "' holds no training run (it has no train/ and no control/): a "
                               "mistyped path? To wait for a run that has not started yet, pass "
                               "--wait_for_train"));
  }
  std::unique_ptr<DirectoryLock> lock;
  if (chief) {
    CreateDirectories(job_dir);
    lock = std::make_unique<DirectoryLock>(job_dir, ".job.lock",
                                           kind == JobKind::kEval ? "evaler" : "decoder");
    RemoveStaleTempFiles(job_dir);
  }
  const std::string processed_file = JoinPath(job_dir, "processed_ckpts.txt");
  const std::shared_ptr<ExponentialMovingAverage> ema = MakeModelEma(*model);
  const int64_t max_steps = tp.GetInt("max_steps");
  const bool all =
      ep.GetBool(kind == JobKind::kEval ? "eval_all_checkpoints" : "decode_all_checkpoints");
  const int64_t start_after =
      ep.GetInt(kind == JobKind::kEval ? "start_eval_after" : "start_decoder_after");
  std::unique_ptr<EventWriter> writer;
  if (chief) writer = std::make_unique<EventWriter>(job_dir);
  std::set<std::string> processed;
  if (chief) processed = ReadProcessed(processed_file);
  // Waiting for checkpoints: a line naming what the job waits for, then after each poll a
  // heartbeat once heartbeat_seconds have passed since the last line.
  double waited = -1;  // seconds waited since the last checkpoint; -1: not waiting
  double last_line = 0;
  auto wait = [&](double seconds, const std::string& newest) {
    if (waited < 0) {
      waited = 0;
      last_line = 0;
      log(StrCat(kind == JobKind::kEval ? "evaler" : "decoder", ": waiting for a new checkpoint in ",
                 train_dir, " (", newest, "; the job ends after the checkpoint at step ",
                 max_steps, ")"));
    }
    sleep(seconds);
    waited += seconds;
    if (waited - last_line >= options.heartbeat_seconds) {
      last_line = waited;
      log(StrCat("still waiting for a new checkpoint in ", train_dir, " (", FormatDuration(waited),
                 " so far; ", newest, ")"));
    }
  };
  std::set<std::string> gone;  // deleted by retention before we got to them
  int64_t count = 0;
  double backoff = 1;

  auto process = [&](const std::string& ckpt) {
    const std::string prefix =
        ckpt.find('/') != std::string::npos ? ckpt : JoinPath(train_dir, ckpt);
    // Every rank loads it; when one cannot (retention deleted it meanwhile), all skip it.
    std::optional<SafetensorsContents> contents;
    std::optional<NotFoundError> missing;
    try {
      contents = LoadCheckpoint(prefix);
    } catch (const NotFoundError& e) {
      missing = e;
    }
    if (dist != nullptr ? dist->AnyTrue(missing.has_value()) : missing.has_value()) {
      throw missing ? *missing : NotFoundError(StrCat(prefix, ": another rank could not load it"));
    }
    const int64_t checked = CheckedGlobalStep(*contents, prefix).value_or(StepOf(ckpt));
    const int64_t step = RestoreForEval(*contents, *model, ema.get()).value_or(checked);
    std::map<std::string, double> values;
    int64_t examples = 0;
    if (kind == JobKind::kEval) {
      EvalProgram eval(*model, writer.get());
      for (const auto& [k, v] : eval.Run(step)) values[k] = v.first;
      examples = eval.last_samples();
    } else {
      DecodeProgram decode(*model, writer.get());
      decode.SetProgressLog(log, options.heartbeat_seconds);
      const DecodeProgram::Result r = decode.Run(step, -1, chief ? job_dir : std::string());
      values = r.metrics;
      examples = static_cast<int64_t>(r.lines.size());
    }
    if (!chief) {
      processed.insert(ckpt);
      return step;
    }
    const std::string score_file = WriteScoreFile(job_dir, step, values);
    // The metric history early stopping reads (Lingvo's MetricHistory.ConditionalAppend).
    const std::string job = job_dir.substr(job_dir.rfind('/') + 1);
    MaybeAppendMetricHistory(tp.GetParams("early_stop"), options.logdir, job, step, values);
    // The headline: the tracked metrics this job produced, each with its best so far.
    const char* sep = " \xC2\xB7 ";  // " · "
    std::string headline;
    for (const auto& [metric, b] : TrackBestSteps(model->task().params(),
                                                   model->task().TrackedMetrics(),
                                                   options.logdir, job, step, values)) {
      char buf[128];
      std::snprintf(buf, sizeof(buf), "%s %.4f (best %.4f at step %lld)", metric.c_str(),
                    values.at(metric), b.best_value, static_cast<long long>(b.best_step));
      headline += StrCat(sep, buf);
    }
    processed.insert(ckpt);
    std::string all_processed;
    for (const auto& p : processed) all_processed += p + "\n";
    AtomicWriteFile(processed_file, all_processed);
    ++count;
    // What was evaluated, how much, and the headline; every metric is in the score file.
    log(StrCat(kind == JobKind::kEval ? "eval " : "decode ", options.dataset, sep,
               ckpt.substr(ckpt.rfind('/') + 1), " (step ", step, ")", sep, examples,
               kind == JobKind::kEval ? " examples" : " decoded", headline, sep, "all metrics: ",
               score_file));
    return step;
  };

  // eval.load_checkpoint_from: that checkpoint only (a prefix, "<dir>/ckpt-%08d"), then return.
  if (ep.IsSet("load_checkpoint_from")) {
    process(ep.GetString("load_checkpoint_from"));
    if (writer) writer->Close();
    return count;
  }
  for (;;) {
    const bool stop = options.stop != nullptr && options.stop->load();
    if (dist != nullptr ? dist->AnyTrue(stop) : stop) break;
    std::vector<std::string> todo;
    bool finished = false;
    if (!chief) {
      // Rank 0's list: "<finished>\n<checkpoint>\n...".
      const std::vector<std::string> lines = Split(dist->AllGatherStrings("")[0], '\n');
      finished = !lines.empty() && lines[0] == "1";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (!lines[i].empty()) todo.push_back(lines[i]);
      }
      for (const auto& c : todo) {
        try {
          process(c);
        } catch (const NotFoundError&) {
          gone.insert(c);
        }
      }
      if (finished) break;
      if (todo.empty()) sleep(backoff);
      backoff = todo.empty() ? std::min(backoff * 2, options.max_backoff_seconds) : 1;
      continue;
    }
    // What exists, as the trainer sees it on restore: the state file's entries whose files are
    // there and checkpoints on disk it does not list (a stale or hand-edited state file).
    CheckpointState state = ExistingCheckpoints(train_dir);
    for (const auto& c : state.all_model_checkpoint_paths) {
      if (!processed.count(c) && !gone.count(c) && StepOf(c) >= start_after) todo.push_back(c);
    }
    // Without *_all_checkpoints only the newest checkpoint matters, processed or not; one
    // deleted under us is not retried (the next poll sees what replaced it).
    if (!all) {
      const auto& paths = state.all_model_checkpoint_paths;
      todo.clear();
      if (!paths.empty() && !processed.count(paths.back()) && !gone.count(paths.back()) &&
          StepOf(paths.back()) >= start_after) {
        todo.push_back(paths.back());
      }
    }
    // Done once the final checkpoint has been processed (in an earlier run, or now).
    for (const auto& c : processed) {
      if (StepOf(c) >= max_steps) finished = true;
    }
    for (const auto& c : todo) {
      if (StepOf(c) >= max_steps) finished = true;
    }
    if (dist != nullptr) {
      std::string list = finished ? "1" : "0";
      for (const auto& c : todo) list += "\n" + c;
      dist->AllGatherStrings(list);
    }
    for (const auto& c : todo) {
      // Retention may delete a checkpoint between reading the state file and loading it (the
      // trainer keeps the latest N): skip it and go on.
      try {
        if (process(c) >= max_steps) finished = true;
      } catch (const NotFoundError& e) {
        if (!SafetensorsFiles(JoinPath(train_dir, c)).empty() && dist == nullptr) throw;
        log(StrCat("skipped ", c, ": removed by the trainer's retention before it was ",
                   kind == JobKind::kEval ? "evaluated" : "decoded", " (", e.message(), ")"));
        gone.insert(c);
      }
    }
    if (finished) break;
    if (options.once && todo.empty()) {
      throw NotFoundError(StrCat(
          "--once: no checkpoint left to ",
          kind == JobKind::kEval ? "evaluate" : "decode", " in ", train_dir,
          state.all_model_checkpoint_paths.empty()
              ? std::string(" (none exists)")
              : StrCat(" (newest ", state.all_model_checkpoint_paths.back(), ", step ",
                       StepOf(state.all_model_checkpoint_paths.back()), ", is before step ",
                       max_steps, " or could not be loaded)")));
    }
    if (todo.empty()) {
      wait(backoff, state.all_model_checkpoint_paths.empty()
                        ? std::string("none yet")
                        : StrCat("newest ", state.all_model_checkpoint_paths.back()));
      backoff = std::min(backoff * 2, options.max_backoff_seconds);
    } else {
      backoff = 1;
      waited = -1;
    }
  }
  if (writer) writer->Close();
  return count;
}

}  // namespace glossa
