// Machine translation (Lingvo's tasks/mt): a Transformer encoder, a Transformer decoder with
// cross-attention and incremental decoding, and the TransformerModel task that trains them with
// label-smoothed cross-entropy and decodes with beam search into corpus BLEU.
//
//   auto p = mt::TransformerModel::CommonParams(/*vocab_size=*/8000, /*model_dim=*/256,
//                                                /*hidden_dim=*/1024, /*num_heads=*/4,
//                                                /*num_layers=*/3);
//   p.Set("decoder.beam_search.num_hyps_per_beam", 4);
//   p.Set("input", TextPairInput::Params().Set("file_pattern", "text:/data/train.tsv")...);
//
// Batches (NmtInput, TextPairInput): src {ids, paddings} [B, S]; tgt {ids, labels, paddings,
// weights} [B, T] where ids start with <s> and labels end with </s>.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "glossa/model/base_task.h"

namespace glossa {

class EmbeddingLayer;
class PositionalEmbeddingLayer;
class TransformerStack;
class SimpleFullSoftmax;
class DropoutLayer;
class BeamSearchHelper;
class CtcPrefixScorer;
class LexiconConstraint;
class TransformerLmTask;

namespace mt {

// Lingvo's encoder.TransformerBatchMajorEncoder: token embedding · sqrt(model_dim) + sinusoidal
// positions, input dropout, a TransformerStack (with its optional final layer norm).
class TransformerEncoder : public BaseLayer {
 public:
  // + token_emb (EmbeddingLayer), position_emb (PositionalEmbeddingLayer), model_dim,
  // input_dropout_prob, transformer_stack (TransformerStack).
  static glossa::Params Params();
  explicit TransformerEncoder(const glossa::Params& p);
  // src {ids, paddings} [B, S] -> {encoded [B, S, D], paddings [B, S]}.
  NestedMap FProp(const NestedMap& theta, const NestedMap& src) const;
  int64_t model_dim() const { return model_dim_; }
  // ONNX (glossa/layers/onnx_graph.h): ids [B, S] int64, paddings [B, S] float32 -> encoded.
  std::string EmitOnnxEncode(OnnxGraph& g, const std::string& ids,
                             const std::string& paddings) const;

 private:
  int64_t model_dim_;
  Child<EmbeddingLayer> token_emb_;
  Child<PositionalEmbeddingLayer> position_emb_;
  Child<TransformerStack> stack_;
};

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
  // cross-attention keys and values, the source paddings and the position embeddings.
  // Hypothesis h reads source h % B (Lingvo's layout: h = hyp_index · B + beam), so reordering
  // hypotheses within a beam leaves it valid.
  NestedMap PrecomputeSource(const NestedMap& theta, const NestedMap& encoder_outputs,
                             int64_t num_hyps) const;
  // Empty per-layer key/value caches of N hypotheses (MultiHeadedAttention::InitStates: written in
  // place, reordered by their row tables).
  NestedMap InitDecodeStates(int64_t num_hyps) const;
  // One step: the previous token of each hypothesis ids [N] at position `step` ->
  // (log-probs [N, V] in float32, the caches with this step's keys and values).
  std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta, const NestedMap& source,
                                              const at::Tensor& ids, int64_t step,
                                              const NestedMap& states) const;
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

// Lingvo's mt.model.TransformerModel: encoder + decoder, trained on the decoder's loss; Decode
// runs the beam search (or greedy or sampling, decoder.decoding) and scores corpus BLEU.
class TransformerModel : public BaseTask {
 public:
  // + encoder (mt::TransformerEncoder), decoder (mt::TransformerDecoder), decoding ('beam',
  // 'greedy' or 'sample'), bleu_separator_type ('' for detokenizing tokenizers; 'wpm', 'bpe', 'spm'
  // for pieces).
  static glossa::Params Params();
  // Every sub-Params filled in for the given shape (Lingvo's SetupTransformerParams):
  // pre-layer-norm layers, final layer norms, input and residual dropout 0.1 (none on the
  // attention weights or the feed-forward hidden layer), label smoothing 0.1, the softmax tied to
  // the target embedding, beam 4 with length normalization 0.6.
  static glossa::Params CommonParams(int64_t vocab_size, int64_t model_dim, int64_t hidden_dim,
                                     int64_t num_heads, int64_t num_layers);
  // The training and decoding recipe of the text translation models (mt.bible.*, mt.text.*):
  // Adam (0.9, 0.98, 1e-9) at learning rate 1 on Lingvo's TransformerSchedule (warmup_steps,
  // the model dim), gradients clipped at norm 1, loops of 50 steps, a checkpoint every 120 s (the
  // last 5 kept); beam 4 up to 160 tokens, a hypothesis still live at the last step ending there.
  static glossa::Params& SetTrainingRecipe(glossa::Params& p, int64_t max_steps,
                                           int64_t warmup_steps);
  // Checks, with an input that has a tokenizer, that the tokenizer's size equals the encoder's
  // and decoder's vocabularies (and the untied softmax's classes), naming every key that differs.
  explicit TransformerModel(const glossa::Params& p);

  NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const override;
  LossOutput ComputeLoss(const NestedMap& theta, const NestedMap& predictions,
                         const NestedMap& batch) const override;

  // Translates a batch's sources: {topk_ids [B, K, T], topk_lens [B, K], topk_scores [B, K]}.
  NestedMap Translate(const NestedMap& theta, const NestedMap& src, int64_t num_hyps) const;
  NestedMap Decode(const NestedMap& batch) override;
  std::map<std::string, double> CreateDecoderMetrics() const override;
  // log_pplx (minimized) and corpus_bleu (maximized).
  std::map<std::string, bool> TrackedMetrics() const override {
    return {{"log_pplx", true}, {"corpus_bleu", false}};
  }
  // "source ||| reference ||| hypothesis" lines; accumulates BLEU statistics.
  std::vector<std::string> PostProcessDecodeOut(const NestedMap& decode_out,
                                                std::map<std::string, double>& metrics) override;
  void DecodeFinalize(std::map<std::string, double>& metrics) override;

  // "translate": source [B] strings (+ optional num_hyps) -> translation [B] (the best), hyps
  // [B, K] strings, scores [B, K].
  std::map<std::string, InferenceSubgraphSpec> Inference() const override;
  InferenceMap RunInference(const std::string& subgraph, const InferenceMap& feeds,
                            const BaseTokenizer* tokenizer) const override;
  // onnx/mt_encoder.onnx: src_ids [B, S] int64, src_paddings [B, S] float32 -> encoded [B, S, D]
  // and every decoder layer's source_k<i>, source_v<i> [B, S, heads, dim] (computed once per
  // source); onnx/mt_decoder_step.onnx: TransformerDecoder::WriteOnnxStep's. A beam search runs the
  // step with its hypotheses' caches (glossa/tasks/mt/mt_onnx.cc).
  std::vector<std::string> ExportOnnx(const std::string& dir) const override;

  const TransformerEncoder& encoder() const { return *encoder_; }
  const TransformerDecoder& decoder() const { return *decoder_; }

 private:
  Child<TransformerEncoder> encoder_;
  Child<TransformerDecoder> decoder_;
  std::string decoding_, bleu_separator_;
  // Corpus BLEU statistics of the current decode run.
  std::vector<std::string> bleu_refs_, bleu_hyps_;
};

// The text of each row of ids [B, T] up to its length, without <s> and what follows </s>.
std::vector<std::string> RowsToStrings(const BaseTokenizer& tok, const at::Tensor& ids,
                                       const at::Tensor& lens);
// The tokenizer of the task's sequence input (FailedPrecondition when it has none): what decoders
// turn ids into text with.
const BaseTokenizer& TokenizerOf(const BaseTask& task);

// The decoder's search over encoder_outputs ({encoded [B, S, D], paddings}) of `batch` sources:
// 'beam' (its BeamSearchHelper, or one of num_hyps hypotheses when num_hyps > 0 differs from it),
// 'greedy', or 'sample' (its sampling settings). Returns {topk_ids [B, K, T], topk_lens [B, K],
// topk_scores [B, K]}. Used by TransformerModel::Translate and the speech model. With `ctc`, every
// step's log-probs are joined with its CTC prefix scores (joint CTC/attention decoding).
//
// Shallow fusion (Gulcehre et al. 2015; Lingvo's asr fusion, ESPnet's LM scorer): a language
// model over the decoder's vocabulary whose next-token log-probs, times `weight`, are added to
// every step's scores (after the CTC join): log p_dec + weight·log p_lm. Its caches ride with the
// decoder's under "lm_fusion". With `lexicon`, last, every token that would spell a word outside
// the word list is masked (glossa/search/lexicon.h; states under "lexicon"). The joining itself is
// glossa/search/fusion.h's.
struct LmFusion {
  const TransformerLmTask* lm = nullptr;
  const NestedMap* theta = nullptr;
  double weight = 0.0;
};
NestedMap SearchDecoder(const TransformerDecoder& decoder, const NestedMap& decoder_theta,
                        const NestedMap& encoder_outputs, int64_t batch, const std::string& decoding,
                        int64_t num_hyps, const CtcPrefixScorer* ctc = nullptr,
                        const LmFusion* lm = nullptr, const LexiconConstraint* lexicon = nullptr);

}  // namespace mt
}  // namespace glossa
