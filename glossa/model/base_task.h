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

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "glossa/input/input_generator.h"
#include "glossa/layers/base_layer.h"
#include "glossa/optim/learner.h"

namespace glossa {

class BaseTask : public BaseLayer {
 public:
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

  // The outfeed (Lingvo's ProcessFPropResults): after each train loop, the loop's metric means
  // (name -> (mean, weight)) and every step's per-example tensors, in step order. Default: nothing.
  virtual void ProcessFPropResults(int64_t global_step,
                                   const std::map<std::string, std::pair<double, double>>& metrics,
                                   const std::vector<NestedMap>& per_example) {
    (void)global_step;
    (void)metrics;
    (void)per_example;
  }

  bool has_input() const { return HasChild("input"); }
  BaseInputGenerator& input() const { return GetChildAs<BaseInputGenerator>("input"); }
  Learner& learner() { return *learner_; }
  const glossa::Params& train_params() const { return params().GetParams("train"); }
  const glossa::Params& eval_params() const { return params().GetParams("eval"); }

 private:
  std::unique_ptr<Learner> learner_;
  int64_t num_splits_;
};

// Combines per-tower metrics by weighted average (weights summed).
Metrics CombineMetrics(const std::vector<Metrics>& towers);

}  // namespace glossa
