// A decoder-only Transformer language model task (Lingvo's lm TransformerLm), composed from
// sub-Params: `emb` (token embedding, scaled by sqrt(dim)) + `position_emb` (sinusoidal) →
// `stack` (a causal TransformerStack) → `softmax` (full softmax). Metrics: loss = log_pplx
// (per-token cross-entropy, weighted by tokens) and fraction_of_correct_next_step_preds. Decode
// samples continuations of the batch's prompts (its first `decode_prompt_length` tokens) with
// temperature and top-k.
//
//   auto p = TransformerLmTask::CommonParams(/*vocab_size=*/2000, /*model_dim=*/128,
//                                            /*hidden_dim=*/512, /*num_heads=*/4,
//                                            /*num_layers=*/2);
//   p.Set("stack.transformer_layer_params_tpl.tr_fflayer_tpl.activation", "GELU");
//   p.Set("input", TextLmInput::Params()...);
#pragma once

#include <map>
#include <string>
#include <vector>

#include "glossa/layers/gpipe.h"
#include "glossa/model/base_task.h"

namespace glossa {

class EmbeddingLayer;
class PositionalEmbeddingLayer;
class TransformerStack;
class SimpleFullSoftmax;

class TransformerLmTask : public BaseTask {
 public:
  // + emb (EmbeddingLayer), position_emb (PositionalEmbeddingLayer), stack (TransformerStack),
  // softmax (SimpleFullSoftmax; its label_smoothing smooths the training loss), aux_loss_weight
  // (MoE: loss = xent + weight · Σ aux losses), decode_prompt_length, decode_max_new_tokens,
  // decode_temperature, decode_top_k. The dimensions must agree (emb.embedding_dim =
  // position_emb.embedding_dim = the stack's model dim = softmax.input_dim, emb.vocab_size =
  // softmax.num_classes): InvalidArgument naming the fields otherwise.
  static glossa::Params Params();
  // Lingvo's TransformerLm.CommonParams: every sub-Params filled in for a causal LM of the given
  // shape (pre-layer-norm layers, a final layer norm, dropouts 0).
  static glossa::Params CommonParams(int64_t vocab_size, int64_t model_dim, int64_t hidden_dim,
                                     int64_t num_heads, int64_t num_layers);
  // The training recipe of the registered LMs (lm.austen.*, asr.synth.CharLm), applied to
  // CommonParams: residual dropout 0.1 in the attention and feed-forward blocks, Adam (0.9, 0.98,
  // 1e-9) at `lr` with the global gradient norm clipped to 1, a linear warm-up over
  // `warmup_steps`, then a cosine decay to `final_lr_fraction` of lr at max_steps, a loop and a
  // summary every 50 steps, a checkpoint every 120 s (the last `keep` kept). Returns p.
  static glossa::Params& SetTrainingRecipe(glossa::Params& p, int64_t max_steps, double lr,
                                           int64_t warmup_steps, double final_lr_fraction,
                                           int64_t keep);
  explicit TransformerLmTask(const glossa::Params& p);
  int64_t vocab_size() const { return vocab_size_; }

  // Logits [B, T, vocab] of ids [B, T].
  at::Tensor Logits(const NestedMap& theta, const at::Tensor& ids,
                    const at::Tensor& paddings) const;
  // log p(labels) [B, T] in float32 (padded positions included, unmasked): what the "default"
  // subgraph scores. The softmax's fused cross-entropy kernel (glossa/kernels/fused_xent.h) takes
  // the logits GEMM's output without its bias and gives each label's log-prob in one pass over
  // the row, with no [B, T, vocab] log-softmax formed or gathered; where it does not run
  // (GLOSSA_KERNELS=reference, no AVX-512, float64) the ATen log_softmax and gather do.
  at::Tensor LabelLogProbs(const NestedMap& theta, const at::Tensor& ids, const at::Tensor& labels,
                           const at::Tensor& paddings) const;
  NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const override;
  LossOutput ComputeLoss(const NestedMap& theta, const NestedMap& predictions,
                         const NestedMap& batch) const override;

  // Samples continuations of prompts [B, P] (each starting with <s>): returns [B, P + new] ids.
  // Stops a row at </s>. Deterministic given `seed`.
  at::Tensor Sample(const NestedMap& theta, const at::Tensor& prompts, int64_t max_new_tokens,
                    double temperature, int64_t top_k, uint64_t seed) const;
  // Samples continuations of prompts of any lengths (each starting with <s>) together, one step of
  // the stack for all of them: returns each prompt's new tokens (up to max_new_tokens, the last
  // </s> when drawn). Each row draws with its own generator seeded with `seed`, so its
  // continuation is what it would be alone (bit for bit under a batch-invariant plan).
  std::vector<std::vector<int64_t>> SampleTogether(const NestedMap& theta,
                                                   const std::vector<std::vector<int64_t>>& prompts,
                                                   int64_t max_new_tokens, double temperature,
                                                   int64_t top_k, uint64_t seed) const;

  // Incremental scoring, for shallow fusion in another model's search (AsrModel's `lm`): empty
  // caches of n sequences, and one step: each sequence's previous token ids [N] (<s> at step 0)
  // at position `step` -> (log-probs [N, vocab] of the next token in float32, the caches with
  // this step appended; every tensor's dim 0 is the sequence, so a beam search reorders them).
  NestedMap InitDecodeStates(int64_t n) const;
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const at::Tensor& ids,
                                              int64_t step, const NestedMap& states) const;

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
  // "default": text [B] -> log_probs [B, T] (of each token and </s>; 0 past the end),
  // total_log_prob [B], ids [B, T] (the tokens and </s>), lengths [B].
  // "generate": prompt [B] (+ optional max_new_tokens, temperature, top_k, seed) -> text [B]
  // (the continuation), ids [B, T] (the continuation's ids, </s>-padded).
  std::map<std::string, InferenceSubgraphSpec> Inference() const override;
  // network.pt: forward(ids [B, T] int64, paddings [B, T] float32) -> log-probs [B, T, V]
  // (glossa/tasks/lm/transformer_lm_torchscript.cc).
  std::vector<std::string> ExportTorchScript(const std::string& dir) const override;
  // onnx/lm_score.onnx: ids, labels [B, T] int64, paddings [B, T] float32 -> log_probs [B, T]
  // (of each label; 0 where padded) and total_log_prob [B]: the numbers of the "default" subgraph
  // (glossa/tasks/lm/transformer_lm_onnx.cc).
  std::vector<std::string> ExportOnnx(const std::string& dir) const override;
  InferenceMap RunInference(const NestedMap& theta, const std::string& subgraph,
                            const InferenceMap& feeds,
                            const BaseTokenizer* tokenizer) const override;
  // "generate" as a batch that requests join and leave at step boundaries
  // (glossa/tasks/lm/lm_generation.h); null for other subgraphs.
  std::unique_ptr<GenerationBatch> StartGeneration(const std::string& subgraph,
                                                   const BaseTokenizer* tokenizer) const override;

 private:
  // The stack's output [B, T, D] of ids [B, T] (embeddings plus positions through the stack):
  // what Logits and LabelLogProbs project.
  at::Tensor Hidden(const NestedMap& theta, const at::Tensor& ids,
                    const at::Tensor& paddings) const;
  friend class LmGeneration;  // reads the children and decode_* (glossa/tasks/lm/lm_generation.cc)
  int64_t vocab_size_;
  double label_smoothing_, aux_loss_weight_;
  int64_t decode_prompt_length_, decode_max_new_tokens_, decode_top_k_;
  double decode_temperature_;
  Child<EmbeddingLayer> emb_;
  Child<PositionalEmbeddingLayer> position_emb_;
  Child<TransformerStack> stack_;
  Child<SimpleFullSoftmax> softmax_;
  // On a pipe axis with the stack's place_ends_on_stages: this rank's stage (emb_ is built on
  // stage 0, softmax_ on the last).
  PipelineEnds ends_;

  // The loss and metrics (on the last pipeline stage, or without one).
  LossOutput ComputeLossHere(const NestedMap& theta, const NestedMap& predictions,
                             const NestedMap& batch) const;
  // On a stage before the last: the last stage's metrics, the loss's value with this stage's
  // layers in its graph.
  LossOutput LossFromLastStage(const NestedMap& predictions) const;
};

}  // namespace glossa
