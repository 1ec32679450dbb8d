#include "glossa/runtime/program.h"

#include <ATen/ATen.h>

#include <cctype>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <optional>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/runtime/data_parallel.h"
#include "glossa/runtime/distributed.h"
#include "glossa/base/progress.h"
#include "glossa/summary/summary.h"

namespace glossa {

void MetricsAccumulator::Add(const Metrics& metrics) {
  for (const auto& [name, m] : metrics) {
    const double w = m.weight.defined() ? m.weight.item<double>() : 1.0;
    auto& s = sums_[name];
    s.first += m.value.item<double>() * w;
    s.second += w;
  }
}

std::map<std::string, std::pair<double, double>> MetricsAccumulator::Means() const {
  std::map<std::string, std::pair<double, double>> out;
  for (const auto& [name, s] : sums_) out[name] = {s.first / std::max(s.second, 1e-12), s.second};
  return out;
}

std::string FormatStepLine(int64_t step, double steps_per_sec, double examples_per_sec,
                           const std::map<std::string, std::pair<double, double>>& metrics) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "step: %ld, steps/sec: %.2f, examples/sec: %.1f",
                static_cast<long>(step), steps_per_sec, examples_per_sec);
  std::string line = buf;
  auto add = [&](const std::string& name, double v) {
    std::snprintf(buf, sizeof(buf), ", %s: %.4f", name.c_str(), v);
    line += buf;
  };
  if (metrics.count("loss")) add("loss", metrics.at("loss").first);
  for (const auto& [name, m] : metrics) {
    if (name != "loss" && name != "num_samples_in_batch") add(name, m.first);
  }
  return line;
}

void WriteSummaries(EventWriter& writer, const std::map<std::string, at::Tensor>& summaries,
                    int64_t step) {
  for (const auto& [tag, value] : summaries) {
    if (value.numel() == 1) {
      writer.WriteScalar(tag, value.to(at::kDouble).item<double>(), step);
    } else if (value.numel() > 0) {
      writer.WriteHistogram(tag, value, step);
    }
  }
}

std::string ProgramDir(JobKind kind, const std::string& logdir, const std::string& dataset) {
  std::string lower = dataset;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return JoinPath(logdir, StrCat(kind == JobKind::kEval ? "eval_" : "decoder_", lower));
}

namespace {

// Adds per-example summaries to a step's per-example outputs (InvalidArgument on a name clash).
void AddPerExampleSummaries(std::map<std::string, at::Tensor> summaries, NestedMap& out,
                            const std::string& what) {
  for (auto& [key, value] : summaries) {
    if (out.Has(key)) {
      throw InvalidArgumentError(StrCat("per-example summary '", key, "' has the name of one of ",
                                        what, "'s per-example outputs"));
    }
    out.Put(key, std::move(value));
  }
}

constexpr const char* kTokensKey = "__num_tokens__";

// Non-padding tokens of a batch and the cells that hold them: "tgt.paddings" (a translation
// target), else "paddings".
std::pair<double, double> CountTokens(const NestedMap& batch) {
  for (const char* key : {"tgt.paddings", "paddings"}) {
    if (batch.Has(key)) {
      const at::Tensor p = batch.GetTensor(key);
      const double cells = static_cast<double>(p.numel());
      return {cells - p.sum().item<double>(), cells};
    }
  }
  return {0, 0};
}

// The step's metrics over all ranks: weighted means, one small allreduce (every rank runs the
// same model, so the names agree). num_samples_in_batch is summed: the global batch.
void ReduceStepMetrics(Distributed& d, Metrics& metrics) {
  at::Tensor packed = at::zeros({static_cast<int64_t>(2 * metrics.size())}, at::kDouble);
  auto a = packed.accessor<double, 1>();
  int64_t i = 0;
  for (const auto& [k, m] : metrics) {
    const double w = m.weight.defined() ? m.weight.item<double>() : 1.0;
    a[2 * i] = m.value.item<double>() * w;
    a[2 * i + 1] = w;
    ++i;
  }
  d.AllReduceSum({packed});
  i = 0;
  for (auto& [k, m] : metrics) {
    const double sum = a[2 * i], w = a[2 * i + 1];
    ++i;
    if (k == "num_samples_in_batch" || k == kTokensKey) {
      m.value = at::scalar_tensor(sum / std::max(w, 1e-12) * d.world_size(), at::kDouble);
      m.weight = at::scalar_tensor(1.0, at::kDouble);
      continue;
    }
    m.value = at::scalar_tensor(w != 0 ? sum / w : 0.0, at::kDouble);
    m.weight = at::scalar_tensor(w, at::kDouble);
  }
}

// Scalar summaries averaged over ranks (each rank's loop mean counts once); others stay this
// rank's (histograms of the chief's shard).
void ReduceScalarSummaries(Distributed& d, std::map<std::string, at::Tensor>& summaries) {
  std::map<std::string, std::pair<double, double>> scalars;
  for (const auto& [k, v] : summaries) {
    if (v.numel() == 1) scalars[k] = {v.to(at::kDouble).item<double>(), 1.0};
  }
  for (const auto& [k, m] : d.GatherWeighted(scalars)) {
    summaries[k] = at::scalar_tensor(m.first, at::kDouble);
  }
}

// Per-rank share of a sample count (eval and decode shards).
int64_t ShareOf(int64_t samples) {
  Distributed* d = CurrentBatchGroup();
  if (d == nullptr || samples <= 0) return samples;
  return (samples + d->world_size() - 1) / d->world_size();
}

}  // namespace

TrainProgram::TrainProgram(BaseModel& model, EventWriter* writer, ExponentialMovingAverage* ema,
                           std::function<void(const std::string&)> log)
    : model_(model), writer_(writer), ema_(ema), log_(std::move(log)) {
  for (const auto& [info, t] : model_.AllVariables()) {
    if (info.trainable) total_num_params_ += t.numel();
  }
}

namespace {

// A batch without examples: no tensors, or a batch dimension of 0 on every tensor that has one.
// Trained on, its loss is NaN (a mean over nothing) and every step would be skipped as if training
// had diverged; say what it is instead.
void CheckBatchNotEmpty(const NestedMap& batch, BaseTask& task, int64_t step) {
  bool any_tensor = false;
  for (const auto& v : batch.Flatten()) {
    if (!v.is_tensor()) continue;
    any_tensor = true;
    if (v.AsTensor().dim() == 0 || v.AsTensor().size(0) > 0) return;
  }
  std::string why = any_tensor ? "every tensor in it has 0 rows" : "it holds no tensors";
  const Params& ip = task.input().params();
  if (ip.Contains("batch_size") && ip.Get("batch_size").kind() == ParamValue::Kind::kInt) {
    why += StrCat("; the input's batch_size is ", ip.GetInt("batch_size"),
                  ip.GetInt("batch_size") <= 0 ? " (its default is 0: set it)" : "");
  }
  throw InvalidArgumentError(StrCat("task '", task.path(), "': the training batch at step ", step,
                                    " is empty (", why, "): input '", task.input().path(),
                                    "' produced no examples"));
}

// Each task's learner updates that task's variables (all of a single-task model's).
std::map<const BaseTask*, std::vector<LearnerVariable>> TaskVariables(BaseModel& model,
                                                                      bool multi) {
  std::map<const BaseTask*, std::vector<LearnerVariable>> task_vars;
  if (!multi) {
    task_vars[&model.task()] = LearnerVariables(model);
  } else {
    for (const auto& name : model.task_names()) {
      const BaseTask& t = model.GetTask(name);
      task_vars[&t] = LearnerVariables(t);
    }
  }
  return task_vars;
}

// Takes the task's next training batch into `batch`; false when the input is exhausted. With
// several ranks they agree on the end of the data, so that every rank runs the same steps.
bool TakeBatchOnEveryRank(BaseTask& task, Distributed* dist, NestedMap& batch) {
  bool exhausted = false;
  try {
    batch = task.input().TakeTrainBatch();
  } catch (const OutOfRangeError&) {
    exhausted = true;
  }
  exhausted = !ShareBatchOverPipe(task.build_context().axis("pipe"), !exhausted, batch);
  return !(dist != nullptr ? dist->AnyTrue(exhausted) : exhausted);
}

// Completes a step's metrics: the learner's added, all detached, reduced over the ranks (with the
// batch's tokens) and, in a multi-task model, named "<task>/<metric>" plus the step's loss as
// "loss". Returns the step's non-padding tokens (over every rank).
double CompleteStepMetrics(Metrics& metrics, const Metrics& learner_metrics,
                           const NestedMap& batch, BaseTask& task, bool multi, Distributed* dist) {
  for (const auto& [k, v] : learner_metrics) metrics[k] = v;
  for (auto& [k, v] : metrics) v.value = v.value.detach();
  auto [tokens, cells] = CountTokens(batch);
  // How full the batches are: bucketing pads to the longest of a batch, packing to the longest row.
  if (cells > 0) {
    metrics["input_nonpad_fraction"] = Metric{at::scalar_tensor(tokens / cells, at::kDouble),
                                              at::scalar_tensor(cells, at::kDouble)};
  }
  if (dist != nullptr) {
    metrics[kTokensKey] = Metric{at::scalar_tensor(tokens, at::kDouble),
                                 at::scalar_tensor(1.0, at::kDouble)};
    ReduceStepMetrics(*dist, metrics);
    tokens = metrics.at(kTokensKey).value.item<double>();
    metrics.erase(kTokensKey);
  }
  if (multi) {  // "<task>/<metric>", plus the step's loss as "loss"
    Metrics prefixed;
    for (auto& [k, v] : metrics) prefixed[task.params().GetString("name") + "/" + k] = v;
    prefixed["loss"] = metrics.at("loss");
    prefixed["num_samples_in_batch"] = metrics.at("num_samples_in_batch");
    metrics = std::move(prefixed);
  }
  return tokens;
}

}  // namespace

// What one RunLoop keeps over its steps: its settings, its result, and what the steps add up for
// the loop's metrics, outfeed and summaries.
struct TrainProgram::LoopState {
  bool multi;
  int64_t max_steps;
  int64_t steps_per_loop;
  int64_t summary_every;
  int64_t max_skipped;
  LoopResult& result;
  // What layers record during the loop's steps, reduced over the loop (Lingvo's tpu_summary
  // context with its while-loop rewrite).
  SummaryContext& summaries;
  MetricsAccumulator metrics = {};
  std::map<BaseTask*, std::vector<NestedMap>> outfeed = {};
  int64_t examples = 0;
  double tokens = 0;
  std::map<std::string, std::vector<at::Tensor>> per_example = {};  // also written as histograms
  bool summary_step_seen = false;  // a step of the loop wrote its scalars
};

TrainProgram::LoopResult TrainProgram::RunLoop(int64_t* global_step,
                                               const std::function<bool()>& stop) {
  const Params& tp = model_.task().train_params();
  const bool multi = model_.is_multi_task();
  const int64_t max_steps = tp.GetInt("max_steps");
  const int64_t steps_per_loop = std::max<int64_t>(1, tp.GetInt("steps_per_loop"));
  const int64_t summary_every = std::max<int64_t>(1, tp.GetInt("summary_interval_steps"));
  const int64_t max_skipped = tp.GetInt("max_consecutive_skipped_steps");
  LoopResult result;
  const std::map<const BaseTask*, std::vector<LearnerVariable>> task_vars =
      TaskVariables(model_, multi);
  SummaryContext summaries;
  std::optional<SummaryLoop> summary_loop(std::in_place);
  LoopState loop{multi, max_steps, steps_per_loop, summary_every, max_skipped, result, summaries};
  const auto start = std::chrono::steady_clock::now();
  while (result.steps < steps_per_loop) {
    if (*global_step >= max_steps) {  // Lingvo checks before each step
      result.reached_max_steps = true;
      break;
    }
    // With several ranks they agree on stopping and on the end of the data before each step, so
    // that every rank runs the same steps (and the same collectives).
    Distributed* dist = CurrentDistributed();
    if (dist != nullptr ? dist->AnyTrue(stop && stop()) : (stop && stop())) break;
    BaseTask& task = model_.SampleTask(*global_step);
    const auto& vars = task_vars.at(&task);
    // The input sees the step its batch is for (a dataset may key its batches on it): not the
    // step the last loop, or the last run in this process, ended on.
    SetGlobalStep(*global_step);
    NestedMap batch;
    if (!TakeBatchOnEveryRank(task, dist, batch)) {
      result.input_exhausted = true;
      break;
    }
    CheckBatchNotEmpty(batch, task, *global_step);
    TrainStep(loop, task, vars, batch, global_step);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  summary_loop.reset();  // reduces the loop's summaries
  FinishLoop(loop, secs, *global_step);
  return result;
}

// One step of `task` on `batch` at *global_step: FProp, the learner's update and the EMA; the
// step's metrics and per-example outputs join the loop's, the step's scalars are written on a
// summary step, and too many skipped steps in a row end the run (TrainingDivergedError).
void TrainProgram::TrainStep(LoopState& loop, BaseTask& task,
                             const std::vector<LearnerVariable>& vars, const NestedMap& batch,
                             int64_t* global_step) {
  LoopResult& result = loop.result;
  GlobalStepContext step_context(*global_step);
  SetGlobalStep(*global_step);
  BaseTask::FPropResult r = task.FPropDefaultTheta(batch);
  Metrics metrics = r.metrics;
  metrics["loss"].value = r.metrics.at("loss").value.detach();
  // var_norm/all only where it is seen: a summary step, or the loop's last (the console line).
  // (Not whether this rank writes: every rank must compute the same metrics.)
  const bool summary_step = *global_step + 1 - last_summary_step_ >= loop.summary_every;
  const bool last_step =
      result.steps + 1 == loop.steps_per_loop || *global_step + 1 >= loop.max_steps;
  Metrics learner_metrics = task.learner().Apply(
      {{task.learner().loss_name(), Metric{r.loss, r.metrics.at("loss").weight}}}, vars,
      *global_step, summary_step || last_step);
  if (ema_) ema_->Apply(*global_step);
  const bool skipped = task.learner().last_step_skipped();
  consecutive_skipped_ = skipped ? consecutive_skipped_ + 1 : 0;
  if (skipped) {
    ++result.skipped_steps;
    ++total_skipped_;
  }
  loop.tokens +=
      CompleteStepMetrics(metrics, learner_metrics, batch, task, loop.multi, CurrentBatchGroup());
  loop.metrics.Add(metrics);
  NestedMap step_outfeed = r.per_example.Transform(
      [](const NestedValue& v) -> NestedValue { return v.AsTensor().detach(); });
  std::map<std::string, at::Tensor> step_per_example = loop.summaries.TakePerExample();
  for (const auto& [k, v] : step_per_example) loop.per_example[k].push_back(v.reshape({-1}));
  AddPerExampleSummaries(std::move(step_per_example), step_outfeed,
                         StrCat("task '", task.path(), "'"));
  if (!step_outfeed.empty()) loop.outfeed[&task].push_back(std::move(step_outfeed));
  const int64_t n = static_cast<int64_t>(
      std::llround(metrics.at("num_samples_in_batch").value.item<double>()));
  loop.examples += n;
  total_samples_ += n;
  ++*global_step;
  ++result.steps;
  if (on_step_) on_step_(*global_step);
  if (*global_step - last_summary_step_ >= loop.summary_every) {
    last_summary_step_ = *global_step;
  }
  if (last_summary_step_ == *global_step) loop.summary_step_seen = true;
  if (writer_ && last_summary_step_ == *global_step) {
    for (const auto& [k, v] : metrics)
      writer_->WriteScalar(k, v.value.item<double>(), *global_step);
    writer_->WriteScalar("total_samples", static_cast<double>(total_samples_), *global_step);
    writer_->WriteScalar("total_num_params", static_cast<double>(total_num_params_),
                         *global_step);
  }
  if (loop.max_skipped > 0 && consecutive_skipped_ >= loop.max_skipped) {
    if (writer_) {
      writer_->WriteScalar("skipped_steps", static_cast<double>(total_skipped_), *global_step);
      writer_->Flush();
    }
    throw TrainingDivergedError(StrCat(
        "training diverged: ", consecutive_skipped_,
        " consecutive steps were skipped (non-finite loss or gradients, or a gradient norm over "
        "grad_norm_to_clip_to_zero), the last at step ", *global_step - 1, " with loss ",
        PyFloatRepr(metrics.at("loss").value.to(at::kDouble).item<double>()),
        " (task.train.max_consecutive_skipped_steps: ", loop.max_skipped,
        "); lower the learning rate or clip the gradients"));
  }
}

// The end of a loop that took `secs` (its summaries reduced): the loop's means and rates; after
// steps, its events and summaries, Lingvo's step line, and each task's ProcessFPropResults.
void TrainProgram::FinishLoop(LoopState& loop, double secs, int64_t global_step) {
  LoopResult& result = loop.result;
  result.metrics = loop.metrics.Means();
  result.steps_per_sec = result.steps / std::max(secs, 1e-9);
  result.examples_per_sec = loop.examples / std::max(secs, 1e-9);
  result.tokens_per_sec = loop.tokens / std::max(secs, 1e-9);
  if (result.steps > 0) {
    if (writer_ && !loop.summary_step_seen) {
      // No step of the loop was a summary step (a run shorter than summary_interval_steps, a
      // stop, loops shorter than the interval): the loop's metrics as its console line shows
      // them, the means over the loop, so that every loop's loss is on record.
      for (const auto& [k, mean_weight] : result.metrics)
        writer_->WriteScalar(k, mean_weight.first, global_step);
      writer_->WriteScalar("total_samples", static_cast<double>(total_samples_), global_step);
    }
    if (writer_) {
      writer_->WriteScalar("global_step/sec", result.steps_per_sec, global_step);
      writer_->WriteScalar("examples/sec", result.examples_per_sec, global_step);
      // Non-padding tokens a second (the padding of a bucketed or packed batch left out).
      if (result.tokens_per_sec > 0) {
        writer_->WriteScalar("tokens/sec", result.tokens_per_sec, global_step);
      }
      writer_->WriteScalar("skipped_steps", static_cast<double>(total_skipped_), global_step);
    }
    std::map<std::string, at::Tensor> all = loop.summaries.MergeAll();
    if (Distributed* d = CurrentBatchGroup()) ReduceScalarSummaries(*d, all);
    if (writer_) {
      for (auto& [k, v] : loop.per_example) all[k] = at::cat(v);
      WriteSummaries(*writer_, all, global_step);
      writer_->Flush();  // every loop's events reach the disk, whatever kills the run next
    }
    if (log_) {
      std::string line =
          FormatStepLine(global_step, result.steps_per_sec, result.examples_per_sec,
                         result.metrics);
      if (total_skipped_ > 0) {
        line += StrCat(", skipped_steps: ", result.skipped_steps, " (", total_skipped_,
                       " in this run)");
      }
      log_(line);
    }
    for (auto& [t, feed] : loop.outfeed) t->ProcessFPropResults(global_step, result.metrics, feed);
  }
}

EvalProgram::EvalProgram(BaseModel& model, EventWriter* writer) : model_(model), writer_(writer) {}

std::map<std::string, std::pair<double, double>> EvalProgram::Run(int64_t global_step,
                                                                  int64_t max_batches) {
  BaseTask& task = model_.task();
  try {
    task.input().Reset();
  } catch (const UnimplementedError&) {
  }
  const int64_t want = ShareOf(task.eval_params().GetInt("samples_per_summary"));
  EvalModeScope eval;
  at::NoGradGuard no_grad;
  GlobalStepContext step(global_step);
  MetricsAccumulator acc;
  SummaryContext summaries;
  std::optional<SummaryLoop> summary_loop(std::in_place);
  std::map<std::string, std::vector<at::Tensor>> per_example;
  int64_t samples = 0, batches = 0;
  while ((want <= 0 || samples < want) && (max_batches < 0 || batches++ < max_batches)) {
    NestedMap batch;
    bool have = true;
    try {
      batch = task.input().GetPreprocessedInputBatch();
    } catch (const OutOfRangeError&) {
      have = false;
    }
    if (!ShareBatchOverPipe(task.build_context().axis("pipe"), have, batch)) break;
    BaseTask::FPropResult r = task.FPropDefaultTheta(batch);
    acc.Add(r.metrics);
    samples += static_cast<int64_t>(r.metrics.at("num_samples_in_batch").value.item<double>());
    for (auto& [k, v] : summaries.TakePerExample()) per_example[k].push_back(v.reshape({-1}));
  }
  summary_loop.reset();
  auto means = acc.Means();
  std::map<std::string, at::Tensor> all = summaries.MergeAll();
  Distributed* d = CurrentBatchGroup();
  if (d != nullptr) {
    // Each rank evaluated its shard: weighted means over all (Lingvo's TpuEvalMetrics).
    means = d->GatherWeighted(means);
    ReduceScalarSummaries(*d, all);
  }
  last_samples_ = 0;
  if (auto it = means.find("num_samples_in_batch"); it != means.end()) {
    last_samples_ = std::llround(it->second.first * it->second.second);
    if (d != nullptr) it->second.first *= d->world_size();  // per global batch
  }
  if (writer_) {
    for (const auto& [k, v] : means) writer_->WriteScalar(k, v.first, global_step);
    for (auto& [k, v] : per_example) all[k] = at::cat(v);
    WriteSummaries(*writer_, all, global_step);
    writer_->Flush();
  }
  return means;
}

DecodeProgram::DecodeProgram(BaseModel& model, EventWriter* writer)
    : model_(model), writer_(writer) {}

std::string WriteScoreFile(const std::string& dir, int64_t step,
                           const std::map<std::string, double>& values) {
  std::string score;
  for (const auto& [k, v] : values) score += StrCat(k, ": ", PyFloatRepr(v), "\n");
  char name[64];
  std::snprintf(name, sizeof(name), "score-%08lld.txt", static_cast<long long>(step));
  const std::string path = JoinPath(dir, name);
  AtomicWriteFile(path, score);
  return path;
}

DecodeProgram::Result DecodeProgram::Run(int64_t global_step, int64_t max_batches,
                                         const std::string& out_dir) {
  BaseTask& task = model_.task();
  try {
    task.input().Reset();
  } catch (const UnimplementedError&) {
  }
  EvalModeScope eval;
  at::NoGradGuard no_grad;
  GlobalStepContext step(global_step);
  ResetStepSeed();
  Result r;
  r.metrics = task.CreateDecoderMetrics();
  Distributed* dist = CurrentBatchGroup();
  const int64_t want_samples = ShareOf(task.eval_params().GetInt("decoder_samples_per_summary"));
  int64_t samples = 0;
  SummaryContext summaries;
  std::optional<SummaryLoop> summary_loop(std::in_place);
  std::vector<NestedMap> outs;  // with several ranks: this rank's, gathered below
  const auto start = std::chrono::steady_clock::now();
  double last_line = 0;
  auto progress = [&] {
    if (!progress_log_) return;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (secs - last_line < progress_every_) return;
    last_line = secs;
    progress_log_(StrCat("decoding at step ", global_step, ": ", r.batches, " batches, ", samples,
                         " examples, ", FormatDuration(secs)));
  };
  while (max_batches < 0 || r.batches < max_batches) {
    if (want_samples > 0 && samples >= want_samples) break;
    NestedMap batch;
    try {
      batch = task.input().GetPreprocessedInputBatch();
    } catch (const OutOfRangeError&) {
      break;
    }
    NestedMap out = task.Decode(batch);
    AddPerExampleSummaries(summaries.TakePerExample(), out,
                           StrCat("task '", task.path(), "' Decode"));
    ++r.batches;
    if (dist != nullptr) {
      const std::vector<at::Tensor> flat = out.FlattenTensors();
      samples += !flat.empty() && flat.front().dim() > 0 ? flat.front().size(0) : 1;
      outs.push_back(std::move(out));
      progress();
      continue;
    }
    std::vector<std::string> lines = task.PostProcessDecodeOut(out, r.metrics);
    samples += static_cast<int64_t>(lines.size());
    r.lines.insert(r.lines.end(), lines.begin(), lines.end());
    progress();
  }
  if (dist != nullptr) {
    // Corpus metrics (BLEU) need every hypothesis: every rank post-processes every rank's
    // outputs, in rank order, so all agree on the metrics.
    for (const std::string& bytes : dist->AllGatherStrings(SerializeNestedMaps(outs))) {
      for (const NestedMap& out : DeserializeNestedMaps(bytes)) {
        std::vector<std::string> lines = task.PostProcessDecodeOut(out, r.metrics);
        r.lines.insert(r.lines.end(), lines.begin(), lines.end());
      }
    }
  }
  summary_loop.reset();
  task.DecodeFinalize(r.metrics);
  if (writer_) {
    for (const auto& [k, v] : r.metrics) writer_->WriteScalar(k, v, global_step);
    WriteSummaries(*writer_, summaries.MergeAll(), global_step);
    writer_->Flush();
  }
  if (!out_dir.empty() && IsChief()) {
    char name[64];
    std::snprintf(name, sizeof(name), "decoder_out_%09lld", static_cast<long long>(global_step));
    std::string text;
    for (const auto& l : r.lines) text += l + "\n";
    AtomicWriteFile(JoinPath(out_dir, name), text);
  }
  return r;
}

}  // namespace glossa
