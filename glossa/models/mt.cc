#include "glossa/models/mt.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <cmath>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/input/tokenizers.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/fused_xent.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "glossa/metrics/bleu.h"
#include "glossa/models/transformer_lm.h"
#include "glossa/search/beam_search.h"
#include "glossa/search/ctc_prefix_score.h"
#include "glossa/search/lexicon.h"

namespace glossa {
namespace mt {
namespace {

void CheckDim(const BaseLayer& layer, const char* key, int64_t value, const char* what,
              int64_t want) {
  if (value != want) {
    throw InvalidArgumentError(StrCat("layer '", layer.path(), "': ", key, " (", value,
                                      ") must equal ", what, " (", want, ")"));
  }
}

// x = emb(ids) (scaled by sqrt(dim) in the embedding) + positions[0..T).
at::Tensor EmbedWithPositions(const Child<EmbeddingLayer>& emb,
                              const Child<PositionalEmbeddingLayer>& pos, const NestedMap& theta,
                              const at::Tensor& ids) {
  at::Tensor x = emb->FProp(emb.Theta(theta), ids);
  return x + pos->FProp(pos.Theta(theta), ids.size(1)).to(x.scalar_type());
}

void CheckIdsPaddings(const BaseLayer& layer, const char* what, const at::Tensor& ids,
                      const at::Tensor& paddings) {
  if (ids.dim() != 2 || !paddings.defined() || paddings.sizes() != ids.sizes()) {
    throw InvalidArgumentError(StrCat("layer '", layer.path(), "': ", what,
                                      ".ids and ", what, ".paddings must both be [B, T], got ",
                                      ids.sizes(), " and ",
                                      paddings.defined() ? StrCat(paddings.sizes()) : "none"));
  }
}

}  // namespace

// Lingvo's MT layers name some settings differently (lingvo/tasks/mt/layers.py TransformerStack:
// num_transformer_layers, transformer_tpl, ln_output, model_dim; decoder.py TransformerDecoder:
// trans_tpl, ln_output). Both names are accepted so that Lingvo override paths carry over: a value
// given under Lingvo's name moves to Glossa's key before the child is built.
void DefineLingvoAlias(glossa::Params& p, const char* lingvo, const char* glossa_key) {
  p.Define(lingvo, nullptr, StrCat("Lingvo's name for ", glossa_key, " (None: use ", glossa_key,
                                   ")."));
}

ParamValue ResolveLingvoAlias(const glossa::Params& p, const glossa::Params& defaults,
                              const std::string& where, const char* lingvo,
                              const char* glossa_key) {
  const ParamValue& v = p.Get(lingvo);
  if (v.is_none()) return p.Get(glossa_key);
  if (!(p.Get(glossa_key) == defaults.Get(glossa_key))) {
    throw InvalidArgumentError(StrCat(where, ": both ", lingvo, " (Lingvo's name) and ", glossa_key,
                                      " are set; set one"));
  }
  return v;
}

glossa::Params EncoderStackParams() {
  glossa::Params p = TransformerStack::Params();
  DefineLingvoAlias(p, "num_transformer_layers", "num_layers");
  DefineLingvoAlias(p, "transformer_tpl", "transformer_layer_params_tpl");
  DefineLingvoAlias(p, "ln_output", "final_layer_norm");
  DefineLingvoAlias(p, "model_dim", "mdl_dim");
  return p;
}

// ---- TransformerEncoder ----

glossa::Params TransformerEncoder::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerEncoder>());
  p.Define("token_emb", EmbeddingLayer::Params().Set("scale_sqrt_depth", true),
           "Source token embedding (vocab_size, embedding_dim; scaled by sqrt(embedding_dim)).");
  p.Define("position_emb", PositionalEmbeddingLayer::Params(), "Sinusoidal position embedding.");
  p.Define("model_dim", 512, "Model dimension: the embeddings' and the stack's.");
  p.Define("input_dropout_prob", 0.0, "Dropout on the embedded input.");
  p.Define("transformer_stack", EncoderStackParams(),
           "The encoder's TransformerStack (num_layers, mdl_dim, hidden_dim, num_atten_heads, "
           "transformer_layer_params_tpl, final_layer_norm; or Lingvo's MT names "
           "num_transformer_layers, transformer_tpl, ln_output, model_dim).");
  return p;
}

TransformerEncoder::TransformerEncoder(const glossa::Params& p) : BaseLayer(p) {
  model_dim_ = p.GetInt("model_dim");
  glossa::Params emb = p.GetParams("token_emb").Copy();
  if (emb.GetInt("embedding_dim") == 0) emb.Set("embedding_dim", model_dim_);
  glossa::Params pos = p.GetParams("position_emb").Copy();
  if (pos.GetInt("embedding_dim") == 0) pos.Set("embedding_dim", model_dim_);
  glossa::Params stack = p.GetParams("transformer_stack").Copy();
  const glossa::Params defaults = TransformerStack::Params();
  for (const auto& [lingvo, key] : {std::pair{"num_transformer_layers", "num_layers"},
                                    {"transformer_tpl", "transformer_layer_params_tpl"},
                                    {"ln_output", "final_layer_norm"},
                                    {"model_dim", "mdl_dim"}}) {
    if (stack.Contains(lingvo)) {
      const ParamValue v =
          ResolveLingvoAlias(stack, defaults, path() + ".transformer_stack", lingvo, key);
      stack.Delete(lingvo);
      stack.Set(key, v);
    }
  }
  stack.Set("input_dropout_prob", p.GetFloat("input_dropout_prob"));
  if (stack.GetInt("mdl_dim") == 0) stack.Set("mdl_dim", model_dim_);
  token_emb_ = CreateChild<EmbeddingLayer>("token_emb", emb);
  position_emb_ = CreateChild<PositionalEmbeddingLayer>("position_emb", pos);
  stack_ = CreateChild<TransformerStack>("transformer_stack", stack);
  CheckDim(*this, "token_emb.embedding_dim", emb.GetInt("embedding_dim"), "model_dim", model_dim_);
  CheckDim(*this, "position_emb.embedding_dim", pos.GetInt("embedding_dim"), "model_dim",
           model_dim_);
  CheckDim(*this, "transformer_stack's model dim", stack_->model_dim(), "model_dim", model_dim_);
}

NestedMap TransformerEncoder::FProp(const NestedMap& theta, const NestedMap& src) const {
  const at::Tensor& ids = src.GetTensor("ids");
  const at::Tensor paddings = src.GetTensor("paddings").to(at::kFloat);
  CheckIdsPaddings(*this, "src", ids, paddings);
  at::Tensor x = EmbedWithPositions(token_emb_, position_emb_, theta, ids);
  x = stack_->FProp(stack_.Theta(theta), x, paddings);
  return NestedMap{{"encoded", x}, {"paddings", paddings}};
}

// ---- TransformerDecoder ----

glossa::Params TransformerDecoder::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerDecoder>());
  p.Define("token_emb", EmbeddingLayer::Params().Set("scale_sqrt_depth", true),
           "Target token embedding (vocab_size, embedding_dim; scaled by sqrt(embedding_dim)).");
  p.Define("position_emb", PositionalEmbeddingLayer::Params(), "Sinusoidal position embedding.");
  p.Define("model_dim", 512, "Model dimension.");
  p.Define("input_dropout_prob", 0.0, "Dropout on the embedded input.");
  p.Define("num_trans_layers", 6, "Number of decoder layers.");
  glossa::Params layer = TransformerLayer::Params();
  layer.Set("mask_self_atten", true).Set("has_aux_atten", true);
  p.Define("trans_decoder_tpl", layer,
           "Decoder layer template (TransformerLayer; causal self-attention and cross-attention "
           "are set here).");
  p.Define("final_layer_norm", true, "A layer norm after the last layer (pre-norm layers).");
  DefineLingvoAlias(p, "trans_tpl", "trans_decoder_tpl");
  DefineLingvoAlias(p, "ln_output", "final_layer_norm");
  p.Define("shared_emb", false,
           "Tie the softmax to the target embedding: logits = h · token_emb.emb_varᵀ + bias "
           "(the softmax child is not created).");
  p.Define("softmax", SimpleFullSoftmax::Params().Set("compute_per_example_argmax", false),
           "Softmax (input_dim and num_classes default to model_dim and the vocabulary).");
  p.Define("label_smoothing", 0.1,
           "Lingvo's UniformLabelSmoother: targets 1 - e on the label and e / (vocab - 1) on "
           "every other class.");
  p.Define("per_word_avg_loss", true,
           "Loss averaged per target token (True) or per sequence (False, Lingvo's option).");
  p.Define("target_seq_len", 128, "Maximum decoded length, </s> included.");
  p.Define("target_sos_id", 1, "Id of <s>, the first decoder input.");
  p.Define("target_eos_id", 2, "Id of </s>.");
  p.Define("beam_search", BeamSearchHelper::Params(),
           "Beam search Params (target_seq_len, target_sos_id and target_eos_id are set from "
           "the decoder's).");
  p.Define("sampling_temperature", 0.0,
           "decoding 'sample': softmax temperature (0 in 'greedy').");
  p.Define("sampling_top_k", 0, "decoding 'sample': draw among the k most likely tokens (0: all).");
  p.Define("sampling_seed", 1234, "decoding 'sample': the random seed.");
  return p;
}

TransformerDecoder::TransformerDecoder(const glossa::Params& p) : BaseLayer(p) {
  model_dim_ = p.GetInt("model_dim");
  shared_emb_ = p.GetBool("shared_emb");
  per_word_avg_loss_ = p.GetBool("per_word_avg_loss");
  label_smoothing_ = p.GetFloat("label_smoothing");
  target_seq_len_ = p.GetInt("target_seq_len");
  sos_id_ = p.GetInt("target_sos_id");
  eos_id_ = p.GetInt("target_eos_id");
  if (label_smoothing_ < 0 || label_smoothing_ >= 1) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': label_smoothing must be in [0, 1)"));
  }
  if (target_seq_len_ <= 0) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': target_seq_len must be > 0"));
  }
  glossa::Params emb = p.GetParams("token_emb").Copy();
  if (emb.GetInt("embedding_dim") == 0) emb.Set("embedding_dim", model_dim_);
  glossa::Params pos = p.GetParams("position_emb").Copy();
  if (pos.GetInt("embedding_dim") == 0) pos.Set("embedding_dim", model_dim_);
  vocab_size_ = emb.GetInt("vocab_size");
  glossa::Params stack = TransformerStack::Params();
  stack.Set("num_layers", p.GetInt("num_trans_layers"));
  stack.Set("mdl_dim", model_dim_).Set("mask_self_atten", true).Set("has_aux_atten", true);
  stack.Set("input_dropout_prob", p.GetFloat("input_dropout_prob"));
  {
    // Lingvo's names (trans_tpl, ln_output) resolved onto Glossa's.
    const glossa::Params defaults = TransformerDecoder::Params();
    stack.Set("final_layer_norm",
              ResolveLingvoAlias(p, defaults, path(), "ln_output", "final_layer_norm"));
    stack.Set("transformer_layer_params_tpl",
              ResolveLingvoAlias(p, defaults, path(), "trans_tpl", "trans_decoder_tpl"));
  }
  token_emb_ = CreateChild<EmbeddingLayer>("token_emb", emb);
  position_emb_ = CreateChild<PositionalEmbeddingLayer>("position_emb", pos);
  stack_ = CreateChild<TransformerStack>("decoder_trans", stack);
  CheckDim(*this, "token_emb.embedding_dim", emb.GetInt("embedding_dim"), "model_dim", model_dim_);
  CheckDim(*this, "position_emb.embedding_dim", pos.GetInt("embedding_dim"), "model_dim",
           model_dim_);
  if (shared_emb_) {
    CreateVariable("softmax_bias", WeightParams({vocab_size_}, WeightInit::Constant(0.0),
                                                p.Get("dtype").AsDType()));
  } else {
    glossa::Params sm = p.GetParams("softmax").Copy();
    if (sm.GetInt("input_dim") == 0) sm.Set("input_dim", model_dim_);
    if (sm.GetInt("num_classes") == 0) sm.Set("num_classes", vocab_size_);
    sm.Set("label_smoothing", label_smoothing_);
    CheckDim(*this, "softmax.input_dim", sm.GetInt("input_dim"), "model_dim", model_dim_);
    CheckDim(*this, "softmax.num_classes", sm.GetInt("num_classes"), "token_emb.vocab_size",
             vocab_size_);
    softmax_ = CreateChild<SimpleFullSoftmax>("softmax", sm);
  }
  sampling_temperature_ = p.GetFloat("sampling_temperature");
  sampling_top_k_ = p.GetInt("sampling_top_k");
  sampling_seed_ = static_cast<uint64_t>(p.GetInt("sampling_seed"));
  glossa::Params beam = p.GetParams("beam_search").Copy();
  beam.Set("target_seq_len", target_seq_len_).Set("target_sos_id", sos_id_);
  beam.Set("target_eos_id", eos_id_);
  if (beam.GetFloat("coverage_penalty") > 0) {
    throw UnimplementedError(StrCat("layer '", path(), "': beam_search.coverage_penalty needs ",
                                    "attention probabilities, which this decoder's ExtendStep ",
                                    "does not return; leave it 0"));
  }
  beam_search_ = CreateChild<BeamSearchHelper>("beam_search", beam);
  beam_params_ = beam.Copy();
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"target_sos_id", sos_id_},
                                   {"target_eos_id", eos_id_}}) {
    if (value < 0 || value >= vocab_size_) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': ", key, " (", value,
                                        ") must be a token id in [0, ", vocab_size_, ")"));
    }
  }
}

at::Tensor TransformerDecoder::Embed(const NestedMap& theta, const at::Tensor& ids) const {
  return EmbedWithPositions(token_emb_, position_emb_, theta, ids);
}

at::Tensor TransformerDecoder::Project(const NestedMap& theta, const at::Tensor& h) const {
  if (!shared_emb_) return softmax_->Logits(softmax_.Theta(theta), h);
  const at::Tensor& w = token_emb_.Theta(theta).GetTensor("emb_var");  // [V, D]
  const at::Tensor x = h.to(w.scalar_type());
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = vocab_size_;
  return at::addmm(theta.GetTensor("softmax_bias"), x.reshape({-1, model_dim_}), w.t()).view(shape);
}

at::Tensor TransformerDecoder::Logits(const NestedMap& theta, const NestedMap& encoder_outputs,
                                      const at::Tensor& tgt_ids,
                                      const at::Tensor& tgt_paddings) const {
  CheckIdsPaddings(*this, "tgt", tgt_ids, tgt_paddings);
  at::Tensor x = Embed(theta, tgt_ids);
  x = stack_->FProp(stack_.Theta(theta), x, tgt_paddings.to(at::kFloat),
                    encoder_outputs.GetTensor("encoded"), encoder_outputs.GetTensor("paddings"));
  return Project(theta, x);
}

BaseTask::LossOutput TransformerDecoder::ComputeLoss(const NestedMap& theta,
                                                     const NestedMap& encoder_outputs,
                                                     const NestedMap& tgt) const {
  const at::Tensor& labels = tgt.GetTensor("labels");
  const at::Tensor paddings = tgt.GetTensor("paddings").to(at::kFloat);
  at::Tensor weights = tgt.Has("weights") ? tgt.GetTensor("weights").to(at::kFloat)
                                          : at::ones(labels.sizes(), at::kFloat);
  weights = weights * (1 - paddings);
  const at::Tensor logits = Logits(theta, encoder_outputs, tgt.GetTensor("ids"), paddings);
  if (labels.sizes() != logits.sizes().slice(0, 2)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': tgt.labels must be shaped like ",
                                      "tgt.ids, got ", labels.sizes()));
  }
  const at::Tensor labels64 = labels.to(at::kLong);
  if (labels64.numel() > 0 &&
      (labels64.min().item<int64_t>() < 0 || labels64.max().item<int64_t>() >= vocab_size_)) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': tgt.labels must be in [0, ", vocab_size_, ")"));
  }
  // Lingvo's UniformLabelSmoother: 1 - ε on the label, ε / (V - 1) on every other class, that is
  // xent = -(1 - ε - ε/(V-1))·log p_label - ε/(V-1)·Σ_c log p_c.
  const double uniform = label_smoothing_ > 0 ? label_smoothing_ / (vocab_size_ - 1) : 0.0;
  at::Tensor xent, label_lp, max_lp;
  if (logits.scalar_type() != at::kDouble && FusedSoftmaxXentSupported()) {
    SoftmaxXent r = FusedSoftmaxXent(logits, labels64, 1 - label_smoothing_ - uniform, uniform,
                                     /*want_argmax=*/false);
    xent = r.xent;
    label_lp = r.label_log_prob;
    max_lp = r.max_log_prob;
  } else {
    const at::Tensor log_probs = at::log_softmax(
        logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat), -1);
    const at::Tensor lp_label = log_probs.gather(-1, labels64.unsqueeze(-1)).squeeze(-1);
    xent = -lp_label;
    if (label_smoothing_ > 0) {
      xent = xent * (1 - label_smoothing_) - (log_probs.sum(-1) - lp_label) * uniform;
    }
    label_lp = lp_label.detach();
    max_lp = at::amax(log_probs.detach(), {-1});
  }
  const at::Tensor w = weights.to(xent.scalar_type());
  const at::Tensor num_tokens = w.sum().detach();
  const at::Tensor num_seqs = at::full({}, static_cast<double>(labels.size(0)), w.options());
  const at::Tensor total_xent = (xent * w).sum();
  // Lingvo's MTBaseDecoder: per word, or per sequence (over the batch's rows).
  at::Tensor loss = per_word_avg_loss_ ? total_xent / at::clamp_min(num_tokens, 1e-6)
                                       : total_xent / num_seqs;
  const at::Tensor lp = label_lp.detach() * w;
  // log_pplx is Lingvo's: the training cross-entropy per token (label smoothing included);
  // log_pplx_without_smoothing is the reference's log-perplexity.
  const at::Tensor log_pplx = total_xent.detach() / at::clamp_min(num_tokens, 1e-6);
  const at::Tensor nll = -lp.sum() / at::clamp_min(num_tokens, 1e-6);
  const at::Tensor correct =
      ((label_lp >= max_lp).to(w.scalar_type()) * w).sum() /
      at::clamp_min(num_tokens, 1e-6);
  BaseTask::LossOutput out;
  out.metrics["loss"] = Metric{loss, per_word_avg_loss_ ? num_tokens : num_seqs};
  out.metrics["log_pplx"] = Metric{log_pplx, num_tokens};
  out.metrics["log_pplx_without_smoothing"] = Metric{nll, num_tokens};
  out.metrics["fraction_of_correct_next_step_preds"] = Metric{correct, num_tokens};
  out.metrics["num_predictions"] = Metric{num_tokens, at::full({}, 1.0)};
  // Per sequence: the log-probability of the reference, and its per-token average.
  const at::Tensor seq_lp = lp.sum(1);
  const at::Tensor seq_len = w.sum(1);
  out.metrics["log_pplx_per_sequence"] =
      Metric{-(seq_lp.sum() / at::clamp_min(num_seqs, 1e-6)), num_seqs};
  out.per_example.Set("per_sequence_log_prob", seq_lp);
  out.per_example.Set("per_sequence_num_tokens", seq_len);
  return out;
}

NestedMap TransformerDecoder::PrecomputeSource(const NestedMap& theta,
                                               const NestedMap& encoder_outputs,
                                               int64_t num_hyps) const {
  const at::Tensor& encoded = encoder_outputs.GetTensor("encoded");
  const int64_t b = encoded.size(0);
  if (num_hyps % b != 0) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': ", num_hyps,
                                      " hypotheses are not a multiple of the batch ", b));
  }
  const int64_t k = num_hyps / b;
  // Hypothesis h = i · B + b reads source b: tile the whole batch k times.
  const at::Tensor tiled = k == 1 ? encoded : encoded.repeat({k, 1, 1});
  const at::Tensor paddings = encoder_outputs.GetTensor("paddings").to(at::kFloat);
  NestedMap out;
  out.Put("aux", stack_->PrecomputeAux(stack_.Theta(theta), tiled));
  out.Put("aux_paddings", k == 1 ? paddings : paddings.repeat({k, 1}));
  out.Put("positions", position_emb_->FProp(position_emb_.Theta(theta), target_seq_len_));
  if (shared_emb_) {
    // The tied softmax weight transposed once ([D, V], contiguous): each step's logits GEMM then
    // reads it in the layout the BLAS packs fastest, not the embedding's [V, D] transposed.
    out.Put("softmax_weight",
            token_emb_.Theta(theta).GetTensor("emb_var").to(fprop_dtype()).t().contiguous());
  }
  return out;
}

NestedMap TransformerDecoder::InitDecodeStates(int64_t num_hyps) const {
  return stack_->InitStates(num_hyps, fprop_dtype());
}

std::pair<at::Tensor, NestedMap> TransformerDecoder::ExtendStep(const NestedMap& theta,
                                                                const NestedMap& source,
                                                                const at::Tensor& ids,
                                                                int64_t step,
                                                                const NestedMap& states) const {
  const at::Tensor& positions = source.GetTensor("positions");
  if (step < 0 || step >= positions.size(0)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': step ", step, " is outside [0, ",
                                      positions.size(0), ") (target_seq_len)"));
  }
  at::Tensor x = token_emb_->FProp(token_emb_.Theta(theta), ids);
  x = x + positions[step].to(x.scalar_type());
  auto [y, new_states] = stack_->ExtendStepProjected(stack_.Theta(theta), x, states,
                                                     source.GetItem("aux").AsMap(),
                                                     source.GetTensor("aux_paddings"));
  at::Tensor logits =
      source.contains("softmax_weight")
          ? at::addmm(theta.GetTensor("softmax_bias").to(y.scalar_type()), y,
                      source.GetTensor("softmax_weight").to(y.scalar_type()))
          : Project(theta, y);
  return {at::log_softmax(logits.to(at::kFloat), -1), std::move(new_states)};
}

// ---- TransformerModel ----

glossa::Params TransformerModel::Params() {
  glossa::Params p = BaseTask::Params();
  p.Set("cls", ClsOf<TransformerModel>());
  p.Set("encoder", TransformerEncoder::Params());
  p.Set("decoder", TransformerDecoder::Params());
  p.Define("decoding", "beam",
           "Decode with 'beam' (decoder.beam_search), 'greedy' or 'sample' "
           "(decoder.sampling_temperature, sampling_top_k, sampling_seed).");
  p.Define("bleu_separator_type", "",
           "How decoded and reference strings are unsegmented before BLEU: '' (as the tokenizer "
           "detokenizes them: SentencePiece gives plain text), or 'spm', 'wpm', 'bpe' for a "
           "vocabulary-file tokenizer that returns pieces (Lingvo's BleuScorer).");
  return p;
}

glossa::Params TransformerModel::CommonParams(int64_t vocab_size, int64_t model_dim,
                                              int64_t hidden_dim, int64_t num_heads,
                                              int64_t num_layers) {
  glossa::Params p = Params();
  const auto init = WeightInit::Gaussian(1.0 / std::sqrt(static_cast<double>(model_dim)));
  for (const char* side : {"encoder", "decoder"}) {
    glossa::Params& s = p.GetParams(side);
    s.Set("model_dim", model_dim).Set("input_dropout_prob", 0.1);
    s.Set("token_emb.vocab_size", vocab_size).Set("token_emb.embedding_dim", model_dim);
    s.Set("token_emb.params_init", init.ToParams());
    s.Set("position_emb.embedding_dim", model_dim);
  }
  // Lingvo's SetupTransformerParams: dropout 0.1 on the inputs and residual branches, none on
  // the attention weights or the feed-forward hidden layer.
  glossa::Params& enc = p.GetParams("encoder.transformer_stack");
  enc.Set("num_layers", num_layers).Set("mdl_dim", model_dim);
  glossa::Params& dec = p.GetParams("decoder");
  dec.Set("num_trans_layers", num_layers).Set("shared_emb", true).Set("label_smoothing", 0.1);
  for (glossa::Params* layer : {&enc.GetParams("transformer_layer_params_tpl"),
                                &dec.GetParams("trans_decoder_tpl")}) {
    TransformerLayer::SetCanonicalShapeParams(*layer, model_dim, hidden_dim, num_heads);
    layer->Set("tr_atten_tpl.residual_dropout_prob", 0.1);
    layer->Set("tr_fflayer_tpl.residual_dropout_prob", 0.1);
  }
  p.Set("decoder.beam_search.num_hyps_per_beam", 4);
  p.Set("decoder.beam_search.length_normalization", 0.6);
  return p;
}

TransformerModel::TransformerModel(const glossa::Params& p) : BaseTask(p) {
  encoder_ = CreateChild<TransformerEncoder>("encoder", p.GetParams("encoder"));
  decoder_ = CreateChild<TransformerDecoder>("decoder", p.GetParams("decoder"));
  decoding_ = p.GetString("decoding");
  bleu_separator_ = p.GetString("bleu_separator_type");
  if (decoding_ != "beam" && decoding_ != "greedy" && decoding_ != "sample") {
    throw InvalidArgumentError(StrCat("task '", path(), "': decoding must be 'beam', 'greedy' or ",
                                      "'sample', got '", decoding_, "'"));
  }
  CheckDim(*this, "decoder.model_dim", decoder_->params().GetInt("model_dim"), "encoder.model_dim",
           encoder_->model_dim());
}

NestedMap TransformerModel::ComputePredictions(const NestedMap& theta,
                                               const NestedMap& batch) const {
  return encoder_->FProp(encoder_.Theta(theta), batch.GetItem("src").AsMap());
}

BaseTask::LossOutput TransformerModel::ComputeLoss(const NestedMap& theta,
                                                   const NestedMap& predictions,
                                                   const NestedMap& batch) const {
  LossOutput out = decoder_->ComputeLoss(decoder_.Theta(theta), predictions, batch.GetItem("tgt").AsMap());
  out.metrics["num_samples_in_batch"] = Metric{
      at::full({}, static_cast<double>(batch.GetTensor("tgt.ids").size(0))), at::full({}, 1.0)};
  return out;
}

NestedMap SearchDecoder(const TransformerDecoder& dec, const NestedMap& dec_theta,
                        const NestedMap& enc, int64_t b, const std::string& decoding,
                        int64_t num_hyps, const CtcPrefixScorer* ctc, const LmFusion* lm,
                        const LexiconConstraint* lexicon) {
  if (lm && lm->lm == nullptr) lm = nullptr;
  if (lm && lm->lm->vocab_size() != dec.vocab_size()) {
    throw InvalidArgumentError(StrCat("shallow fusion: the language model's vocabulary (",
                                      lm->lm->vocab_size(), ") differs from the decoder's (",
                                      dec.vocab_size(), ")"));
  }
  // The decoder's step, joined with the CTC prefix scores (whose states ride along under
  // "ctc_prefix") and the fused LM's log-probs (under "lm_fusion") when there are any.
  auto make_step = [&](const NestedMap& source) -> DecodeStepFn {
    if (!ctc && !lm && !lexicon) {
      return [&dec, &dec_theta, source](const at::Tensor& ids, int64_t step, const NestedMap& states) {
        return dec.ExtendStep(dec_theta, source, ids, step, states);
      };
    }
    return [&dec, &dec_theta, source, ctc, lm, lexicon](const at::Tensor& ids, int64_t step,
                                                        const NestedMap& states) {
      NestedMap dec_states = states;
      if (ctc) dec_states.erase("ctc_prefix");
      if (lm) dec_states.erase("lm_fusion");
      if (lexicon) dec_states.erase("lexicon");
      auto [log_probs, new_states] = dec.ExtendStep(dec_theta, source, ids, step, dec_states);
      if (ctc) {
        auto [joint, ctc_states] = ctc->Step(ids, log_probs, states.GetItem("ctc_prefix").AsMap());
        log_probs = joint;
        new_states.Put("ctc_prefix", std::move(ctc_states));
      }
      if (lm) {
        auto [lm_log_probs, lm_states] =
            lm->lm->ExtendStep(*lm->theta, ids, step, states.GetItem("lm_fusion").AsMap());
        log_probs = log_probs + lm->weight * lm_log_probs;
        new_states.Put("lm_fusion", std::move(lm_states));
      }
      if (lexicon) {
        auto [masked, lex_states] = lexicon->Step(ids, log_probs, states.GetItem("lexicon").AsMap());
        log_probs = masked;
        new_states.Put("lexicon", std::move(lex_states));
      }
      return std::make_pair(log_probs, new_states);
    };
  };
  auto init_states = [&](int64_t n) {
    NestedMap states = dec.InitDecodeStates(n);
    if (ctc) states.Put("ctc_prefix", ctc->InitStates(n));
    if (lm) states.Put("lm_fusion", lm->lm->InitDecodeStates(n));
    if (lexicon) states.Put("lexicon", lexicon->InitStates(n));
    return states;
  };
  SearchResult r;
  if (decoding == "beam") {
    // Another width than the configured one (the translate subgraph's num_hyps): a helper of
    // the same Params with that width.
    std::unique_ptr<BeamSearchHelper> other;
    const BeamSearchHelper* beam = &dec.beam_search();
    if (num_hyps > 0 && num_hyps != beam->num_hyps_per_beam()) {
      glossa::Params bp = dec.beam_search_params().Copy();
      bp.Set("name", "beam_search").Set("num_hyps_per_beam", num_hyps);
      if (bp.GetInt("num_hyps_to_return") > num_hyps) bp.Set("num_hyps_to_return", num_hyps);
      other = InstantiateLayer<BeamSearchHelper>(bp);
      beam = other.get();
    }
    const int64_t n = beam->num_hyps_per_beam() * b;
    const NestedMap source = dec.PrecomputeSource(dec_theta, enc, n);
    r = beam->Search(b, init_states(n), make_step(source));
  } else {
    const NestedMap source = dec.PrecomputeSource(dec_theta, enc, b);
    const double temperature = decoding == "greedy" ? 0.0 : dec.sampling_temperature();
    r = SampleSearch(b, init_states(b), make_step(source), dec.target_seq_len(), dec.sos_id(), dec.eos_id(), temperature,
                     dec.sampling_top_k(), dec.sampling_seed());
  }
  return NestedMap{{"topk_ids", r.topk_ids},
                   {"topk_lens", r.topk_lens},
                   {"topk_scores", r.topk_scores}};
}

NestedMap TransformerModel::Translate(const NestedMap& theta, const NestedMap& src,
                                      int64_t num_hyps) const {
  at::NoGradGuard no_grad;
  EvalModeScope eval;
  const NestedMap enc = encoder_->FProp(encoder_.Theta(theta), src);
  return SearchDecoder(*decoder_, decoder_.Theta(theta), enc, src.GetTensor("ids").size(0),
                       decoding_, num_hyps);
}

NestedMap TransformerModel::Decode(const NestedMap& batch) {
  NestedMap out = Translate(theta(), batch.GetItem("src").AsMap(), 0);
  out.Put("src", batch.GetItem("src").AsMap());
  out.Put("tgt", batch.GetItem("tgt").AsMap());
  return out;
}

std::map<std::string, double> TransformerModel::CreateDecoderMetrics() const {
  return {{"num_samples_in_batch", 0.0}, {"corpus_bleu", 0.0}};
}

std::vector<std::string> RowsToStrings(const BaseTokenizer& tok, const at::Tensor& ids,
                                       const at::Tensor& lens) {
  const at::Tensor c = ids.to(at::kLong).contiguous();
  const at::Tensor l = lens.to(at::kLong).contiguous();
  const auto a = c.accessor<int64_t, 2>();
  const auto n = l.accessor<int64_t, 1>();
  std::vector<std::string> out;
  for (int64_t i = 0; i < c.size(0); ++i) {
    std::vector<int64_t> row;
    for (int64_t t = 0; t < std::min<int64_t>(n[i], c.size(1)); ++t) {
      if (a[i][t] == tok.eos_id()) break;
      if (a[i][t] == tok.sos_id()) continue;
      row.push_back(a[i][t]);
    }
    out.push_back(tok.IdsToString(row));
  }
  return out;
}

const BaseTokenizer& TokenizerOf(const BaseTask& task) {
  if (!task.has_input()) {
    throw FailedPreconditionError(
        StrCat("task '", task.path(), "': decoding needs an input with a tokenizer"));
  }
  const auto* seq = dynamic_cast<const BaseSequenceInputGenerator*>(&task.input());
  if (seq == nullptr) {
    throw FailedPreconditionError(
        StrCat("task '", task.path(), "': decoding needs a sequence input (with a tokenizer)"));
  }
  return seq->tokenizer();
}

std::vector<std::string> TransformerModel::PostProcessDecodeOut(
    const NestedMap& decode_out, std::map<std::string, double>& metrics) {
  const BaseTokenizer& tok = TokenizerOf(*this);
  const at::Tensor src_ids = decode_out.GetTensor("src.ids");
  const at::Tensor src_lens = (1 - decode_out.GetTensor("src.paddings").to(at::kFloat)).sum(1);
  const at::Tensor tgt_labels = decode_out.GetTensor("tgt.labels");
  const at::Tensor tgt_lens = (1 - decode_out.GetTensor("tgt.paddings").to(at::kFloat)).sum(1);
  const at::Tensor best = decode_out.GetTensor("topk_ids").select(1, 0);
  const at::Tensor best_lens = decode_out.GetTensor("topk_lens").select(1, 0);
  const std::vector<std::string> srcs = RowsToStrings(tok, src_ids, src_lens);
  const std::vector<std::string> refs = RowsToStrings(tok, tgt_labels, tgt_lens);
  const std::vector<std::string> hyps = RowsToStrings(tok, best, best_lens);
  std::vector<std::string> lines;
  for (size_t i = 0; i < hyps.size(); ++i) {
    // Examples with no target (padding rows of a final partial batch) are not scored.
    if (tgt_lens[static_cast<int64_t>(i)].item<double>() <= 0) continue;
    lines.push_back(StrCat(srcs[i], " ||| ", refs[i], " ||| ", hyps[i]));
    bleu_refs_.push_back(refs[i]);
    bleu_hyps_.push_back(hyps[i]);
    metrics["num_samples_in_batch"] += 1;
  }
  return lines;
}

void TransformerModel::DecodeFinalize(std::map<std::string, double>& metrics) {
  BleuScorer bleu(4, bleu_separator_);
  for (size_t i = 0; i < bleu_refs_.size(); ++i) bleu.AddSentence(bleu_refs_[i], bleu_hyps_[i]);
  metrics["corpus_bleu"] = bleu.ComputeOverallScore();
  bleu_refs_.clear();
  bleu_hyps_.clear();
}

std::map<std::string, InferenceSubgraphSpec> TransformerModel::Inference() const {
  std::map<std::string, InferenceSubgraphSpec> out;
  InferenceSubgraphSpec& t = out["translate"];
  t.doc = "Translates source sentences with the decoder's search (beam by default).";
  t.feeds["source"] = {"string", 1, false, "Source sentences."};
  t.feeds["num_hyps"] = {"int64", 0, true, "Hypotheses to return per source (beam width)."};
  t.feeds["num_hyps"].min = 1;
  t.fetches["translation"] = {"string", 1, false, "[B] the best hypothesis."};
  t.fetches["hyps"] = {"string", 1, false,
                       "[B] every hypothesis, best first, joined by \" ||| \"."};
  t.fetches["scores"] = {"float32", 2, false,
                         "[B, K] the hypotheses' scores, best first; -inf past num_hyps_found."};
  t.fetches["ids"] = {"int64", 3, false, "[B, K, T] the hypotheses' ids (</s> included)."};
  t.fetches["num_hyps_found"] = {
      "int64", 1, false,
      "[B] the hypotheses the search found (at most K; JSON rows of scores and ids are cut to "
      "it)."};
  return out;
}

InferenceMap TransformerModel::RunInference(const std::string& subgraph,
                                            const InferenceMap& feeds,
                                            const BaseTokenizer* tokenizer) const {
  if (subgraph != "translate") return BaseTask::RunInference(subgraph, feeds, tokenizer);
  if (tokenizer == nullptr) {
    throw FailedPreconditionError(StrCat("task '", path(), "': inference needs a tokenizer"));
  }
  int64_t num_hyps = 0;
  if (auto it = feeds.find("num_hyps"); it != feeds.end()) {
    num_hyps = it->second.tensor.item<int64_t>();
    if (num_hyps < 1 || num_hyps > 64) {
      throw InvalidArgumentError(StrCat("feed 'num_hyps' must be in [1, 64], got ", num_hyps));
    }
  }
  const auto& text = feeds.at("source").strings;
  // The source is the tokens and </s>, as the inputs write it.
  std::vector<std::vector<int64_t>> rows;
  size_t longest = 1;
  for (const auto& t : text) {
    rows.push_back(tokenizer->StringToIds(t));
    rows.back().push_back(tokenizer->eos_id());
    longest = std::max(longest, rows.back().size());
  }
  at::Tensor ids = at::zeros({static_cast<int64_t>(rows.size()), static_cast<int64_t>(longest)},
                             at::kLong);
  at::Tensor paddings = at::ones(ids.sizes(), at::kFloat);
  for (size_t i = 0; i < rows.size(); ++i) {
    int64_t* id = ids[static_cast<int64_t>(i)].data_ptr<int64_t>();
    float* pad = paddings[static_cast<int64_t>(i)].data_ptr<float>();
    for (size_t t = 0; t < rows[i].size(); ++t) {
      id[t] = rows[i][t];
      pad[t] = 0;
    }
  }
  NestedMap src{{"ids", ids}, {"paddings", paddings}};
  const NestedMap r = Translate(theta(), src, num_hyps);
  const at::Tensor out_ids = r.GetTensor("topk_ids"), lens = r.GetTensor("topk_lens");
  // A slot the search filled with no hypothesis (fewer ended than were asked for) has length 0:
  // it is left out of the strings, and its score is -inf, never a 0 that outranks the real ones.
  at::Tensor scores = r.GetTensor("topk_scores").to(at::kFloat).clone();
  at::Tensor found = (lens > 0).to(at::kLong).sum(1);
  scores.masked_fill_(lens <= 0, -std::numeric_limits<float>::infinity());
  std::vector<std::string> best, all;
  for (int64_t i = 0; i < out_ids.size(0); ++i) {
    std::vector<std::string> h = RowsToStrings(*tokenizer, out_ids[i], lens[i]);
    std::vector<std::string> real;
    for (size_t k = 0; k < h.size(); ++k) {
      if (lens[i][static_cast<int64_t>(k)].item<int64_t>() > 0) real.push_back(h[k]);
    }
    best.push_back(real.empty() ? std::string() : real[0]);
    all.push_back(Join(real, " ||| "));
  }
  InferenceMap out;
  out["translation"] = InferenceValue::Strings(std::move(best));
  out["hyps"] = InferenceValue::Strings(std::move(all));
  out["scores"] = InferenceValue::Of(scores);
  out["ids"] = InferenceValue::Of(out_ids);
  out["num_hyps_found"] = InferenceValue::Of(found);
  return out;
}

GLOSSA_REGISTER_CLASS(TransformerEncoder, "glossa.mt.encoder.TransformerEncoder");
GLOSSA_REGISTER_CLASS(TransformerDecoder, "glossa.mt.decoder.TransformerDecoder");
GLOSSA_REGISTER_CLASS(TransformerModel, "glossa.mt.model.TransformerModel");

}  // namespace mt
}  // namespace glossa
