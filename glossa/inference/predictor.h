// Lingvo's Predictor: loads an inference bundle (glossa/inference/bundle.h) and runs its task's
// named subgraphs (BaseTask::Inference) on named feeds, safely from many threads.
//
//   Predictor predictor("/models/austen_tiny");
//   InferenceMap out = predictor.Run("default",
//       {{"text", InferenceValue::Strings({"It is a truth universally acknowledged"})}});
//   double lp = out.at("total_log_prob").tensor[0].item<double>();
//   predictor.Load("/logdir/train/ckpt-00002000");   // new weights; Run keeps working meanwhile
//
// Feeds are checked before anything runs, each failure an InvalidArgument naming the feed:
// unknown names (the valid ones listed), a missing required feed, a wrong dtype or rank, an empty
// batch, more than max_batch_size examples, and inputs longer than max_input_tokens tokens. An
// unknown subgraph is NotFound listing the subgraphs. Run is thread-safe and re-entrant; Load
// swaps the weights atomically (a Run sees the old or the new weights, never a mix).
//
// What arithmetic runs is decided once, at load: a ComputePolicy from the bundle (an int8 export)
// and the options, and a plan that prepares the weights for it (quantized, transposed, Q/K/V
// fused) keyed by variable name (glossa/kernels/compute_plan.h). Load makes a new plan for the
// new weights. Nothing a Run does asks a thread-local what mode it is in.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "glossa/inference/bundle.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/model/inference_spec.h"

namespace glossa {

struct PredictorOptions {
  // The subgraphs to serve (empty: all the task declares); others are NotFound.
  std::vector<std::string> subgraphs;
  // A training checkpoint to load instead of the bundle's weights (Lingvo's `checkpoint`).
  std::string checkpoint;
  int64_t max_batch_size = 1024;
  int64_t max_input_tokens = 4096;
  // A feed named max_new_tokens (generation) above this is InvalidArgument: one request cannot
  // hold a batch thread for minutes.
  int64_t max_new_tokens = 512;
  // The plan made at load (glossa/kernels/compute_plan.h). precision: "" takes the bundle's
  // (its manifest's quantize: int8, bf16 or none), else "float32", "int8" or "bf16" (a float
  // bundle quantized, or its weights rounded to bf16, at load). batch_invariant: a request's answer has the same bits alone or in any batch (what
  // glossa serve runs by default).
  std::string precision;
  bool batch_invariant = false;
  bool fused_decoder_step = true;
};

class Predictor {
 public:
  explicit Predictor(const std::string& bundle_dir, PredictorOptions options = {});
  ~Predictor();

  std::map<std::string, InferenceSubgraphSpec> ListSubgraphs() const { return specs_; }
  // fetch_keys: the fetches to return (empty: all); with validate_fetches an unknown key is
  // InvalidArgument, without it unknown keys are skipped.
  // *global_step (when given) is the step of the weights this Run used.
  InferenceMap Run(const std::string& subgraph, const InferenceMap& feeds,
                   const std::vector<std::string>& fetch_keys = {}, bool validate_fetches = true,
                   int64_t* global_step = nullptr) const;
  // Continuous batching (glossa/model/generation.h): a decoding batch of `subgraph` on the
  // weights loaded now (kept while the batch lives, whatever Load does), whose Join checks each
  // request's feeds as Run does. Null where the subgraph does not generate token by token;
  // NotFound for an unknown subgraph. One thread at a time per batch.
  std::unique_ptr<GenerationBatch> StartGeneration(const std::string& subgraph,
                                                   int64_t* global_step = nullptr) const;
  // The checks Run makes before it runs anything (NotFound, InvalidArgument), alone.
  void Validate(const std::string& subgraph, const InferenceMap& feeds,
                const std::vector<std::string>& fetch_keys = {},
                bool validate_fetches = true) const;
  const PredictorOptions& options() const { return options_; }
  // Loads a training checkpoint's weights (its EMA averages when the model keeps an EMA) into a
  // new copy of the model and swaps it in; Runs in flight finish on the old one.
  void Load(const std::string& checkpoint);
  int64_t global_step() const;
  const std::map<std::string, std::string>& manifest() const { return bundle_.manifest; }
  // The tokens the bundle's tokenizer makes of `text` (its bytes without a tokenizer): what a
  // token budget counts.
  int64_t CountTokens(const std::string& text) const;
  // What the plan made at load runs ("int8, batch-invariant, fused decoder step"), and how many
  // weights it prepared.
  const ComputePolicy& policy() const { return policy_; }
  size_t prepared_weights() const;
  // What the plan could not do as its policy asks (ComputePlan::notes): said once at load, e.g.
  // why decoder layers' steps do not take the fused decoder step, then what steps met since.
  std::vector<std::string> plan_notes() const;

 private:
  // A numeric feed outside its spec's [min, max] (or max_new_tokens), or a non-finite float.
  void CheckRange(const std::string& what, const std::string& name, const TensorSpec& s,
                  const at::Tensor& t) const;
  struct Loaded;
  std::shared_ptr<const Loaded> Current() const;
  void CheckFeeds(const std::string& subgraph, const InferenceSubgraphSpec& spec,
                  const InferenceMap& feeds, const BaseTokenizer* tokenizer) const;
  LoadedBundle bundle_;
  PredictorOptions options_;
  std::map<std::string, InferenceSubgraphSpec> specs_;
  ComputePolicy policy_;
  mutable std::mutex mu_;
  std::shared_ptr<const Loaded> current_;
};

}  // namespace glossa
