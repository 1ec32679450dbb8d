// A decoder-only Transformer language model task (Lingvo's lm TransformerLm): token embedding
// (scaled by sqrt(model_dim)) + sinusoidal positions → causal TransformerStack → full softmax.
// Metrics: loss = log_pplx (per-token cross-entropy, weighted by tokens) and
// fraction_of_correct_next_step_preds. Decode samples continuations of the batch's prompts (its
// first `decode_prompt_length` tokens) with temperature and top-k.
//
//   auto p = TransformerLmTask::Params();
//   p.Set("vocab_size", 2000).Set("model_dim", 128).Set("num_layers", 2).Set("num_heads", 4)
//    .Set("hidden_dim", 512).Set("input", TextLmInput::Params()...);
#pragma once

#include <map>
#include <string>
#include <vector>

#include "glossa/model/base_task.h"

namespace glossa {

class TransformerLmTask : public BaseTask {
 public:
  // + vocab_size, model_dim, num_layers, num_heads, hidden_dim, residual_dropout_prob,
  // atten_dropout_prob, relu_dropout_prob, input_dropout_prob, label_smoothing,
  // decode_prompt_length, decode_max_new_tokens, decode_temperature, decode_top_k, moe_tpl
  // (None: dense), moe_layers_every, aux_loss_weight (MoE: loss = xent + weight · Σ aux losses).
  static glossa::Params Params();
  explicit TransformerLmTask(const glossa::Params& p);

  // Logits [B, T, vocab] of ids [B, T].
  at::Tensor Logits(const NestedMap& theta, const at::Tensor& ids,
                    const at::Tensor& paddings) const;
  NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const override;
  LossOutput ComputeLoss(const NestedMap& theta, const NestedMap& predictions,
                         const NestedMap& batch) const override;

  // Samples continuations of prompts [B, P] (each starting with <s>): returns [B, P + new] ids.
  // Stops a row at </s>. Deterministic given `seed`.
  at::Tensor Sample(const NestedMap& theta, const at::Tensor& prompts, int64_t max_new_tokens,
                    double temperature, int64_t top_k, uint64_t seed) const;

  // {prompt_ids, prompt_lengths, sample_ids} with the first decode_prompt_length tokens as prompts.
  NestedMap Decode(const NestedMap& batch) override;
  std::map<std::string, double> CreateDecoderMetrics() const override;
  // One "prompt ||| continuation" line per example (needs a tokenizer on the input).
  std::vector<std::string> PostProcessDecodeOut(const NestedMap& decode_out,
                                                std::map<std::string, double>& metrics) override;
  void DecodeFinalize(std::map<std::string, double>& metrics) override;
  // `glossa report`: log_pplx beside a unigram baseline counted over in.train_input(), then
  // sampled continuations.
  std::string Report(const ReportInputs& in) override;
};

// Unigram baseline: token frequencies (add-one smoothed) counted over `train` batches' labels,
// and the per-token log-perplexity of `eval` batches under them. Both are lists of batches with
// labels and paddings (Lingvo's LM baseline for comparison).
struct UnigramBaseline {
  explicit UnigramBaseline(int64_t vocab_size);
  void Count(const NestedMap& batch);
  // Returns Σ -log p(label) over non-padded tokens and the token count.
  std::pair<double, double> Score(const NestedMap& batch) const;
  std::vector<double> counts;
  double total = 0;
};

}  // namespace glossa
