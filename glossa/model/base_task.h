// BaseTask: Lingvo's task. A task owns its input generator, computes predictions and a loss from
// a batch on an explicit theta, and carries the train and eval Params of its programs.
//
//   class MyTask : public BaseTask {
//     NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const override;
//     LossOutput ComputeLoss(const NestedMap& theta, const NestedMap& preds,
//                            const NestedMap& batch) const override;   // metrics with "loss"
//   };
//   BaseTask::FPropResult r = task->FPropDefaultTheta(batch);   // towers, combined metrics
//   r.loss.backward();
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "glossa/input/input_generator.h"
#include "glossa/layers/base_layer.h"
#include "glossa/model/generation.h"
#include "glossa/model/inference_spec.h"
#include "glossa/optim/learner.h"

namespace glossa {

class BaseTokenizer;

class BaseTask : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, batch) -> (metrics {name: (value, weight)}, per_example).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + input, encoder, decoder, num_splits, train {...}, eval {...} (see docs/training.md).
  static glossa::Params Params();
  // The default `train` and `eval` sub-Params.
  static glossa::Params TrainParams();
  static glossa::Params EvalParams();
  explicit BaseTask(const glossa::Params& p);

  struct LossOutput {
    Metrics metrics;        // name -> (value, weight); must hold "loss"
    NestedMap per_example;  // per-example tensors (the outfeed)
  };
  virtual NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const = 0;
  virtual LossOutput ComputeLoss(const NestedMap& theta, const NestedMap& predictions,
                                 const NestedMap& batch) const = 0;

  struct FPropResult {
    Metrics metrics;  // combined over towers by weighted average
    at::Tensor loss;  // what gradients come from: the sum of the towers' losses
    NestedMap per_example;
  };
  // Splits `batch` into num_splits towers (along dim 0), runs ComputePredictions and ComputeLoss on
  // each with the step seed reset, and combines: metrics by weighted average (weights summed),
  // the loss for gradients as the sum of tower losses, per-example tensors concatenated.
  // "num_samples_in_batch" is added when the task does not report it.
  FPropResult FProp(const NestedMap& theta, const NestedMap& batch) const;
  FPropResult FPropDefaultTheta(const NestedMap& batch) const { return FProp(theta(), batch); }

  // Decoding (optional): Decode a batch into outputs; PostProcessDecodeOut turns them into
  // per-example results and updates `decoder_metrics` (from CreateDecoderMetrics).
  virtual NestedMap Decode(const NestedMap& batch);
  virtual std::map<std::string, double> CreateDecoderMetrics() const { return {}; }
  virtual std::vector<std::string> PostProcessDecodeOut(const NestedMap& decode_out,
                                                        std::map<std::string, double>& metrics);
  virtual void DecodeFinalize(std::map<std::string, double>& metrics) { (void)metrics; }

  // The metrics whose best step the evaler and decoder jobs track (metric -> minimize); those a
  // job does not produce are ignored. Default: log_pplx (minimized).
  virtual std::map<std::string, bool> TrackedMetrics() const { return {{"log_pplx", true}}; }

  // The outfeed (Lingvo's ProcessFPropResults): after each train loop, the loop's metric means
  // (name -> (mean, weight)) and every step's per-example tensors, in step order. Default: nothing.
  virtual void ProcessFPropResults(int64_t global_step,
                                   const std::map<std::string, std::pair<double, double>>& metrics,
                                   const std::vector<NestedMap>& per_example) {
    (void)global_step;
    (void)metrics;
    (void)per_example;
  }

  // What `glossa report` prints for the latest checkpoint on one dataset. The runtime fills in
  // what every task has (eval metrics, a decoded batch); a task adds what its field compares
  // against (the LM: a unigram baseline counted over train_input()).
  struct ReportInputs {
    std::string model_key;  // e.g. "lm.austen.TransformerLmTiny"
    std::string dataset;    // the dataset input() reads
    int64_t global_step = 0;
    std::map<std::string, std::pair<double, double>> eval_metrics;  // name -> (mean, weight)
    std::vector<std::string> decode_lines;  // one decoded batch; empty when the task cannot decode
    int64_t num_samples = 5;                // decode lines to show
    // The Train dataset's input for one sequential pass (null when not available).
    std::function<std::unique_ptr<BaseInputGenerator>()> train_input;
  };
  // Default: the eval metrics, one per line, then up to num_samples decode lines.
  virtual std::string Report(const ReportInputs& in);

  // Lingvo's Inference(): the subgraphs this task serves (none by default), and one run of a
  // subgraph on feeds already checked against its spec (Predictor does), with the weights
  // `theta` (the task's theta(); the Predictor builds it once per loaded checkpoint, not per
  // call: a theta of a small model took 33 µs to build, 6% of a batch-1 LM score). `tokenizer`
  // turns strings into ids and back (the bundle's; null when there is none). Thread-safe:
  // inference reads the weights only. Unimplemented by default.
  virtual std::map<std::string, InferenceSubgraphSpec> Inference() const { return {}; }
  virtual InferenceMap RunInference(const NestedMap& theta, const std::string& subgraph,
                                    const InferenceMap& feeds,
                                    const BaseTokenizer* tokenizer) const;
  // Continuous batching (glossa/model/generation.h): a decoding batch of `subgraph` on the
  // current weights that requests join and leave at step boundaries; null (the default) where
  // the subgraph does not generate token by token.
  virtual std::unique_ptr<GenerationBatch> StartGeneration(const std::string& subgraph,
                                                           const BaseTokenizer* tokenizer) const {
    (void)subgraph;
    (void)tokenizer;
    return nullptr;
  }
  // `glossa export --torchscript`: the tensor-in/tensor-out parts of the subgraphs (the network
  // from ids to log-probs; tokenizers stay outside) as TorchScript modules that stock PyTorch
  // loads with torch.jit.load, written under `dir` from the current weights. Returns the files
  // written, relative to `dir`. Unimplemented by default.
  virtual std::vector<std::string> ExportTorchScript(const std::string& dir) const;
  // `glossa export --onnx`: the subgraphs' networks with a static graph as ONNX models
  // (glossa/layers/onnx_graph.h), written under `dir` from the current weights. Returns the files
  // written, relative to `dir`. Unimplemented by default.
  virtual std::vector<std::string> ExportOnnx(const std::string& dir) const;
  // Params of this task (top-level keys) that name files inference reads, e.g. a speech model's
  // lexicon_file: `glossa export` copies each set one into the bundle's assets/ and LoadBundle
  // points it there. None by default.
  virtual std::vector<std::string> AssetParams() const { return {}; }

  // The task's input: its "input" child, or the input a TaskInputScope installed.
  bool has_input() const { return input_override_ != nullptr || HasChild("input"); }
  BaseInputGenerator& input() const {
    return input_override_ != nullptr ? *input_override_ : GetChildAs<BaseInputGenerator>("input");
  }
  Learner& learner() { return *learner_; }
  const glossa::Params& train_params() const { return params().GetParams("train"); }
  const glossa::Params& eval_params() const { return params().GetParams("eval"); }

 private:
  friend class TaskInputScope;
  std::unique_ptr<Learner> learner_;
  int64_t num_splits_;
  BaseInputGenerator* input_override_ = nullptr;
};

// While alive, `task.input()` is `input`: an eval or decode program runs the trained task (its
// weights, or their EMA in eval mode) on another dataset without a second copy of the model.
// Not thread-safe: the programs of one executor run one at a time on its thread.
//
//   TaskInputScope dev(model.task(), *dev_input);
//   EvalProgram(model, &writer).Run(global_step);   // reads dev_input
class TaskInputScope {
 public:
  TaskInputScope(BaseTask& task, BaseInputGenerator& input);
  ~TaskInputScope();
  TaskInputScope(const TaskInputScope&) = delete;
  TaskInputScope& operator=(const TaskInputScope&) = delete;

 private:
  BaseTask& task_;
  BaseInputGenerator* previous_;
};

// Combines per-tower metrics by weighted average (weights summed).
Metrics CombineMetrics(const std::vector<Metrics>& towers);

}  // namespace glossa
