// The MT decoder (Lingvo's TransformerBatchMajorDecoder): teacher-forced loss and incremental
// decoding, built by glossa/tasks/mt/mt.h's TransformerModel; its ONNX export is in mt_onnx.cc.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "glossa/layers/base_layer.h"
#include "glossa/model/base_task.h"

namespace glossa {

class EmbeddingLayer;
class OnnxGraph;  // glossa/layers/onnx_graph.h
class PositionalEmbeddingLayer;
class TransformerStack;
class SimpleFullSoftmax;
class BeamSearchHelper;

namespace mt {

// Lingvo's decoder.TransformerBatchMajorDecoder: target embedding + positions, num_trans_layers
// TransformerLayers from trans_decoder_tpl (causal self-attention, cross-attention to the
// encoder), an optional final layer norm, and a softmax that is its own (`softmax`) or tied to the
// target embedding (`shared_emb`: logits = h · token_embᵀ + bias).
class TransformerDecoder : public BaseLayer {
 public:
  // + token_emb, position_emb, model_dim, input_dropout_prob, num_trans_layers,
  // trans_decoder_tpl (TransformerLayer), final_layer_norm, shared_emb, softmax
  // (SimpleFullSoftmax), label_smoothing, per_word_avg_loss, target_seq_len, target_sos_id,
  // target_eos_id, beam_search (BeamSearchHelper), sampling (temperature, top_k, seed).
  static glossa::Params Params();
  explicit TransformerDecoder(const glossa::Params& p);

  // Teacher-forced logits [B, T, V] of tgt.ids given the encoder's output. Packed targets:
  // tgt_segment_ids and tgt_segment_pos [B, T] (then the encoder's outputs hold its segment_ids).
  at::Tensor Logits(const NestedMap& theta, const NestedMap& encoder_outputs,
                    const at::Tensor& tgt_ids, const at::Tensor& tgt_paddings,
                    const at::Tensor& tgt_segment_ids = {},
                    const at::Tensor& tgt_segment_pos = {}) const;
  // Metrics of the label-smoothed loss: loss, log_pplx, fraction_of_correct_next_step_preds,
  // num_predictions, plus per_example (per-sequence log-probs "per_sequence_log_prob").
  BaseTask::LossOutput ComputeLoss(const NestedMap& theta, const NestedMap& encoder_outputs,
                                   const NestedMap& tgt) const;

  // ---- Incremental decoding (Lingvo's ExtendStep with prefix_states) ----
  // What every step of decoding `num_hyps` hypotheses of the sources in encoder_outputs
  // ({encoded [B, S, D], paddings}) reads and never changes, computed once: each layer's
  // cross-attention keys and values ([B, S, heads, dim]: one copy per source), the source
  // paddings [B, S] and the position embeddings. Hypothesis h reads source h % B (Lingvo's layout:
  // h = hyp_index · B + beam), so reordering hypotheses within a beam leaves it valid; the K
  // hypotheses of a source are K query rows against its one copy.
  NestedMap PrecomputeSource(const NestedMap& theta, const NestedMap& encoder_outputs,
                             int64_t num_hyps) const;
  // The softmax restricted to the target ids [S] of a vocabulary shortlist
  // (glossa/input/shortlist.h), for a search's source: {shortlist_ids, shortlist_weight [D, S],
  // shortlist_bias [S]}. ExtendStep with them computes the logits over those ids only and gives
  // every other token -inf.
  NestedMap ShortlistSource(const NestedMap& theta, const at::Tensor& ids) const;
  // The shortlist's projection (ShortlistSource's weight) prepared under this model's inference
  // plan, as the plan prepares its own projections (packed panels, int8, bf16): null without a
  // plan or where it does not apply (autograd on). ExtendStep's shortlist_plan.
  std::shared_ptr<const ComputePlan> PlanShortlist(const NestedMap& shortlist_source) const;
  // Empty per-layer key/value caches of N hypotheses (MultiHeadedAttention::InitStates: written in
  // place, reordered by their row tables).
  NestedMap InitDecodeStates(int64_t num_hyps) const;
  // The inference plan's tied softmax weight (glossa/kernels/compute_plan.h): the embedding
  // transposed once, [D, V], under "softmax_weight" (shared_emb only).
  void PrepareWeights(const NestedMap& theta, ComputePlan& plan) const override;
  // One step: the previous token of each hypothesis ids [N] at position `step` ->
  // (log-probs [N, V] in float32, the caches with this step's keys and values).
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const NestedMap& source,
                                              const at::Tensor& ids, int64_t step,
                                              const NestedMap& states,
                                              const ComputePlan* shortlist_plan = nullptr) const;
  // ONNX (glossa/tasks/mt/mt_onnx.cc): each layer's cross-attention keys and values of encoded
  // [B, S, D] (k0, v0, k1, ...), and the model of one ExtendStep written to `path`: ids [N]
  // int64, step [] int64, source_paddings [N, S], cache_k<i>/cache_v<i> [N, P, heads, dim] and
  // source_k<i>/source_v<i> [N, S, heads, dim] -> log_probs [N, V] and new_cache_k<i>/v<i>
  // [N, P + 1, heads, dim].
  std::vector<std::string> EmitOnnxSource(OnnxGraph& g, const std::string& encoded) const;
  void WriteOnnxStep(const std::string& path) const;

  // The decoder's beam search (beam_search with target_seq_len, target_sos_id and target_eos_id
  // set from the decoder's), and the sampling settings.
  const BeamSearchHelper& beam_search() const { return *beam_search_; }
  // Its Params (mutable copies: another width for one request).
  const glossa::Params& beam_search_params() const { return beam_params_; }
  double sampling_temperature() const { return sampling_temperature_; }
  int64_t sampling_top_k() const { return sampling_top_k_; }
  uint64_t sampling_seed() const { return sampling_seed_; }

  int64_t vocab_size() const { return vocab_size_; }
  int64_t target_seq_len() const { return target_seq_len_; }
  int64_t sos_id() const { return sos_id_; }
  int64_t eos_id() const { return eos_id_; }

 private:
  at::Tensor Embed(const NestedMap& theta, const at::Tensor& ids) const;
  at::Tensor Project(const NestedMap& theta, const at::Tensor& h) const;

  int64_t model_dim_, vocab_size_, target_seq_len_, sos_id_, eos_id_;
  bool shared_emb_, per_word_avg_loss_;
  double label_smoothing_, sampling_temperature_;
  int64_t sampling_top_k_;
  uint64_t sampling_seed_;
  Child<BeamSearchHelper> beam_search_;
  glossa::Params beam_params_;
  Child<EmbeddingLayer> token_emb_;
  Child<PositionalEmbeddingLayer> position_emb_;
  Child<TransformerStack> stack_;
  Child<SimpleFullSoftmax> softmax_;
};

}  // namespace mt
}  // namespace glossa
