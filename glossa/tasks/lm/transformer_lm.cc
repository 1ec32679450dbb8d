#include "glossa/tasks/lm/transformer_lm.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/core/step_seed.h"
#include "glossa/input/vocabulary_check.h"
#include "glossa/input/tokenizers.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/flops.h"
#include "glossa/layers/moe.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/tasks/lm/lm_generation.h"
#include "glossa/model/pipeline_metrics.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"

namespace glossa {

glossa::Params TransformerLmTask::Params() {
  glossa::Params p = BaseTask::Params();
  p.Set("cls", ClsOf<TransformerLmTask>());
  p.Define("emb", EmbeddingLayer::Params().Set("scale_sqrt_depth", true),
           "Token embedding params (vocab_size, embedding_dim).");
  p.Define("position_emb", PositionalEmbeddingLayer::Params(),
           "Sinusoidal position embedding params (embedding_dim).");
  p.Define("stack",
           TransformerStack::Params().Set("mask_self_atten", true).Set("place_ends_on_stages", true),
           "The causal TransformerStack (its transformer_layer_params_tpl holds the attention "
           "and feed-forward templates). Pipelined over ranks (splits, --mesh=pipe:S) with "
           "place_ends_on_stages (Lingvo's placement), the embedding lives on stage 0 and the "
           "softmax and loss on the last stage.");
  p.Define("softmax", SimpleFullSoftmax::Params().Set("compute_per_example_argmax", false),
           "Softmax params (input_dim, num_classes, label_smoothing).");
  p.Define("aux_loss_weight", 0.01,
           "Weight of the MoE load-balancing losses (summed over layers) in the training loss.");
  p.Define("decode_prompt_length", 8,
           "Decode: prompt tokens (including <s>) taken from each example.");
  p.Define("decode_max_new_tokens", 24, "Decode: tokens to sample after the prompt.");
  p.Define("decode_temperature", 0.8, "Decode: softmax temperature (0: greedy).");
  p.Define("decode_top_k", 40, "Decode: sample among the k most likely tokens (0: all).");
  return p;
}

glossa::Params TransformerLmTask::CommonParams(int64_t vocab_size, int64_t model_dim,
                                               int64_t hidden_dim, int64_t num_heads,
                                               int64_t num_layers) {
  glossa::Params p = Params();
  p.Set("emb.vocab_size", vocab_size).Set("emb.embedding_dim", model_dim);
  p.Set("emb.params_init",
        WeightInit::Gaussian(1.0 / std::sqrt(static_cast<double>(model_dim))).ToParams());
  p.Set("position_emb.embedding_dim", model_dim);
  p.Set("stack.num_layers", num_layers);
  TransformerLayer::SetCanonicalShapeParams(p.GetParams("stack.transformer_layer_params_tpl"),
                                            model_dim, hidden_dim, num_heads);
  p.Set("softmax.input_dim", model_dim).Set("softmax.num_classes", vocab_size);
  return p;
}

TransformerLmTask::TransformerLmTask(const glossa::Params& p) : BaseTask(p) {
  // Lingvo's pipeline placement: on a pipe axis the embedding is stage 0's and the softmax the
  // last stage's (their variables this rank's alone); elsewhere both are built here. The
  // softmax's FLOPs count on the last stage when the stack derives its stages.
  glossa::Params stack = p.GetParams("stack").Copy();
  stack.Set("end_stage_flops",
            ParamValue::List{0.0, DeclaredFlopsPerToken(p.GetParams("softmax")).value_or(0.0)});
  ends_ = TransformerStack::PlaceEnds(stack, build_context());
  BuildContext stage = build_context();
  if (ends_.axis != nullptr) stage.WithCollection(kPipelineStageCollection);
  auto scope = [&](const char* name) {
    const std::string set = p.GetParams(name).GetString("name");
    return set.empty() ? std::string(name) : set;
  };
  if (ends_.axis == nullptr || ends_.first()) {
    emb_ = CreateChildIn<EmbeddingLayer>(stage, "emb", p.GetParams("emb"));
  } else {
    DeclareRemoteScope(scope("emb"));
  }
  position_emb_ = CreateChild<PositionalEmbeddingLayer>("position_emb", p.GetParams("position_emb"));
  stack_ = CreateChild<TransformerStack>("stack", stack);
  if (ends_.axis == nullptr || ends_.last()) {
    softmax_ = CreateChildIn<SimpleFullSoftmax>(stage, "softmax", p.GetParams("softmax"));
  } else {
    DeclareRemoteScope(scope("softmax"));
  }
  vocab_size_ = p.GetInt("emb.vocab_size");
  const int64_t dim = p.GetInt("emb.embedding_dim");
  auto check = [&](const char* key, int64_t value, const char* what, int64_t want) {
    if (value != want) {
      throw InvalidArgumentError(StrCat("task '", path(), "': ", key, " (", value,
                                        ") must equal ", what, " (", want, ")"));
    }
  };
  check("position_emb.embedding_dim", p.GetInt("position_emb.embedding_dim"),
        "emb.embedding_dim", dim);
  check("the stack's model dim (stack.mdl_dim or its layers' input_dim)", stack_->model_dim(),
        "emb.embedding_dim", dim);
  check("softmax.input_dim", p.GetInt("softmax.input_dim"), "emb.embedding_dim", dim);
  check("softmax.num_classes", p.GetInt("softmax.num_classes"), "emb.vocab_size", vocab_size_);
  if (has_input()) {
    CheckVocabularyAgrees(input(), {{"emb.vocab_size", vocab_size_},
                                    {"softmax.num_classes", p.GetInt("softmax.num_classes")}},
                          StrCat("task '", path(), "'"));
  }
  label_smoothing_ = p.GetFloat("softmax.label_smoothing");
  aux_loss_weight_ = p.GetFloat("aux_loss_weight");
  decode_prompt_length_ = p.GetInt("decode_prompt_length");
  decode_max_new_tokens_ = p.GetInt("decode_max_new_tokens");
  decode_temperature_ = p.GetFloat("decode_temperature");
  decode_top_k_ = p.GetInt("decode_top_k");
}

at::Tensor TransformerLmTask::Hidden(const NestedMap& theta, const at::Tensor& ids,
                                     const at::Tensor& paddings) const {
  at::Tensor x = emb_->FProp(emb_.Theta(theta), ids);
  x = x + position_emb_->FProp(position_emb_.Theta(theta), ids.size(1)).to(x.scalar_type());
  return stack_->FProp(stack_.Theta(theta), x, paddings);
}

at::Tensor TransformerLmTask::Logits(const NestedMap& theta, const at::Tensor& ids,
                                     const at::Tensor& paddings) const {
  return softmax_->Logits(softmax_.Theta(theta), Hidden(theta, ids, paddings));
}

at::Tensor TransformerLmTask::LabelLogProbs(const NestedMap& theta, const at::Tensor& ids,
                                            const at::Tensor& labels,
                                            const at::Tensor& paddings) const {
  const at::Tensor x = Hidden(theta, ids, paddings);
  const NestedMap out = softmax_->FProp(softmax_.Theta(theta), x, labels, {}, paddings);
  if (out.contains("per_example_label_log_prob")) {
    return out.GetTensor("per_example_label_log_prob").to(at::kFloat);
  }
  // A softmax whose classes are split over a model axis gives no label log-probs: from logits.
  return at::log_softmax(softmax_->Logits(softmax_.Theta(theta), x).to(at::kFloat), -1)
      .gather(-1, labels.unsqueeze(-1))
      .squeeze(-1);
}

NestedMap TransformerLmTask::ComputePredictions(const NestedMap& theta,
                                                const NestedMap& batch) const {
  const at::Tensor& ids = batch.GetTensor("ids");
  // A later pipeline stage (Lingvo's placement): the stack reads stage 0's embeddings, not these.
  at::Tensor x = ends_.axis != nullptr && !ends_.first()
                     ? at::zeros({ids.size(0), ids.size(1), stack_->model_dim()})
                     : emb_->FProp(emb_.Theta(theta), ids);
  // Packed rows (the input's packed_input): positions restart with each segment, and attention
  // stays within it.
  const at::Tensor segment_ids = OptionalInput(batch, "segment_ids");
  const at::Tensor segment_pos = OptionalInput(batch, "segment_pos");
  if (segment_ids.defined() != segment_pos.defined()) {
    throw InvalidArgumentError(StrCat("task '", path(), "': a packed batch needs both ",
                                      "segment_ids and segment_pos"));
  }
  if (segment_pos.defined()) {
    if (segment_pos.sizes() != ids.sizes()) {
      throw InvalidArgumentError(StrCat("task '", path(), "': segment_pos must be shaped like ",
                                        "ids ", ids.sizes(), ", got ", segment_pos.sizes()));
    }
    x = x + position_emb_->FPropWithPosition(position_emb_.Theta(theta), segment_pos)
                .to(x.scalar_type());
  } else {
    x = x + position_emb_->FProp(position_emb_.Theta(theta), ids.size(1)).to(x.scalar_type());
  }
  AuxLossContext aux;
  x = stack_->FProp(stack_.Theta(theta), x, batch.GetTensor("paddings"), {}, {}, segment_ids);
  NestedMap out{{"encoded", x}};
  if (!aux.losses().empty()) out.Set("aux_loss", aux.Sum());
  return out;
}

namespace {
// The metrics the last pipeline stage hands the others, in order.
std::vector<std::string> LmMetricNames(bool aux) {
  std::vector<std::string> names = {"loss", "log_pplx", "fraction_of_correct_next_step_preds",
                                    "num_predictions", "num_samples_in_batch"};
  if (aux) names.push_back("aux_loss");
  return names;
}
}  // namespace

BaseTask::LossOutput TransformerLmTask::ComputeLoss(const NestedMap& theta,
                                                    const NestedMap& predictions,
                                                    const NestedMap& batch) const {
  if (ends_.axis != nullptr && !ends_.last()) return LossFromLastStage(predictions);
  LossOutput out = ComputeLossHere(theta, predictions, batch);
  if (ends_.axis != nullptr) {
    ShareMetricsFromLastStage(ends_, out.metrics, LmMetricNames(predictions.Has("aux_loss")));
  }
  return out;
}

BaseTask::LossOutput TransformerLmTask::LossFromLastStage(const NestedMap& predictions) const {
  const at::Tensor encoded = predictions.GetTensor("encoded");
  LossOutput out;
  out.metrics = MetricsFromLastStage(ends_, LmMetricNames(predictions.Has("aux_loss")),
                                     encoded.scalar_type());
  // The loss's value is the last stage's; its gradient reaches this stage's layers through the
  // pipeline's backward (which reads the output gradient on the last stage only) and the aux
  // loss's re-injection, so both stay in the graph at no value.
  at::Tensor& loss = out.metrics["loss"].value;
  loss = loss + (encoded * 0).sum().to(loss.scalar_type());
  if (predictions.Has("aux_loss")) {
    const at::Tensor a = predictions.GetTensor("aux_loss");
    loss = loss + aux_loss_weight_ * (a - a.detach()).to(loss.scalar_type());
  }
  return out;
}

BaseTask::LossOutput TransformerLmTask::ComputeLossHere(const NestedMap& theta,
                                                        const NestedMap& predictions,
                                                        const NestedMap& batch) const {
  const at::Tensor& labels = batch.GetTensor("labels");
  at::Tensor weights =
      batch.Has("weights") ? batch.GetTensor("weights") : at::ones(labels.sizes(), at::kFloat);
  weights = weights * (1 - batch.GetTensor("paddings").to(at::kFloat));
  NestedMap xent = softmax_->FProp(softmax_.Theta(theta), predictions.GetTensor("encoded"),
                                   labels, weights);
  const at::Tensor num_tokens = xent.GetTensor("total_weight").detach();
  // A prediction is correct when the label's log-prob is the maximum (exact ties, which have
  // probability zero, count as correct): a max over the classes instead of an argmax.
  const at::Tensor label_lp = xent.GetTensor("per_example_label_log_prob");
  const at::Tensor correct =
      ((label_lp >= xent.GetTensor("per_example_max_log_prob")).to(at::kFloat) * weights).sum() /
      at::clamp_min(num_tokens, 1);
  LossOutput out;
  at::Tensor loss = xent.GetTensor("avg_xent");
  if (predictions.Has("aux_loss")) {
    const at::Tensor aux = predictions.GetTensor("aux_loss");
    loss = loss + aux_loss_weight_ * aux.to(loss.scalar_type());
    out.metrics["aux_loss"] = Metric{aux.detach(), at::full({}, 1.0)};
  }
  out.metrics["loss"] = Metric{loss, num_tokens};
  // With label smoothing the loss is not the log-perplexity; recompute it from the log-probs.
  at::Tensor log_pplx = xent.GetTensor("avg_xent");
  if (label_smoothing_ > 0) {
    log_pplx = -(label_lp * weights).sum() / at::clamp_min(num_tokens, 1);
  }
  out.metrics["log_pplx"] = Metric{log_pplx.detach(), num_tokens};
  out.metrics["fraction_of_correct_next_step_preds"] = Metric{correct.detach(), num_tokens};
  out.metrics["num_predictions"] = Metric{num_tokens, at::full({}, 1.0)};
  // Packed rows: every segment is a sample (a row's count is its largest segment id).
  const at::Tensor segment_ids = OptionalInput(batch, "segment_ids");
  out.metrics["num_samples_in_batch"] = Metric{
      segment_ids.defined() ? std::get<0>(segment_ids.max(1)).sum().to(at::kDouble)
                            : at::full({}, static_cast<double>(labels.size(0))),
      at::full({}, 1.0)};
  return out;
}

glossa::Params& TransformerLmTask::SetTrainingRecipe(glossa::Params& p, int64_t max_steps,
                                                     double lr, int64_t warmup_steps,
                                                     double final_lr_fraction, int64_t keep) {
  // Residual dropout 0.1; none on the attention weights or the hidden activations.
  glossa::Params& layer = p.GetParams("stack.transformer_layer_params_tpl");
  layer.Set("tr_atten_tpl.residual_dropout_prob", 0.1);
  layer.Set("tr_fflayer_tpl.residual_dropout_prob", 0.1);
  glossa::Params& tp = p.GetParams("train");
  tp.Set("max_steps", max_steps).Set("steps_per_loop", 50).Set("summary_interval_steps", 50);
  tp.Set("save_interval_seconds", 120).Set("save_max_to_keep", keep);
  glossa::Params& lp = tp.GetParams("learner");
  lp.Set("learning_rate", lr).Set("clip_gradient_norm_to_value", 1.0);
  lp.Set("lr_schedule", LinearRampupCosineSchedule::Params()
                            .Set("warmup_steps", warmup_steps)
                            .Set("total_steps", max_steps)
                            .Set("final_value", final_lr_fraction));
  lp.Set("optimizer", Adam::Params().Set("beta1", 0.9).Set("beta2", 0.98).Set("epsilon", 1e-9));
  p.GetParams("eval").Set("samples_per_summary", 0);
  return p;
}

NestedMap TransformerLmTask::InitDecodeStates(int64_t n) const {
  return stack_->InitStates(n, at::kFloat);
}

std::pair<at::Tensor, NestedMap> TransformerLmTask::ExtendStep(const NestedMap& theta,
                                                               const at::Tensor& ids,
                                                               int64_t step,
                                                               const NestedMap& states) const {
  if (step < 0) throw InvalidArgumentError(StrCat("task '", path(), "': step ", step, " < 0"));
  // The position table up to this step: [step + 1, D], of which the last row is this step's (the
  // same sinusoid Logits adds over the whole sequence).
  const at::Tensor position =
      position_emb_->FProp(position_emb_.Theta(theta), step + 1).select(0, step);
  at::Tensor x = emb_->FProp(emb_.Theta(theta), ids.to(at::kLong).unsqueeze(1)).squeeze(1);
  x = x + position.to(x.scalar_type());
  const StepLayer& dec = *stack_;  // incremental decoding through StepLayer
  auto [y, new_states] = dec.ExtendStep(stack_.Theta(theta), x, states, {});
  at::Tensor logits = softmax_->Logits(softmax_.Theta(theta), y).to(at::kFloat);
  return {at::log_softmax(logits, -1), std::move(new_states)};
}


std::vector<std::vector<int64_t>> TransformerLmTask::SampleTogether(
    const NestedMap& theta, const std::vector<std::vector<int64_t>>& prompts,
    int64_t max_new_tokens, double temperature, int64_t top_k, uint64_t seed) const {
  at::NoGradGuard no_grad;
  EvalModeScope eval;
  const int64_t b = static_cast<int64_t>(prompts.size());
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(b));
  if (b == 0 || max_new_tokens <= 0) return out;
  int64_t longest = 0;
  for (const auto& p : prompts) {
    if (p.empty()) throw InvalidArgumentError(StrCat("task '", path(), "': an empty prompt (no <s>)"));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  }
  const int64_t eos = 2;
  std::vector<at::Generator> gens;
  for (int64_t i = 0; i < b; ++i) gens.push_back(at::make_generator<at::CPUGeneratorImpl>(seed));
  const at::Tensor positions =
      position_emb_->FProp(position_emb_.Theta(theta), longest + max_new_tokens);
  const NestedMap& emb_theta = emb_.Theta(theta);
  const NestedMap& stack_theta = stack_.Theta(theta);
  const NestedMap& softmax_theta = softmax_.Theta(theta);
  NestedMap states = stack_->InitStates(b, at::kFloat);
  std::vector<int64_t> token(static_cast<size_t>(b));
  std::vector<bool> done(static_cast<size_t>(b), false);
  for (int64_t i = 0; i < b; ++i) token[i] = prompts[i][0];
  // Step t feeds every row its token at position t: a prompt token while the row's prompt lasts,
  // then its last draw. Row i draws from step len_i - 1 on, with its own generator: what it would
  // draw alone.
  for (int64_t t = 0; t < longest + max_new_tokens - 1; ++t) {
    const at::Tensor x =
        emb_->FProp(emb_theta, at::tensor(token, at::kLong).unsqueeze(1)).squeeze(1) + positions[t];
    const StepLayer& dec = *stack_;
    auto [y, new_states] = dec.ExtendStep(stack_theta, x, states, {});
    states = std::move(new_states);
    std::vector<int64_t> drawing;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t len = static_cast<int64_t>(prompts[i].size());
      if (t + 1 < len) {
        token[i] = prompts[i][t + 1];
      } else if (!done[i]) {
        drawing.push_back(i);
      }
    }
    if (drawing.empty()) {
      bool all_done = true;
      for (int64_t i = 0; i < b; ++i) all_done = all_done && done[i];
      if (all_done) break;
      continue;
    }
    const at::Tensor rows = at::tensor(drawing, at::kLong);
    const at::Tensor logits = softmax_->Logits(softmax_theta, y.index_select(0, rows)).to(at::kFloat);
    for (size_t r = 0; r < drawing.size(); ++r) {
      const int64_t i = drawing[r];
      const int64_t next =
          PickTokens(logits.narrow(0, static_cast<int64_t>(r), 1), temperature, top_k, gens[i])[0]
              .item<int64_t>();
      out[i].push_back(next);
      token[i] = next;
      done[i] = next == eos || static_cast<int64_t>(out[i].size()) >= max_new_tokens;
    }
  }
  return out;
}

at::Tensor TransformerLmTask::Sample(const NestedMap& theta, const at::Tensor& prompts,
                                     int64_t max_new_tokens, double temperature, int64_t top_k,
                                     uint64_t seed) const {
  at::NoGradGuard no_grad;
  EvalModeScope eval;
  const int64_t b = prompts.size(0), p_len = prompts.size(1);
  const int64_t eos = 2;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor positions =
      position_emb_->FProp(position_emb_.Theta(theta), p_len + max_new_tokens);
  const NestedMap& emb_theta = emb_.Theta(theta);
  const NestedMap& stack_theta = stack_.Theta(theta);
  const NestedMap& softmax_theta = softmax_.Theta(theta);
  NestedMap states = stack_->InitStates(b, at::kFloat);
  std::vector<at::Tensor> out = {prompts};
  at::Tensor done = at::zeros({b}, at::kBool);
  at::Tensor token = prompts.select(1, 0);
  for (int64_t t = 0; t < p_len + max_new_tokens - 1; ++t) {
    at::Tensor x = emb_->FProp(emb_theta, token.unsqueeze(1)).squeeze(1) + positions[t];
    const StepLayer& dec = *stack_;
    auto [y, new_states] = dec.ExtendStep(stack_theta, x, states, {});
    states = std::move(new_states);
    if (t + 1 < p_len) {
      token = prompts.select(1, t + 1);
      continue;
    }
    at::Tensor next =
        PickTokens(softmax_->Logits(softmax_theta, y).to(at::kFloat), temperature, top_k, gen);
    next = next.masked_fill(done, eos);
    done = done | (next == eos);
    out.push_back(next.unsqueeze(1));
    token = next;
    if (done.all().item<bool>()) break;
  }
  return at::cat(out, 1);
}

std::map<std::string, InferenceSubgraphSpec> TransformerLmTask::Inference() const {
  std::map<std::string, InferenceSubgraphSpec> out;
  InferenceSubgraphSpec& score = out["default"];
  score.doc = "Scores text: the log-probability of each token and of </s>.";
  score.feeds["text"] = {"string", 1, false, "Sentences to score."};
  score.fetches["log_probs"] = {"float32", 2, false, "[B, T] per token and </s>; 0 past the end."};
  score.fetches["total_log_prob"] = {"float32", 1, false, "[B] the sentence's log-probability."};
  score.fetches["ids"] = {"int64", 2, false, "[B, T] the token ids and </s>."};
  score.fetches["lengths"] = {"int64", 1, false, "[B] tokens + 1 (</s>)."};
  score.fetches["pieces"] = {"string", 1, false,
                             "[B] the vocabulary pieces of ids, separated by spaces."};
  InferenceSubgraphSpec& gen = out["generate"];
  gen.doc = "Samples a continuation of each prompt.";
  gen.feeds["prompt"] = {"string", 1, false, "Prompts to continue."};
  gen.feeds["max_new_tokens"] = {"int64", 0, true, "Default: decode_max_new_tokens."};
  gen.feeds["max_new_tokens"].min = 0;
  gen.feeds["temperature"] = {"float32", 0, true, "0: greedy. Default: decode_temperature."};
  gen.feeds["temperature"].min = 0;
  gen.feeds["temperature"].max = 100;
  gen.feeds["top_k"] = {"int64", 0, true, "0: all. Default: decode_top_k."};
  gen.feeds["top_k"].min = 0;
  gen.feeds["seed"] = {"int64", 0, true, "Sampling seed (default 0): same seed, same text."};
  gen.feeds["seed"].min = 0;
  gen.fetches["text"] = {"string", 1, false, "[B] the continuations."};
  gen.fetches["ids"] = {"int64", 2, false, "[B, T] their ids, </s>-padded."};
  gen.fetches["lengths"] = {"int64", 1, false, "[B] the continuations' ids before </s>."};
  return out;
}

namespace {

// Each row i of `labels` as its first lengths[i] ids' pieces, joined by spaces.
std::vector<std::string> LabelPieces(const BaseTokenizer& tokenizer, const at::Tensor& labels,
                                     const at::Tensor& lengths) {
  std::vector<std::string> pieces;
  const at::Tensor labels_c = labels.contiguous(), lengths_c = lengths.contiguous();
  const auto l = labels_c.accessor<int64_t, 2>();
  const auto n = lengths_c.accessor<int64_t, 1>();
  for (int64_t i = 0; i < labels.size(0); ++i) {
    std::string row;
    for (int64_t t = 0; t < n[i]; ++t) {
      if (t > 0) row += ' ';
      row += tokenizer.IdToPiece(l[i][t]);
    }
    pieces.push_back(std::move(row));
  }
  return pieces;
}

}  // namespace

InferenceMap TransformerLmTask::RunInference(const NestedMap& theta, const std::string& subgraph,
                                             const InferenceMap& feeds,
                                             const BaseTokenizer* tokenizer) const {
  if (tokenizer == nullptr) {
    throw FailedPreconditionError(StrCat("task '", path(), "': inference needs a tokenizer"));
  }
  at::NoGradGuard no_grad;
  EvalModeScope eval;
  InferenceMap out;
  if (subgraph == "default") {
    const auto& text = feeds.at("text").strings;
    // No string is longer in tokens than in bytes: a bound for StringsToIds without tokenizing
    // twice (padded to the longest sequence, not to the bound).
    int64_t longest = 0;
    for (const auto& t : text) longest = std::max<int64_t>(longest, static_cast<int64_t>(t.size()));
    const NestedMap b = tokenizer->StringsToIds(text, longest + 1, /*pad_to_longest=*/true);
    const at::Tensor ids = b.GetTensor("ids"), labels = b.GetTensor("labels");
    const at::Tensor paddings = b.GetTensor("paddings").to(at::kFloat);
    const at::Tensor log_probs = LabelLogProbs(theta, ids, labels, paddings) * (1 - paddings);
    out["log_probs"] = InferenceValue::Of(log_probs);
    // The sum in position order, one add at a time (cumsum), so a row's total does not depend on
    // how far the batch pads it (a vectorized sum's order does).
    out["total_log_prob"] = InferenceValue::Of(
        log_probs.size(1) > 0 ? log_probs.cumsum(1).select(1, -1).contiguous()
                              : at::zeros({log_probs.size(0)}, log_probs.options()));
    out["ids"] = InferenceValue::Of(labels);
    const at::Tensor lengths = (1 - paddings).sum(1).to(at::kLong);
    out["lengths"] = InferenceValue::Of(lengths);
    out["pieces"] = InferenceValue::Strings(LabelPieces(*tokenizer, labels, lengths));
    return out;
  }
  if (subgraph == "generate") {
    const GenerateOptions o = ReadGenerateOptions(
        feeds, {decode_max_new_tokens_, decode_temperature_, decode_top_k_, 0});
    // Every prompt of the batch decodes together (one step of the stack for all of them).
    return GenerateFetches(*tokenizer, SampleTogether(theta, PromptIds(*tokenizer, feeds.at("prompt").strings),
                                                      o.max_new_tokens, o.temperature, o.top_k, o.seed));
  }
  return BaseTask::RunInference(theta, subgraph, feeds, tokenizer);
}

std::unique_ptr<GenerationBatch> TransformerLmTask::StartGeneration(
    const std::string& subgraph, const BaseTokenizer* tokenizer) const {
  if (subgraph != "generate") return nullptr;
  if (tokenizer == nullptr) {
    throw FailedPreconditionError(StrCat("task '", path(), "': inference needs a tokenizer"));
  }
  return MakeLmGeneration(*this, *tokenizer);
}

NestedMap TransformerLmTask::Decode(const NestedMap& batch) {
  if (batch.Has("segment_ids")) {
    throw InvalidArgumentError(StrCat("task '", path(), "': cannot decode packed rows (the batch ",
                                      "has segment_ids); decode from an input with packed_input ",
                                      "False"));
  }
  const at::Tensor& ids = batch.GetTensor("ids");
  const at::Tensor lengths = (1 - batch.GetTensor("paddings").to(at::kFloat)).sum(1).to(at::kLong);
  const int64_t p_len = std::min<int64_t>(decode_prompt_length_, ids.size(1));
  const uint64_t seed = static_cast<uint64_t>(GenerateSeedFromName(path())) ^
                        static_cast<uint64_t>(GetGlobalStep()) ^
                        static_cast<uint64_t>(GetIncStepSeed());
  at::Tensor prompts = ids.slice(1, 0, p_len);
  at::Tensor samples =
      Sample(theta(), prompts, decode_max_new_tokens_, decode_temperature_, decode_top_k_, seed);
  NestedMap out;
  out.Put("prompt_ids", prompts);
  out.Put("prompt_lengths", at::clamp_max(lengths, p_len));
  out.Put("sample_ids", samples.slice(1, p_len));
  return out;
}

std::map<std::string, double> TransformerLmTask::CreateDecoderMetrics() const {
  return {{"num_samples_in_batch", 0.0}, {"mean_sample_length", 0.0}};
}

std::vector<std::string> TransformerLmTask::PostProcessDecodeOut(
    const NestedMap& decode_out, std::map<std::string, double>& metrics) {
  if (!has_input())
    throw FailedPreconditionError(
        StrCat("task '", path(), "': decoding needs an input with a tokenizer"));
  const auto* seq_input = dynamic_cast<const BaseSequenceInputGenerator*>(&input());
  if (seq_input == nullptr) {
    throw FailedPreconditionError(
        StrCat("task '", path(), "': decoding needs a sequence input (with a tokenizer)"));
  }
  const at::Tensor prompts = decode_out.GetTensor("prompt_ids").slice(1, 1);  // drop <s>
  const at::Tensor prompt_lens = at::clamp_min(decode_out.GetTensor("prompt_lengths") - 1, 0);
  const at::Tensor samples = decode_out.GetTensor("sample_ids");
  const at::Tensor sample_lens = (samples != 2).to(at::kLong).cumprod(1).sum(1);
  std::vector<std::string> p = seq_input->IdsToStrings(prompts, prompt_lens);
  std::vector<std::string> s = seq_input->IdsToStrings(samples, sample_lens);
  std::vector<std::string> lines;
  for (size_t i = 0; i < p.size(); ++i) lines.push_back(StrCat(p[i], " ||| ", s[i]));
  const double n_before = metrics["num_samples_in_batch"];
  metrics["num_samples_in_batch"] = n_before + static_cast<double>(p.size());
  metrics["mean_sample_length"] += sample_lens.sum().item<double>();
  return lines;
}

void TransformerLmTask::DecodeFinalize(std::map<std::string, double>& metrics) {
  if (metrics["num_samples_in_batch"] > 0)
    metrics["mean_sample_length"] /= metrics["num_samples_in_batch"];
}

GLOSSA_REGISTER_CLASS(TransformerLmTask, "glossa.models.TransformerLmTask");

}  // namespace glossa
