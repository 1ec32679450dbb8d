// Speech recognition (Lingvo's tasks/asr): an encoder-decoder over log-mel features with an
// attention decoder (LAS-style, here the MT Transformer decoder with its beam search) and an
// optional CTC head, trained jointly or alone.
//
//   pcm --MelAsrFrontend--> log-mel [B, T, F, 1] --SpecAugment (training)--> AsrEncoder:
//     conv subsampling (num_conv 3x3 convs, stride 2, ReLU) -> projection to model_dim +
//     sinusoidal positions -> TransformerStack -> encoded [B, T', D]
//   -> mt::TransformerDecoder (cross-attention, label-smoothed characters, beam search)
//   -> and/or a CTC softmax over the vocabulary + blank (ATen's ctc_loss), greedy CTC decoding.
//
// Loss: (1 - ctc_weight) · attention cross-entropy + ctc_weight · CTC (ctc_weight 1: CTC only, no
// decoder). Decoding scores WER and CER (glossa/metrics/wer.h). Inference subgraph `transcribe`:
// WAV bytes (or their base64) in, transcripts, hypotheses and scores out.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "glossa/model/base_task.h"

namespace glossa {

class Conv2DLayer;
class ProjectionLayer;
class PositionalEmbeddingLayer;
class TransformerStack;
class RNNLayer;
class MelAsrFrontend;
class SpecAugmentLayer;
class DropoutLayer;
class LexiconConstraint;

class TransformerLmTask;

namespace mt {
class TransformerDecoder;
}

namespace asr {

class AsrEncoder : public BaseLayer {
 public:
  // + input_dim (features per frame: the frontend's output_dim; set by AsrModel), num_conv (2),
  // conv_channels (32), model_dim, encoder_type ('transformer' or 'blstm'), position_emb,
  // input_dropout_prob, transformer_stack; for 'blstm' (Lingvo's LAS encoder): lstm_layers,
  // lstm_cell_dim (0: model_dim / 2), lstm_tpl.
  static glossa::Params Params();
  explicit AsrEncoder(const glossa::Params& p);
  // features [B, T, F, 1], paddings [B, T] -> {encoded [B, T', D], paddings [B, T']}.
  NestedMap FProp(const NestedMap& theta, const at::Tensor& features,
                  const at::Tensor& paddings) const;
  int64_t model_dim() const { return model_dim_; }

 private:
  int64_t model_dim_;
  std::vector<Child<Conv2DLayer>> conv_;
  Child<ProjectionLayer> proj_;
  Child<PositionalEmbeddingLayer> position_emb_;
  Child<DropoutLayer> dropout_;
  Child<TransformerStack> stack_;
  // 'blstm': per layer a forward and a backward RNN over time, their outputs concatenated.
  std::vector<Child<RNNLayer>> fwd_, bwd_;
  Child<ProjectionLayer> lstm_proj_;  // 2·lstm_cell_dim -> model_dim, when they differ
};

class AsrModel : public BaseTask {
 public:
  // + frontend (MelAsrFrontend), specaugment (SpecAugmentLayer; None: off), encoder (AsrEncoder),
  // decoder (mt::TransformerDecoder; None with ctc_weight 1), ctc_weight, decoding ('beam',
  // 'greedy' (attention) or 'ctc_greedy'; default: beam with a decoder, ctc_greedy without).
  static glossa::Params Params();
  // A character model of the given shape (Lingvo's LAS recipe scaled down): 80 log-mel bins,
  // SpecAugment, 2 stride-2 convs (25 frames/s: enough for CTC over characters), a Transformer
  // encoder and decoder.
  static glossa::Params CommonParams(int64_t vocab_size, int64_t model_dim, int64_t hidden_dim,
                                     int64_t num_heads, int64_t encoder_layers,
                                     int64_t decoder_layers, double ctc_weight);
  explicit AsrModel(const glossa::Params& p);

  // pcm {src_inputs [B, N], paddings [B, N]} -> encoder outputs {encoded, paddings}.
  NestedMap Encode(const NestedMap& theta, const NestedMap& src) const;
  NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const override;
  LossOutput ComputeLoss(const NestedMap& theta, const NestedMap& predictions,
                         const NestedMap& batch) const override;

  // Transcribes pcm: {topk_ids [B, K, T], topk_lens [B, K], topk_scores [B, K]}.
  NestedMap Transcribe(const NestedMap& theta, const NestedMap& src, int64_t num_hyps) const;
  NestedMap Decode(const NestedMap& batch) override;
  std::map<std::string, double> CreateDecoderMetrics() const override;
  std::vector<std::string> PostProcessDecodeOut(const NestedMap& decode_out,
                                                std::map<std::string, double>& metrics) override;
  void DecodeFinalize(std::map<std::string, double>& metrics) override;
  std::map<std::string, bool> TrackedMetrics() const override {
    return {{"log_pplx", true}, {"wer", true}};
  }

  // `transcribe`: wav [B] (WAV bytes or their base64) [+ num_hyps] -> transcript [B], hyps [B]
  // (every hypothesis, " ||| "-joined), scores [B, K].
  std::map<std::string, InferenceSubgraphSpec> Inference() const override;
  std::vector<std::string> AssetParams() const override { return {"lexicon_file"}; }
  InferenceMap RunInference(const NestedMap& theta, const std::string& subgraph,
                            const InferenceMap& feeds,
                            const BaseTokenizer* tokenizer) const override;

 private:
  at::Tensor CtcLogProbs(const NestedMap& theta, const at::Tensor& encoded) const;

  Child<MelAsrFrontend> frontend_;
  Child<SpecAugmentLayer> specaugment_;
  Child<AsrEncoder> encoder_;
  Child<mt::TransformerDecoder> decoder_;
  Child<ProjectionLayer> ctc_proj_;
  double ctc_weight_;
  double joint_ctc_weight_ = 0.0;
  Child<TransformerLmTask> lm_;  // shallow fusion (lm_fusion_weight_ > 0)
  double lm_fusion_weight_ = 0.0;
  std::shared_ptr<const LexiconConstraint> lexicon_;  // lexicon_file
  int64_t vocab_size_, sample_rate_;
  std::string decoding_;
};

}  // namespace asr
}  // namespace glossa
