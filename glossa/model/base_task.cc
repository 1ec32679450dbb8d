#include "glossa/model/base_task.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/summary/summary.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"

namespace glossa {

glossa::Params BaseTask::TrainParams() {
  glossa::Params tp;
  tp.Define("max_steps", 4000000, "Maximum number of training steps.");
  tp.Define("steps_per_loop", 100, "Training steps per train-program loop.");
  {
    // Lingvo's EarlyStop with its MetricHistory (glossa/model/metric_history.h).
    glossa::Params history;
    history.Define("jobname", "eval_dev", "The job whose metric is tracked, e.g. eval_dev.");
    history.Define("metric", "log_pplx", "The metric tracked.");
    history.Define("minimize", true,
                   "If True, training minimizes the metric. If False, training maximizes the "
                   "metric.");
    glossa::Params es;
    es.Define("window", 0,
              "Stop training when the last evaluated step is more than this past the best; 0: "
              "never (and no history is written).");
    es.Define("tolerance", 0.0, "An improvement must exceed this to make a new best step.");
    es.Define("min_steps", 0, "Do not stop before this step.");
    es.Define("verbose", true, "Log each early-stop check.");
    es.Define("metric_history", history,
              "<logdir>/<jobname>/<metric>.history.txt, appended by that evaler or decoder.");
    tp.Define("early_stop", es, "Early stopping on a metric history (Lingvo's EarlyStop).");
  }
  tp.Define("max_consecutive_skipped_steps", 100,
            "Stop with an error (training diverged) after this many consecutive steps whose "
            "update was skipped: a non-finite loss or gradient, or a gradient norm over "
            "grad_norm_to_clip_to_zero. 0 never stops.");
  tp.Define("max_skipped_steps_fraction", 0.5,
            "A run that skipped more than this fraction of its steps, or whose last step was "
            "skipped, ends with an error (training diverged) and no final save.");
  tp.Define("learner", Learner::Params(), "The learner (optimizer, schedule, clipping, ...).");
  tp.Define("save_interval_seconds", 600, "Save a checkpoint roughly this often.");
  tp.Define("save_interval_steps", nullptr,
            "Save a checkpoint every this many steps; supersedes save_interval_seconds.");
  tp.Define("save_max_to_keep", 100, "Maximum number of recent checkpoints to keep.");
  tp.Define("save_keep_checkpoint_every_n_hours", 0.5,
            "Also keep a checkpoint every this many hours.");
  tp.Define("async_checkpointing", true, "Write checkpoints in a background thread.");
  tp.Define("checkpoint_finite_check", true, "Refuse checkpoints with NaN or Inf variables.");
  tp.Define("summary_interval_steps", 100, "Write summaries roughly every this many steps.");
  tp.Define("ema_decay", 0.0, "If > 0, keep an exponential moving average with this decay.");
  tp.Define("ema_schedule", nullptr, "EMA decay schedule over the global step.");
  tp.Define("init_from_checkpoint_rules", ParamValue::Dict{},
            "{checkpoint path or dir: [[(var_regex, name_format), ...], [ignore_regex, ...]]}: "
            "warm-start variables when the train directory has no checkpoint yet.");
  return tp;
}

glossa::Params BaseTask::EvalParams() {
  glossa::Params ep;
  ep.Define("samples_per_summary", 1000, "Eval samples per summary; 0 means the whole eval set.");
  ep.Define("decoder_samples_per_summary", 0, "Decoder samples per summary; 0: the whole set.");
  ep.Define("load_checkpoint_from", nullptr, "If set, evaluate this checkpoint only.");
  ep.Define("eval_all_checkpoints", false, "Evaluate every checkpoint, not just the newest.");
  ep.Define("decode_all_checkpoints", false, "Decode every checkpoint, not just the newest.");
  ep.Define("start_eval_after", 0, "Start evaluating after this step.");
  ep.Define("start_decoder_after", 0, "Start decoding after this step.");
  ep.Define("best_step_metric", nullptr,
            "The metric whose best step the evaler and decoder track (None: the task's own, "
            "BaseTask::TrackedMetrics: log_pplx for evals, corpus_bleu for translation).");
  ep.Define("best_step_maximize", false, "With best_step_metric: higher is better.");
  ep.Define("best_step_tolerance", 0.0,
            "A new best must beat the previous one by more than this (Lingvo's BestStep).");
  return ep;
}

glossa::Params BaseTask::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("name", "task");
  p.Define("input", nullptr, "Input generator Params.");
  p.Define("encoder", nullptr, "Encoder Params.");
  p.Define("decoder", nullptr, "Decoder Params.");
  p.Define("num_splits", 1, "Number of towers each batch is split into.");
  p.Define("train", TrainParams(), "Params to control how this task is trained.");
  p.Define("eval", EvalParams(), "Params to control how this task is evaluated.");
  return p;
}

BaseTask::BaseTask(const glossa::Params& p) : BaseLayer(p) {
  if (params().IsSet("input")) CreateChild("input", params().GetParams("input"));
  num_splits_ = params().GetInt("num_splits");
  if (num_splits_ < 1) {
    throw InvalidArgumentError(StrCat("task '", path(), "': num_splits must be >= 1"));
  }
  learner_ = train_params().GetParams("learner").Instantiate<Learner>();
}

Metrics CombineMetrics(const std::vector<Metrics>& towers) {
  Metrics out;
  if (towers.empty()) return out;
  for (const auto& [name, first] : towers[0]) {
    at::Tensor weighted = at::zeros({}, at::kDouble), weight = at::zeros({}, at::kDouble);
    for (const auto& t : towers) {
      auto it = t.find(name);
      if (it == t.end()) {
        throw InvalidArgumentError(StrCat("metric '", name, "' is missing from a tower"));
      }
      const at::Tensor w = it->second.weight.to(at::kDouble);
      weighted = weighted + it->second.value.to(at::kDouble) * w;
      weight = weight + w;
    }
    out[name] = Metric{weighted / at::clamp_min(weight, 1e-12), weight};
  }
  return out;
}

BaseTask::FPropResult BaseTask::FProp(const NestedMap& theta, const NestedMap& batch) const {
  const int64_t n = num_splits_;
  std::vector<NestedMap> towers =
      n == 1 ? std::vector<NestedMap>{batch} : BaseInputGenerator::SplitInputBatch(batch, n);
  std::vector<Metrics> tower_metrics;
  FPropResult result;
  std::vector<NestedMap> per_example;
  bool added_samples = false;
  for (const auto& tower : towers) {
    ResetStepSeed();
    TpuSummaryTensorContext tpu_summary_tensors;
    NestedMap predictions = ComputePredictions(theta, tower);
    LossOutput out = ComputeLoss(theta, predictions, tower);
    // What the layers added with summary::AddTpuSummaryTensor, as (value, weight) metrics.
    for (auto& [key, vw] : summary::GetTpuSummaryTensors()) {
      if (out.metrics.count(key)) {
        throw InvalidArgumentError(StrCat("task '", path(), "': tpu summary tensor '", key,
                                          "' has the name of one of ComputeLoss's metrics"));
      }
      out.metrics[key] = Metric{vw.first.detach().to(at::kDouble), vw.second};
    }
    if (!out.metrics.count("loss")) {
      throw InvalidArgumentError(StrCat("task '", path(), "': ComputeLoss must report 'loss'"));
    }
    if (!out.metrics.count("num_samples_in_batch")) {
      added_samples = true;
      int64_t samples = 0;
      for (const auto& v : tower.Flatten()) {
        if (v.is_tensor() && v.AsTensor().dim() > 0) {
          samples = v.AsTensor().size(0);
          break;
        }
      }
      out.metrics["num_samples_in_batch"] = Metric{
          at::full({}, static_cast<double>(samples), at::kDouble), at::ones({}, at::kDouble)};
    }
    at::Tensor tower_loss = out.metrics.at("loss").value;
    result.loss = result.loss.defined() ? result.loss + tower_loss : tower_loss;
    tower_metrics.push_back(out.metrics);
    per_example.push_back(out.per_example);
  }
  result.metrics = CombineMetrics(tower_metrics);
  if (!per_example.empty() && !per_example[0].empty()) {
    std::vector<std::vector<at::Tensor>> columns;
    for (const auto& pe : per_example) {
      auto flat = pe.FlattenTensors();
      if (columns.empty()) columns.resize(flat.size());
      for (size_t i = 0; i < flat.size(); ++i) columns[i].push_back(flat[i]);
    }
    std::vector<at::Tensor> merged;
    for (auto& c : columns) merged.push_back(at::cat(c, 0));
    result.per_example = per_example[0].Pack(merged);
  }
  if (added_samples) {
    // The number of samples we added sums over towers (each tower had weight 1).
    auto& samples = result.metrics.at("num_samples_in_batch");
    samples.value = samples.value * samples.weight;
  }
  return result;
}

std::string BaseTask::Report(const ReportInputs& in) {
  std::string out = StrCat(in.model_key, " step ", in.global_step, " on ", in.dataset, ":\n");
  for (const auto& [name, m] : in.eval_metrics) {
    out += StrCat("  ", name, ": ", PyFloatRepr(m.first), "\n");
  }
  if (!in.decode_lines.empty()) out += "decoded:\n";
  for (int64_t i = 0; i < in.num_samples && i < static_cast<int64_t>(in.decode_lines.size()); ++i) {
    out += StrCat("  ", in.decode_lines[static_cast<size_t>(i)], "\n");
  }
  return out;
}

TaskInputScope::TaskInputScope(BaseTask& task, BaseInputGenerator& input)
    : task_(task), previous_(task.input_override_) {
  task_.input_override_ = &input;
}

TaskInputScope::~TaskInputScope() { task_.input_override_ = previous_; }

NestedMap BaseTask::Decode(const NestedMap&) {
  throw UnimplementedError(StrCat("task '", path(), "' does not implement Decode"));
}

std::vector<std::string> BaseTask::PostProcessDecodeOut(const NestedMap&,
                                                        std::map<std::string, double>&) {
  throw UnimplementedError(StrCat("task '", path(), "' does not implement PostProcessDecodeOut"));
}

std::vector<std::string> BaseTask::ExportTorchScript(const std::string&) const {
  throw UnimplementedError(StrCat("task '", path(), "' has no TorchScript export"));
}

std::vector<std::string> BaseTask::ExportOnnx(const std::string&) const {
  throw UnimplementedError(StrCat("task '", path(), "' has no ONNX export"));
}

InferenceMap BaseTask::RunInference(const NestedMap&, const std::string& subgraph,
                                    const InferenceMap&, const BaseTokenizer*) const {
  throw UnimplementedError(StrCat("task '", path(), "' has no inference subgraph '", subgraph,
                                  "': a task computes the subgraphs its Inference() declares in "
                                  "RunInference() (see TransformerLmTask); docs/inference.md"));
}

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature BaseTask::FPropMapSpec() const {
  return {{"batch"}, 1, {"metrics", "per_example"}, true, "(metrics {name: (value, weight)}, per_example)"};
}

NestedMap BaseTask::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  const FPropResult r = FProp(theta, inputs.at("batch").AsMap());
  NestedMap metrics;
  for (const auto& [name, m] : r.metrics) {
    metrics.Put(name, NestedValue(NestedValue::List{NestedValue(m.value), NestedValue(m.weight)}));
  }
  NestedMap out;
  out.Put("metrics", std::move(metrics));
  out.Put("per_example", r.per_example);
  return out;
}

}  // namespace glossa
