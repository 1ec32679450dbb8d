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
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "glossa/model/base_task.h"
#include "glossa/tasks/mt/mt_decoder.h"
#include "glossa/tasks/mt/mt_encoder.h"

namespace glossa {

class EmbeddingLayer;
class PositionalEmbeddingLayer;
class TransformerStack;
class SimpleFullSoftmax;
class DropoutLayer;
class BeamSearchHelper;
class CtcPrefixScorer;
class LexiconConstraint;
class VocabShortlist;
class TransformerLmTask;

namespace mt {

// Lingvo's mt.model.TransformerModel: encoder + decoder, trained on the decoder's loss; Decode
// runs the beam search (or greedy or sampling, decoder.decoding) and scores corpus BLEU.
class TransformerModel : public BaseTask {
 public:
  // + encoder (mt::TransformerEncoder), decoder (mt::TransformerDecoder), decoding ('beam',
  // 'greedy' or 'sample'), bleu_separator_type ('' for detokenizing tokenizers; 'wpm', 'bpe', 'spm'
  // for pieces), shortlist_file (a vocabulary shortlist, glossa/input/shortlist.h: decoding
  // computes each batch's logits over its sources' candidates only).
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
  InferenceMap RunInference(const NestedMap& theta, const std::string& subgraph,
                            const InferenceMap& feeds,
                            const BaseTokenizer* tokenizer) const override;
  // onnx/mt_encoder.onnx: src_ids [B, S] int64, src_paddings [B, S] float32 -> encoded [B, S, D]
  // and every decoder layer's source_k<i>, source_v<i> [B, S, heads, dim] (computed once per
  // source); onnx/mt_decoder_step.onnx: TransformerDecoder::WriteOnnxStep's. A beam search runs the
  // step with its hypotheses' caches (glossa/tasks/mt/mt_onnx.cc).
  std::vector<std::string> ExportOnnx(const std::string& dir) const override;

  const TransformerEncoder& encoder() const { return *encoder_; }
  const TransformerDecoder& decoder() const { return *decoder_; }
  // shortlist_file travels with an exported bundle (assets/).
  std::vector<std::string> AssetParams() const override { return {"shortlist_file"}; }

 private:
  Child<TransformerEncoder> encoder_;
  Child<TransformerDecoder> decoder_;
  std::string decoding_, bleu_separator_;
  // The vocabulary shortlist of shortlist_file (null: the whole vocabulary).
  std::shared_ptr<const VocabShortlist> shortlist_;
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
// With `shortlist_ids` [S] (sorted target ids: VocabShortlist::Candidates), every step's logits
// are computed over those ids only (TransformerDecoder::ShortlistSource).
NestedMap SearchDecoder(const TransformerDecoder& decoder, const NestedMap& decoder_theta,
                        const NestedMap& encoder_outputs, int64_t batch, const std::string& decoding,
                        int64_t num_hyps, const CtcPrefixScorer* ctc = nullptr,
                        const LmFusion* lm = nullptr, const LexiconConstraint* lexicon = nullptr,
                        const at::Tensor& shortlist_ids = {});

}  // namespace mt
}  // namespace glossa
