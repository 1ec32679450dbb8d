#include "glossa/tasks/asr/asr.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include "glossa/base/base64.h"
#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/input/tokenizers.h"
#include "glossa/io/wav.h"
#include "glossa/layers/asr_frontend.h"
#include "glossa/layers/conv.h"
#include "glossa/layers/dropout.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/rnn.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/metrics/wer.h"
#include "glossa/tasks/mt/mt.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/search/ctc_prefix_score.h"
#include "glossa/search/lexicon.h"

namespace glossa {
namespace asr {
namespace {

ParamValue::List Ints(std::initializer_list<int64_t> v) {
  ParamValue::List l;
  for (int64_t x : v) l.emplace_back(x);
  return l;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The lexicon constraint read from lexicon_file `lexicon` of the AsrModel `p` (at `path`), for a
// vocabulary of `vocab_size` ids; errors reading it are rethrown with the path in front.
std::shared_ptr<const LexiconConstraint> LoadLexicon(const glossa::Params& p,
                                                     const std::string& lexicon,
                                                     int64_t vocab_size, const std::string& path) {
  // Spelled with the input's tokenizer (the one decoding turns ids into text with); without an
  // input (an exported bundle), with the default AsciiTokenizer of AsrInput.
  glossa::Params tp = AsciiTokenizer::Params();
  if (p.IsSet("input") && p.GetParams("input").Contains("tokenizer") &&
      p.IsSet("input.tokenizer")) {
    tp = p.GetParams("input.tokenizer").Copy();
  }
  const auto tok = InstantiateLayer<BaseTokenizer>(tp.Set("name", "lexicon_tokenizer"));
  std::shared_ptr<const LexiconConstraint> constraint;
  try {
    constraint = std::make_shared<const LexiconConstraint>(
        LexiconConstraint::FromFile(lexicon, *tok, vocab_size));
  } catch (const Error& e) {
    ThrowError(e.code(), StrCat(path, ": lexicon_file: ", e.message()));
  }
  return constraint;
}



}  // namespace

// ---- AsrEncoder ----

glossa::Params AsrEncoder::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<AsrEncoder>());
  p.Set("name", "encoder");
  p.Define("input_dim", 0, "Features per frame (the frontend's output_dim; AsrModel sets it).");
  p.Define("num_conv", 2, "3x3 convolutions of stride 2 (each halves time and frequency).");
  p.Define("conv_channels", 32, "Output channels of each convolution.");
  p.Define("model_dim", 256, "Model dimension of the stack (the encoder's output).");
  p.Define("encoder_type", "transformer",
           "'transformer' (positions + transformer_stack) or 'blstm' (Lingvo's LAS encoder: "
           "lstm_layers bidirectional LSTMs, then a projection to model_dim when 2·lstm_cell_dim "
           "differs).");
  p.Define("lstm_layers", 3, "'blstm': bidirectional LSTM layers.");
  p.Define("lstm_cell_dim", 0, "'blstm': cells per direction (0: model_dim / 2).");
  p.Define("lstm_tpl", LSTMCellSimple::Params(),
           "'blstm': the cell of every direction and layer (num_input_nodes and num_output_nodes "
           "are set).");
  p.Define("position_emb", PositionalEmbeddingLayer::Params(), "Sinusoidal positions.");
  p.Define("input_dropout_prob", 0.0, "Dropout on the Transformer stack's input ('blstm': on the encoder's output).");
  p.Define("transformer_stack", TransformerStack::Params(),
           "The encoder's TransformerStack (non-causal).");
  return p;
}

AsrEncoder::AsrEncoder(const glossa::Params& p) : BaseLayer(p) {
  model_dim_ = p.GetInt("model_dim");
  int64_t f = p.GetInt("input_dim");
  const int64_t channels = p.GetInt("conv_channels"), n = p.GetInt("num_conv");
  if (f <= 0 || channels <= 0 || n < 0 || model_dim_ <= 0) {
    throw InvalidArgumentError(StrCat(path(), ": input_dim, conv_channels and model_dim must be > 0"));
  }
  ParamValue::List convs;
  int64_t in = 1;
  for (int64_t i = 0; i < n; ++i) {
    glossa::Params c = Conv2DLayer::Params();
    c.Set("name", StrCat("conv", i)).Set("filter_shape", Ints({3, 3, in, channels}));
    c.Set("filter_stride", Ints({2, 2})).Set("bias", true).Set("activation", "RELU");
    convs.emplace_back(c);
    in = channels;
    f = CeilDiv(f, 2);
  }
  conv_ = CreateChildren<Conv2DLayer>("conv", convs);
  const double drop = p.GetFloat("input_dropout_prob");
  if (drop > 0) {
    dropout_ = CreateChild<DropoutLayer>("dropout", DropoutLayer::Params().Set("keep_prob", 1 - drop));
  }
  const std::string type = p.GetString("encoder_type");
  if (type == "blstm") {
    const int64_t layers = p.GetInt("lstm_layers");
    const int64_t cell = p.GetInt("lstm_cell_dim") > 0 ? p.GetInt("lstm_cell_dim") : model_dim_ / 2;
    if (layers < 1 || cell < 1) {
      throw InvalidArgumentError(StrCat(path(), ": 'blstm' needs lstm_layers >= 1 and a cell dim >= 1"));
    }
    ParamValue::List fwd, bwd;
    int64_t dim = f * in;
    for (int64_t l = 0; l < layers; ++l) {
      glossa::Params c = p.GetParams("lstm_tpl").Copy();
      c.Set("num_input_nodes", dim).Set("num_output_nodes", cell);
      fwd.emplace_back(RNNLayer::Params().Set("cell", c).Set("reverse", false));
      bwd.emplace_back(RNNLayer::Params().Set("cell", c.Copy()).Set("reverse", true));
      dim = 2 * cell;
    }
    fwd_ = CreateChildren<RNNLayer>("fwd", fwd);
    bwd_ = CreateChildren<RNNLayer>("bwd", bwd);
    if (dim != model_dim_) {
      glossa::Params proj = ProjectionLayer::Params();
      proj.Set("input_dim", dim).Set("output_dim", model_dim_).Set("activation", "NONE");
      proj.Set("has_bias", true);
      lstm_proj_ = CreateChild<ProjectionLayer>("proj", proj);
    }
    return;
  }
  if (type != "transformer") {
    throw InvalidArgumentError(StrCat(path(), ": encoder_type must be 'transformer' or 'blstm', got '",
                                      type, "'"));
  }
  glossa::Params proj = ProjectionLayer::Params();
  proj.Set("input_dim", f * in).Set("output_dim", model_dim_).Set("activation", "NONE");
  proj.Set("has_bias", true);
  proj_ = CreateChild<ProjectionLayer>("proj", proj);
  glossa::Params pos = p.GetParams("position_emb").Copy();
  if (pos.GetInt("embedding_dim") == 0) pos.Set("embedding_dim", model_dim_);
  position_emb_ = CreateChild<PositionalEmbeddingLayer>("position_emb", pos);
  glossa::Params stack = p.GetParams("transformer_stack").Copy();
  if (stack.GetInt("mdl_dim") == 0) stack.Set("mdl_dim", model_dim_);
  stack_ = CreateChild<TransformerStack>("transformer_stack", stack);
  if (stack_->model_dim() != model_dim_) {
    throw InvalidArgumentError(StrCat(path(), ": transformer_stack's model dim ", stack_->model_dim(),
                                      " != model_dim ", model_dim_));
  }
}

NestedMap AsrEncoder::FProp(const NestedMap& theta, const at::Tensor& features,
                            const at::Tensor& paddings) const {
  at::Tensor x = CastToFPropDtype(features);
  at::Tensor pad = paddings.to(at::kFloat);
  for (const auto& c : conv_) std::tie(x, pad) = c->FProp(c.Theta(theta), x, pad);
  x = x.reshape({x.size(0), x.size(1), -1});
  if (!fwd_.empty()) {
    // Time-major through the bidirectional layers; a padded step carries the state, so the
    // backward RNN starts at each utterance's last real frame.
    at::Tensor xt = x.transpose(0, 1);
    const at::Tensor tpad = pad.transpose(0, 1).unsqueeze(-1).to(xt.scalar_type());
    for (size_t l = 0; l < fwd_.size(); ++l) {
      at::Tensor f = fwd_[l]->FProp(fwd_[l].Theta(theta), xt, tpad).first;
      at::Tensor b = bwd_[l]->FProp(bwd_[l].Theta(theta), xt, tpad).first;
      xt = at::cat({f, b}, -1);
    }
    x = xt.transpose(0, 1);
    if (lstm_proj_) x = lstm_proj_->FProp(lstm_proj_.Theta(theta), x);
    if (dropout_) x = dropout_->FProp(dropout_.Theta(theta), x);
    x = x * (1 - pad).unsqueeze(-1).to(x.scalar_type());
    return NestedMap{{"encoded", x}, {"paddings", pad}};
  }
  x = proj_->FProp(proj_.Theta(theta), x);
  x = x + position_emb_->FProp(position_emb_.Theta(theta), x.size(1)).to(x.scalar_type()).unsqueeze(0);
  if (dropout_) x = dropout_->FProp(dropout_.Theta(theta), x);
  x = x * (1 - pad).unsqueeze(-1).to(x.scalar_type());
  x = stack_->FProp(stack_.Theta(theta), x, pad);
  return NestedMap{{"encoded", x}, {"paddings", pad}};
}

// ---- AsrModel ----

glossa::Params AsrModel::Params() {
  glossa::Params p = BaseTask::Params();
  p.Set("cls", ClsOf<AsrModel>());
  p.Define("frontend", MelAsrFrontend::Params(), "The log-mel frontend.");
  p.Define("specaugment", SpecAugmentLayer::Params(), "SpecAugment in training (None: off).");
  // BaseTask defines encoder and decoder (None); here: the encoder (input_dim set from the
  // frontend) and the attention decoder (None for a CTC-only model, ctc_weight 1).
  p.Set("encoder", AsrEncoder::Params());
  p.Set("decoder", mt::TransformerDecoder::Params());
  p.Define("ctc_weight", 0.0, "Weight of the CTC loss (0: attention only; 1: CTC only).");
  p.Define("decoding", "", "'beam', 'greedy' or 'ctc_greedy' ('': beam with a decoder, else ctc_greedy).");
  p.Define("joint_ctc_decoding_weight", 0.0,
           "Weight w of the CTC prefix scores joined with the decoder's in 'beam' and 'greedy' "
           "decoding: (1 - w)·log p_att + w·log p_ctc (Watanabe et al. 2017); needs ctc_weight > 0. "
           "0: the decoder alone.");
  p.Define("lm", nullptr,
           "A language model over the decoder's vocabulary for shallow fusion in 'beam' and "
           "'greedy' decoding (TransformerLmTask Params; None: no fusion). It is not trained with "
           "this task: load its variables with train.init_from_checkpoint_rules from the LM's "
           "own checkpoint, and keep them out of training with "
           "train.learner.bprop_variable_exclusion (asr.synth.LasTinyLm does both).");
  p.Define("lm_fusion_weight", 0.0,
           "Weight b of the fused LM: score = joint decoder (and CTC) log-prob + b·log p_lm "
           "(Gulcehre et al. 2015). Needs `lm`; 0 with an lm: carried but not used.");
  p.Define("lexicon_file", "",
           "A word list (one word per line; what follows a word on its line is ignored): 'beam' "
           "and 'greedy' decoding then spell only these words (glossa/search/lexicon.h). '': "
           "any character sequence. `glossa export` copies it into the bundle.");
  return p;
}

glossa::Params AsrModel::CommonParams(int64_t vocab_size, int64_t model_dim, int64_t hidden_dim,
                                      int64_t num_heads, int64_t encoder_layers,
                                      int64_t decoder_layers, double ctc_weight) {
  glossa::Params mtp = mt::TransformerModel::CommonParams(vocab_size, model_dim, hidden_dim,
                                                          num_heads, decoder_layers);
  glossa::Params p = Params();
  p.Set("name", "asr");
  p.Set("encoder.model_dim", model_dim).Set("encoder.input_dropout_prob", 0.1);
  glossa::Params enc_stack = mt::TransformerModel::CommonParams(vocab_size, model_dim, hidden_dim,
                                                                num_heads, encoder_layers)
                                 .GetParams("encoder.transformer_stack")
                                 .Copy();
  p.Set("encoder.transformer_stack", enc_stack);
  p.Set("ctc_weight", ctc_weight);
  if (ctc_weight >= 1.0) {
    p.Set("decoder", nullptr);
  } else {
    glossa::Params dec = mtp.GetParams("decoder").Copy();
    dec.Set("target_seq_len", 300);
    p.Set("decoder", dec);
  }
  return p;
}

AsrModel::AsrModel(const glossa::Params& p) : BaseTask(p) {
  frontend_ = CreateChild<MelAsrFrontend>("frontend", p.GetParams("frontend"));
  sample_rate_ = static_cast<int64_t>(p.GetParams("frontend").GetFloat("sample_rate"));
  if (p.IsSet("specaugment")) {
    specaugment_ = CreateChild<SpecAugmentLayer>("specaugment", p.GetParams("specaugment"));
  }
  glossa::Params enc = p.GetParams("encoder").Copy();
  enc.Set("input_dim", frontend_->output_dim());
  encoder_ = CreateChild<AsrEncoder>("encoder", enc);
  ctc_weight_ = p.GetFloat("ctc_weight");
  if (!(ctc_weight_ >= 0 && ctc_weight_ <= 1)) {
    throw InvalidArgumentError(StrCat(path(), ": ctc_weight must be in [0, 1]"));
  }
  const bool has_decoder = p.IsSet("decoder");
  if (!has_decoder && ctc_weight_ < 1) {
    throw InvalidArgumentError(StrCat(path(), ": a model without a decoder needs ctc_weight 1"));
  }
  if (has_decoder) {
    decoder_ = CreateChild<mt::TransformerDecoder>("decoder", p.GetParams("decoder"));
    vocab_size_ = decoder_->vocab_size();
  } else {
    const ParamValue& tok = p.Get("input").is_params() ? p.GetParams("input").Get("tokenizer")
                                                       : ParamValue();
    vocab_size_ = tok.is_params() ? tok.AsParams().GetInt("vocab_size") : 76;
  }
  if (ctc_weight_ > 0) {
    glossa::Params proj = ProjectionLayer::Params();
    proj.Set("input_dim", encoder_->model_dim()).Set("output_dim", vocab_size_ + 1);
    proj.Set("activation", "NONE").Set("has_bias", true);
    ctc_proj_ = CreateChild<ProjectionLayer>("ctc_proj", proj);
  }
  decoding_ = p.GetString("decoding");
  if (decoding_.empty()) decoding_ = has_decoder ? "beam" : "ctc_greedy";
  if (decoding_ != "beam" && decoding_ != "greedy" && decoding_ != "ctc_greedy") {
    throw InvalidArgumentError(StrCat(path(), ": decoding must be 'beam', 'greedy' or 'ctc_greedy'"));
  }
  if ((decoding_ == "ctc_greedy" && !ctc_proj_) || (decoding_ != "ctc_greedy" && !has_decoder)) {
    throw InvalidArgumentError(StrCat(path(), ": decoding '", decoding_, "' needs ",
                                      decoding_ == "ctc_greedy" ? "a CTC head (ctc_weight > 0)"
                                                                : "a decoder"));
  }
  joint_ctc_weight_ = p.GetFloat("joint_ctc_decoding_weight");
  if (!(joint_ctc_weight_ >= 0 && joint_ctc_weight_ <= 1)) {
    throw InvalidArgumentError(StrCat(path(), ": joint_ctc_decoding_weight must be in [0, 1], got ",
                                      joint_ctc_weight_));
  }
  if (joint_ctc_weight_ > 0 && !ctc_proj_) {
    throw InvalidArgumentError(StrCat(path(), ": joint_ctc_decoding_weight ", joint_ctc_weight_,
                                      " needs a CTC head (ctc_weight > 0)"));
  }
  lm_fusion_weight_ = p.GetFloat("lm_fusion_weight");
  if (!(lm_fusion_weight_ >= 0 && std::isfinite(lm_fusion_weight_))) {
    throw InvalidArgumentError(StrCat(path(), ": lm_fusion_weight must be finite and >= 0, got ",
                                      lm_fusion_weight_));
  }
  if (p.IsSet("lm")) {
    if (!has_decoder) {
      throw InvalidArgumentError(StrCat(path(), ": lm (shallow fusion) needs a decoder"));
    }
    glossa::Params lm = p.GetParams("lm").Copy();
    lm.Set("input", nullptr);
    lm_ = CreateChild<TransformerLmTask>("lm", lm);
    if (lm_->vocab_size() != vocab_size_) {
      throw InvalidArgumentError(StrCat(path(), ": lm's vocabulary (", lm_->vocab_size(),
                                        ") differs from the decoder's (", vocab_size_, ")"));
    }
  } else if (lm_fusion_weight_ > 0) {
    throw InvalidArgumentError(StrCat(path(), ": lm_fusion_weight ", lm_fusion_weight_,
                                      " needs an lm"));
  }
  const std::string lexicon = p.GetString("lexicon_file");
  if (!lexicon.empty()) {
    if (!has_decoder) {
      throw InvalidArgumentError(StrCat(path(), ": lexicon_file needs a decoder (beam or greedy)"));
    }
    lexicon_ = LoadLexicon(p, lexicon, vocab_size_, path());
  }
}

NestedMap AsrModel::Encode(const NestedMap& theta, const NestedMap& src) const {
  auto [feats, pad] = frontend_->FProp(frontend_.Theta(theta), src.GetTensor("src_inputs"),
                                       src.GetTensor("paddings"));
  if (specaugment_) feats = specaugment_->FProp(specaugment_.Theta(theta), feats, pad);
  return encoder_->FProp(encoder_.Theta(theta), feats, pad);
}

NestedMap AsrModel::ComputePredictions(const NestedMap& theta, const NestedMap& batch) const {
  return Encode(theta, batch.GetItem("src").AsMap());
}

at::Tensor AsrModel::CtcLogProbs(const NestedMap& theta, const at::Tensor& encoded) const {
  return at::log_softmax(ctc_proj_->FProp(ctc_proj_.Theta(theta), encoded).to(at::kFloat), -1);
}

BaseTask::LossOutput AsrModel::ComputeLoss(const NestedMap& theta, const NestedMap& predictions,
                                           const NestedMap& batch) const {
  const NestedMap& tgt = batch.GetItem("tgt").AsMap();
  LossOutput out;
  at::Tensor att_loss, ctc_loss;
  if (decoder_) {
    out = decoder_->ComputeLoss(decoder_.Theta(theta), predictions, tgt);
    att_loss = out.metrics.at("loss").value;
  }
  if (ctc_proj_) {
    const at::Tensor lp = CtcLogProbs(theta, predictions.GetTensor("encoded"));  // [B, T', V+1]
    const at::Tensor in_lens = (1 - predictions.GetTensor("paddings")).sum(1).to(at::kLong);
    // Targets: the labels without </s>.
    const at::Tensor tgt_lens =
        at::clamp_min((1 - tgt.GetTensor("paddings").to(at::kFloat)).sum(1).to(at::kLong) - 1, 0);
    ctc_loss = at::ctc_loss(lp.transpose(0, 1), tgt.GetTensor("labels").to(at::kLong), in_lens,
                            tgt_lens, /*blank=*/vocab_size_, at::Reduction::Mean,
                            /*zero_infinity=*/true);
    const at::Tensor n = at::full({}, static_cast<double>(lp.size(0)), at::kFloat);
    out.metrics["ctc_loss"] = {ctc_loss.detach(), n};
    // CTC cannot align a target longer than its input: ctc_loss counts such utterances as 0
    // (zero_infinity); say how many there were.
    out.metrics["ctc_infeasible_fraction"] = {(in_lens < tgt_lens).to(at::kFloat).mean(), n};
  }
  const at::Tensor weight =
      decoder_ ? out.metrics.at("loss").weight : out.metrics.at("ctc_loss").weight;
  at::Tensor loss;
  if (!ctc_proj_) {
    loss = att_loss;
  } else if (!decoder_) {
    loss = ctc_loss;
  } else {
    loss = (1 - ctc_weight_) * att_loss + ctc_weight_ * ctc_loss;
  }
  out.metrics["loss"] = {loss, weight};
  return out;
}

NestedMap AsrModel::Transcribe(const NestedMap& theta, const NestedMap& src, int64_t num_hyps) const {
  at::NoGradGuard no_grad;
  EvalModeScope eval;
  const NestedMap enc = Encode(theta, src);
  const int64_t b = enc.GetTensor("encoded").size(0);
  if (decoding_ == "ctc_greedy") {
    const at::Tensor best = std::get<1>(CtcLogProbs(theta, enc.GetTensor("encoded")).max(-1));
    const at::Tensor lens = (1 - enc.GetTensor("paddings")).sum(1).to(at::kLong);
    const at::Tensor bc = best.contiguous(), lc = lens.contiguous();
    const auto a = bc.accessor<int64_t, 2>();
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(b));
    int64_t longest = 1;
    for (int64_t i = 0; i < b; ++i) {
      int64_t prev = -1;
      for (int64_t t = 0; t < lc[i].item<int64_t>(); ++t) {
        const int64_t id = a[i][t];
        if (id != prev && id != vocab_size_) rows[i].push_back(id);
        prev = id;
      }
      longest = std::max<int64_t>(longest, static_cast<int64_t>(rows[i].size()));
    }
    at::Tensor ids = at::zeros({b, 1, longest}, at::kLong);
    at::Tensor out_lens = at::zeros({b, 1}, at::kLong);
    for (int64_t i = 0; i < b; ++i) {
      for (size_t t = 0; t < rows[i].size(); ++t) ids[i][0][static_cast<int64_t>(t)] = rows[i][t];
      out_lens[i][0] = static_cast<int64_t>(rows[i].size());
    }
    return NestedMap{{"topk_ids", ids}, {"topk_lens", out_lens},
                     {"topk_scores", at::zeros({b, 1}, at::kDouble)}};
  }
  std::optional<CtcPrefixScorer> ctc;
  if (joint_ctc_weight_ > 0) {
    ctc.emplace(CtcLogProbs(theta, enc.GetTensor("encoded")),
                (1 - enc.GetTensor("paddings")).sum(1).to(at::kLong), joint_ctc_weight_,
                decoder_->sos_id(), decoder_->eos_id());
  }
  mt::LmFusion fusion;
  if (lm_ && lm_fusion_weight_ > 0) {
    fusion = mt::LmFusion{lm_.get(), &lm_.Theta(theta), lm_fusion_weight_};
  }
  return mt::SearchDecoder(*decoder_, decoder_.Theta(theta), enc, b, decoding_, num_hyps,
                           ctc ? &*ctc : nullptr, fusion.lm ? &fusion : nullptr, lexicon_.get());
}

NestedMap AsrModel::Decode(const NestedMap& batch) {
  NestedMap out = Transcribe(theta(), batch.GetItem("src").AsMap(), 0);
  out.Set("tgt.labels", batch.GetTensor("tgt.labels"));
  out.Set("tgt.paddings", batch.GetTensor("tgt.paddings"));
  return out;
}

std::map<std::string, double> AsrModel::CreateDecoderMetrics() const {
  return {{"num_samples_in_batch", 0.0}, {"wer", 0.0},         {"cer", 0.0},
          {"word_errors", 0.0},          {"ref_words", 0.0},   {"char_errors", 0.0},
          {"ref_chars", 0.0}};
}

std::vector<std::string> AsrModel::PostProcessDecodeOut(const NestedMap& decode_out,
                                                        std::map<std::string, double>& metrics) {
  const BaseTokenizer& tok = mt::TokenizerOf(*this);
  const at::Tensor tgt_lens = (1 - decode_out.GetTensor("tgt.paddings").to(at::kFloat)).sum(1);
  const std::vector<std::string> refs = mt::RowsToStrings(tok, decode_out.GetTensor("tgt.labels"), tgt_lens);
  const std::vector<std::string> hyps =
      mt::RowsToStrings(tok, decode_out.GetTensor("topk_ids").select(1, 0),
                 decode_out.GetTensor("topk_lens").select(1, 0));
  std::vector<std::string> lines;
  for (size_t i = 0; i < hyps.size(); ++i) {
    if (tgt_lens[static_cast<int64_t>(i)].item<double>() <= 0) continue;
    const ErrorCounts w = WordErrors(refs[i], hyps[i]), c = CharErrors(refs[i], hyps[i]);
    metrics["num_samples_in_batch"] += 1;
    metrics["word_errors"] += static_cast<double>(w.errors());
    metrics["ref_words"] += static_cast<double>(w.reference_length);
    metrics["char_errors"] += static_cast<double>(c.errors());
    metrics["ref_chars"] += static_cast<double>(c.reference_length);
    lines.push_back(StrCat(refs[i], " ||| ", hyps[i]));
  }
  return lines;
}

void AsrModel::DecodeFinalize(std::map<std::string, double>& metrics) {
  metrics["wer"] = metrics["word_errors"] / std::max(1.0, metrics["ref_words"]);
  metrics["cer"] = metrics["char_errors"] / std::max(1.0, metrics["ref_chars"]);
}

std::map<std::string, InferenceSubgraphSpec> AsrModel::Inference() const {
  std::map<std::string, InferenceSubgraphSpec> out;
  InferenceSubgraphSpec& t = out["transcribe"];
  t.doc = StrCat("Transcribes ", sample_rate_, " Hz PCM WAV utterances.");
  t.feeds["wav"] = {"string", 1, false, "[B] WAV files' bytes, or their base64 (JSON).", true};
  t.feeds["num_hyps"] = {"int64", 0, true, "Hypotheses per utterance (beam width)."};
  t.feeds["num_hyps"].min = 1;
  t.fetches["transcript"] = {"string", 1, false, "[B] the best hypothesis."};
  t.fetches["hyps"] = {"string", 1, false, "[B] every hypothesis, best first, joined by \" ||| \"."};
  t.fetches["scores"] = {"float32", 2, false, "[B, K] the hypotheses' scores, best first."};
  return out;
}

InferenceMap AsrModel::RunInference(const NestedMap& theta, const std::string& subgraph,
                                    const InferenceMap& feeds,
                                    const BaseTokenizer* tokenizer) const {
  if (subgraph != "transcribe") return BaseTask::RunInference(theta, subgraph, feeds, tokenizer);
  if (tokenizer == nullptr) {
    throw FailedPreconditionError(StrCat("task '", path(), "': inference needs a tokenizer"));
  }
  const auto& wavs = feeds.at("wav").strings;
  std::vector<at::Tensor> pcm;
  int64_t longest = 0;
  for (size_t i = 0; i < wavs.size(); ++i) {
    const std::string what = StrCat("feed 'wav'[", i, "]");
    std::string bytes = wavs[i];
    if (bytes.compare(0, 4, "RIFF") != 0) {
      const std::optional<std::string> decoded = Base64Decode(bytes);
      if (!decoded || decoded->compare(0, 4, "RIFF") != 0) {
        throw InvalidArgumentError(StrCat(what, ": not a WAV file, nor the base64 of one"));
      }
      bytes = *decoded;
    }
    Wav w;
    try {
      w = ParseWav(bytes, what);
    } catch (const Error& e) {
      throw InvalidArgumentError(e.message());
    }
    if (w.sample_rate != sample_rate_) {
      throw InvalidArgumentError(StrCat(what, ": ", w.sample_rate, " Hz; the model takes ",
                                        sample_rate_, " Hz (resample it: sox in.wav -r ",
                                        sample_rate_, " out.wav)"));
    }
    if (frontend_->NumFrames(w.samples.numel()) < 8) {
      throw InvalidArgumentError(StrCat(what, ": ", w.samples.numel(), " samples are too short to "
                                        "transcribe"));
    }
    longest = std::max<int64_t>(longest, w.samples.numel());
    pcm.push_back(w.samples);
  }
  const int64_t b = static_cast<int64_t>(pcm.size());
  at::Tensor x = at::zeros({b, longest}, at::kFloat), pad = at::ones({b, longest}, at::kFloat);
  for (int64_t i = 0; i < b; ++i) {
    x[i].slice(0, 0, pcm[i].numel()).copy_(pcm[i]);
    pad[i].slice(0, 0, pcm[i].numel()).fill_(0);
  }
  int64_t k = 0;
  if (feeds.count("num_hyps")) {
    k = feeds.at("num_hyps").tensor.item<int64_t>();
    if (k < 1 || k > 64) throw InvalidArgumentError("feed 'num_hyps' must be in [1, 64]");
  }
  const NestedMap r = Transcribe(theta, NestedMap{{"src_inputs", x}, {"paddings", pad}}, k);
  const at::Tensor ids = r.GetTensor("topk_ids"), lens = r.GetTensor("topk_lens");
  std::vector<std::string> best, all;
  for (int64_t i = 0; i < b; ++i) {
    const std::vector<std::string> hyps = mt::RowsToStrings(*tokenizer, ids[i], lens[i]);
    best.push_back(hyps.empty() ? "" : hyps[0]);
    std::string joined;
    for (size_t j = 0; j < hyps.size(); ++j) joined += (j ? " ||| " : "") + hyps[j];
    all.push_back(joined);
  }
  InferenceMap out;
  out["transcript"] = InferenceValue::Strings(std::move(best));
  out["hyps"] = InferenceValue::Strings(std::move(all));
  out["scores"] = InferenceValue::Of(r.GetTensor("topk_scores").to(at::kFloat));
  return out;
}

GLOSSA_REGISTER_CLASS(AsrEncoder, "glossa.asr.AsrEncoder");
GLOSSA_REGISTER_CLASS(AsrModel, "glossa.asr.AsrModel");

}  // namespace asr
}  // namespace glossa
