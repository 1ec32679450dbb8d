// The MT Transformer decoder (Lingvo's mt.decoder.TransformerDecoder): teacher-forced loss,
// incremental steps, beam search, greedy and sampling.
#include "glossa/tasks/mt/mt_decoder.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/compute_plan.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <cmath>

#include "glossa/base/errors.h"
#include "glossa/tasks/mt/mt_common.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/input/tokenizers.h"
#include "glossa/layers/embedding.h"
#include "glossa/kernels/fused_xent.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/metrics/bleu.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/search/beam_search.h"
#include "glossa/search/ctc_prefix_score.h"
#include "glossa/search/lexicon.h"

namespace glossa {
namespace mt {

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
                                      const at::Tensor& tgt_paddings,
                                      const at::Tensor& tgt_segment_ids,
                                      const at::Tensor& tgt_segment_pos) const {
  CheckIdsPaddings(*this, "tgt", tgt_ids, tgt_paddings);
  const at::Tensor src_segment_ids = OptionalInput(encoder_outputs, "segment_ids");
  if (tgt_segment_ids.defined() != src_segment_ids.defined()) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': packed inputs need segment_ids on ",
                                      "both sides, got them only for the ",
                                      tgt_segment_ids.defined() ? "target" : "source"));
  }
  at::Tensor x = EmbedWithPositions(token_emb_, position_emb_, theta, tgt_ids, tgt_segment_pos);
  x = stack_->FProp(stack_.Theta(theta), x, tgt_paddings.to(at::kFloat),
                    encoder_outputs.GetTensor("encoded"), encoder_outputs.GetTensor("paddings"),
                    tgt_segment_ids, src_segment_ids);
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
  const at::Tensor segment_ids = OptionalInput(tgt, "segment_ids");
  const at::Tensor logits = Logits(theta, encoder_outputs, tgt.GetTensor("ids"), paddings,
                                   segment_ids, OptionalInput(tgt, "segment_pos"));
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
  if (logits.scalar_type() != at::kDouble && FusedSoftmaxXentApplies(logits)) {
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
  // Packed rows hold several sequences: their count is the sum of each row's largest segment id.
  const at::Tensor num_seqs =
      segment_ids.defined()
          ? std::get<0>(segment_ids.max(1)).sum().to(w.scalar_type())
          : at::full({}, static_cast<double>(labels.size(0)), w.options());
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
  // Per example: a packed row is not one sequence, so these are left out for packed inputs.
  if (!segment_ids.defined()) {
    out.per_example.Set("per_sequence_log_prob", seq_lp);
    out.per_example.Set("per_sequence_num_tokens", seq_len);
  }
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
  // Hypothesis h = i · B + b reads source b: one copy of each source's keys and values, which
  // its num_hyps / B hypotheses read as query rows (CTranslate2's layout), not a tiled copy each.
  NestedMap out;
  out.Put("aux", stack_->PrecomputeAux(stack_.Theta(theta), encoded));
  out.Put("aux_paddings", encoder_outputs.GetTensor("paddings").to(at::kFloat));
  out.Put("positions", position_emb_->FProp(position_emb_.Theta(theta), target_seq_len_));
  if (shared_emb_ && PlannedWeight("softmax_weight", {token_emb_.Theta(theta).GetTensor(
                                                         "emb_var")}) == nullptr) {
    // The tied softmax weight transposed once per decode ([D, V], contiguous): each step's logits
    // GEMM then reads it in the layout the BLAS packs fastest, not the embedding's [V, D]
    // transposed. (An inference plan transposed it once at load: PrepareWeights.)
    const at::Tensor emb = token_emb_.Theta(theta).GetTensor("emb_var").to(fprop_dtype());
    out.Put("softmax_weight", emb.t().contiguous());
  }
  return out;
}

NestedMap TransformerDecoder::ShortlistSource(const NestedMap& theta,
                                              const at::Tensor& ids) const {
  if (ids.dim() != 1 || ids.numel() == 0 || ids.min().item<int64_t>() < 0 ||
      ids.max().item<int64_t>() >= vocab_size_) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': a shortlist's ids must be [S] in [0, ",
                                      vocab_size_, ")"));
  }
  NestedMap out;
  out.Put("shortlist_ids", ids);
  if (shared_emb_) {
    const at::Tensor& emb = token_emb_.Theta(theta).GetTensor("emb_var");  // [V, D]
    out.Put("shortlist_weight", emb.index_select(0, ids).t().contiguous().to(fprop_dtype()));
    out.Put("shortlist_bias", theta.GetTensor("softmax_bias").index_select(0, ids));
  } else {
    const NestedMap& sm = softmax_.Theta(theta);  // weight_0 [D, V], bias_0 [V]
    out.Put("shortlist_weight",
            sm.GetTensor("weight_0").index_select(1, ids).contiguous().to(fprop_dtype()));
    out.Put("shortlist_bias", sm.GetTensor("bias_0").index_select(0, ids));
  }
  return out;
}

std::shared_ptr<const ComputePlan> TransformerDecoder::PlanShortlist(
    const NestedMap& shortlist_source) const {
  if (compute_plan() == nullptr || !ComputePlan::AppliesNow()) return nullptr;
  auto plan = std::make_shared<ComputePlan>(compute_plan()->policy());
  const at::Tensor& w = shortlist_source.GetTensor("shortlist_weight");
  plan->Prepare("shortlist", w, {w});
  return plan;
}

void TransformerDecoder::PrepareWeights(const NestedMap& theta, ComputePlan& plan) const {
  if (!shared_emb_) return;  // the softmax layer prepares its own
  const at::Tensor& emb = token_emb_.Theta(theta).GetTensor("emb_var");  // [V, D]
  plan.Prepare(PlanKey("softmax_weight"), emb.t(), {emb});
}

NestedMap TransformerDecoder::InitDecodeStates(int64_t num_hyps) const {
  return stack_->InitStates(num_hyps, fprop_dtype());
}

std::pair<at::Tensor, NestedMap> TransformerDecoder::ExtendStep(const NestedMap& theta,
                                                                const NestedMap& source,
                                                                const at::Tensor& ids,
                                                                int64_t step,
                                                                const NestedMap& states,
                                                                const ComputePlan* shortlist_plan) const {
  const at::Tensor& positions = source.GetTensor("positions");
  if (step < 0 || step >= positions.size(0)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': step ", step, " is outside [0, ",
                                      positions.size(0), ") (target_seq_len)"));
  }
  at::Tensor x = token_emb_->FProp(token_emb_.Theta(theta), ids);
  x = x + positions[step].to(x.scalar_type());
  // The stack through the one decoding interface, with the source projected once (Precompute).
  NestedMap context;
  context.Put("aux", source.GetItem("aux").AsMap());
  context.Put("aux_paddings", source.GetTensor("aux_paddings"));
  const StepLayer& dec = *stack_;
  auto [y, new_states] = dec.ExtendStep(stack_.Theta(theta), x, states, context);
  if (source.contains("shortlist_ids")) {
    // A vocabulary shortlist: the logits and the log-softmax over its ids only; every other
    // token is -inf (never extended).
    const at::Tensor& ids_s = source.GetTensor("shortlist_ids");
    const at::Tensor& w_s = source.GetTensor("shortlist_weight");
    const at::Tensor& b_s = source.GetTensor("shortlist_bias");
    const PreparedWeight* prepared =
        shortlist_plan != nullptr ? shortlist_plan->Find("shortlist", {w_s}) : nullptr;
    const at::Tensor logits =
        prepared != nullptr
            ? shortlist_plan->Affine(*prepared, y, b_s.to(y.scalar_type()))
            : Affine(y, w_s.to(y.scalar_type()), b_s.to(y.scalar_type()));
    at::Tensor log_probs = at::full({y.size(0), vocab_size_},
                                    -std::numeric_limits<float>::infinity(), at::kFloat);
    log_probs.index_copy_(1, ids_s, at::log_softmax(logits.to(at::kFloat), -1));
    return {log_probs, std::move(new_states)};
  }
  const PreparedWeight* planned =
      shared_emb_ ? PlannedWeight("softmax_weight", {token_emb_.Theta(theta).GetTensor("emb_var")})
                  : nullptr;
  at::Tensor logits =
      planned != nullptr ? compute_plan()->Affine(*planned, y, theta.GetTensor("softmax_bias"))
      : source.contains("softmax_weight")
          ? Affine(y, source.GetTensor("softmax_weight").to(y.scalar_type()),
                   theta.GetTensor("softmax_bias").to(y.scalar_type()))
          : Project(theta, y);
  return {at::log_softmax(logits.to(at::kFloat), -1), std::move(new_states)};
}

GLOSSA_REGISTER_CLASS(TransformerDecoder, "glossa.mt.decoder.TransformerDecoder");

}  // namespace mt
}  // namespace glossa
