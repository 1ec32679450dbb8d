#include "glossa/models/transformer_lm.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/moe.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"

namespace glossa {

glossa::Params TransformerLmTask::Params() {
  glossa::Params p = BaseTask::Params();
  p.Set("cls", ClsOf<TransformerLmTask>());
  p.Define("vocab_size", 0, "Vocabulary size (the tokenizer's).");
  p.Define("model_dim", 0, "Model dimension.");
  p.Define("num_layers", 1, "Number of transformer layers.");
  p.Define("num_heads", 1, "Number of attention heads.");
  p.Define("hidden_dim", 0, "Hidden dimension of the feed-forward blocks.");
  p.Define("residual_dropout_prob", 0.0, "Dropout on the residual branches.");
  p.Define("atten_dropout_prob", 0.0, "Dropout on the attention weights.");
  p.Define("relu_dropout_prob", 0.0, "Dropout inside the feed-forward blocks.");
  p.Define("input_dropout_prob", 0.0, "Dropout on the embedded inputs.");
  p.Define("label_smoothing", 0.0, "Label smoothing of the training loss.");
  p.Define("moe_tpl", nullptr,
           "TransformerShardedMoeLayer params: Mixture-of-Experts feed-forward blocks in every "
           "moe_layers_every-th layer (None: dense).");
  p.Define("moe_layers_every", 2, "With moe_tpl: layers i with (i + 1) % this == 0 are MoE.");
  p.Define("aux_loss_weight", 0.01,
           "Weight of the MoE load-balancing losses (summed over layers) in the training loss.");
  p.Define("decode_prompt_length", 8,
           "Decode: prompt tokens (including <s>) taken from each example.");
  p.Define("decode_max_new_tokens", 24, "Decode: tokens to sample after the prompt.");
  p.Define("decode_temperature", 0.8, "Decode: softmax temperature (0: greedy).");
  p.Define("decode_top_k", 40, "Decode: sample among the k most likely tokens (0: all).");
  return p;
}

TransformerLmTask::TransformerLmTask(const glossa::Params& p) : BaseTask(p) {
  const int64_t vocab = p.GetInt("vocab_size"), dim = p.GetInt("model_dim");
  if (vocab <= 0 || dim <= 0) {
    throw InvalidArgumentError(StrCat("task '", path(),
                                      "': vocab_size and model_dim must be positive, got ", vocab,
                                      " and ", dim));
  }
  CreateChild("emb",
              EmbeddingLayer::Params()
                  .Set("vocab_size", vocab)
                  .Set("embedding_dim", dim)
                  .Set("scale_sqrt_depth", true)
                  .Set("params_init",
                       WeightInit::Gaussian(1.0 / std::sqrt(static_cast<double>(dim))).ToParams()));
  CreateChild("pos", PositionalEmbeddingLayer::Params().Set("embedding_dim", dim));
  CreateChild("stack", TransformerStack::Params()
                           .Set("num_layers", p.GetInt("num_layers"))
                           .Set("model_dim", dim)
                           .Set("num_heads", p.GetInt("num_heads"))
                           .Set("hidden_dim", p.GetInt("hidden_dim"))
                           .Set("mask_self_atten", true)
                           .Set("residual_dropout_prob", p.GetFloat("residual_dropout_prob"))
                           .Set("atten_dropout_prob", p.GetFloat("atten_dropout_prob"))
                           .Set("relu_dropout_prob", p.GetFloat("relu_dropout_prob"))
                           .Set("input_dropout_prob", p.GetFloat("input_dropout_prob"))
                           .Set("moe_tpl", p.Get("moe_tpl"))
                           .Set("moe_layers_every", p.GetInt("moe_layers_every")));
  CreateChild("softmax", SimpleFullSoftmax::Params()
                             .Set("input_dim", dim)
                             .Set("num_classes", vocab)
                             .Set("label_smoothing", p.GetFloat("label_smoothing"))
                             .Set("compute_per_example_argmax", false));
}

at::Tensor TransformerLmTask::Logits(const NestedMap& theta, const at::Tensor& ids,
                                     const at::Tensor& paddings) const {
  const auto& emb = GetChildAs<EmbeddingLayer>("emb");
  at::Tensor x = emb.FProp(theta.at("emb").AsMap(), ids);
  x = x + GetChildAs<PositionalEmbeddingLayer>("pos")
              .FProp(theta.at("pos").AsMap(), ids.size(1))
              .to(x.scalar_type());
  x = GetChildAs<TransformerStack>("stack").FProp(theta.at("stack").AsMap(), x, paddings);
  return GetChildAs<SimpleFullSoftmax>("softmax").Logits(theta.at("softmax").AsMap(), x);
}

NestedMap TransformerLmTask::ComputePredictions(const NestedMap& theta,
                                                const NestedMap& batch) const {
  const auto& emb = GetChildAs<EmbeddingLayer>("emb");
  const at::Tensor& ids = batch.GetTensor("ids");
  at::Tensor x = emb.FProp(theta.at("emb").AsMap(), ids);
  x = x + GetChildAs<PositionalEmbeddingLayer>("pos")
              .FProp(theta.at("pos").AsMap(), ids.size(1))
              .to(x.scalar_type());
  AuxLossContext aux;
  x = GetChildAs<TransformerStack>("stack").FProp(theta.at("stack").AsMap(), x,
                                                  batch.GetTensor("paddings"));
  NestedMap out{{"encoded", x}};
  if (!aux.losses().empty()) out.Set("aux_loss", aux.Sum());
  return out;
}

BaseTask::LossOutput TransformerLmTask::ComputeLoss(const NestedMap& theta,
                                                    const NestedMap& predictions,
                                                    const NestedMap& batch) const {
  const at::Tensor& labels = batch.GetTensor("labels");
  at::Tensor weights =
      batch.Has("weights") ? batch.GetTensor("weights") : at::ones(labels.sizes(), at::kFloat);
  weights = weights * (1 - batch.GetTensor("paddings").to(at::kFloat));
  NestedMap xent = GetChildAs<SimpleFullSoftmax>("softmax").FProp(
      theta.at("softmax").AsMap(), predictions.GetTensor("encoded"), labels, weights);
  const at::Tensor num_tokens = xent.GetTensor("total_weight").detach();
  // A prediction is correct when the label's log-prob is the maximum (exact ties, which have
  // probability zero, count as correct): a max over the classes instead of an argmax.
  const at::Tensor label_lp = xent.GetTensor("log_probs")
                                  .detach()
                                  .gather(-1, labels.to(at::kLong).unsqueeze(-1))
                                  .squeeze(-1);
  const at::Tensor correct =
      ((label_lp >= xent.GetTensor("per_example_max_log_prob")).to(at::kFloat) * weights).sum() /
      at::clamp_min(num_tokens, 1);
  LossOutput out;
  at::Tensor loss = xent.GetTensor("avg_xent");
  if (predictions.Has("aux_loss")) {
    const at::Tensor aux = predictions.GetTensor("aux_loss");
    loss = loss + params().GetFloat("aux_loss_weight") * aux.to(loss.scalar_type());
    out.metrics["aux_loss"] = Metric{aux.detach(), at::full({}, 1.0)};
  }
  out.metrics["loss"] = Metric{loss, num_tokens};
  // With label smoothing the loss is not the log-perplexity; recompute it from the log-probs.
  at::Tensor log_pplx = xent.GetTensor("avg_xent");
  if (params().GetFloat("label_smoothing") > 0) {
    at::Tensor lp = xent.GetTensor("log_probs").gather(-1, labels.unsqueeze(-1)).squeeze(-1);
    log_pplx = -(lp * weights).sum() / at::clamp_min(num_tokens, 1);
  }
  out.metrics["log_pplx"] = Metric{log_pplx.detach(), num_tokens};
  out.metrics["fraction_of_correct_next_step_preds"] = Metric{correct.detach(), num_tokens};
  out.metrics["num_predictions"] = Metric{num_tokens, at::full({}, 1.0)};
  out.metrics["num_samples_in_batch"] =
      Metric{at::full({}, static_cast<double>(labels.size(0))), at::full({}, 1.0)};
  return out;
}

at::Tensor TransformerLmTask::Sample(const NestedMap& theta, const at::Tensor& prompts,
                                     int64_t max_new_tokens, double temperature, int64_t top_k,
                                     uint64_t seed) const {
  at::NoGradGuard no_grad;
  EvalModeScope eval;
  const auto& emb = GetChildAs<EmbeddingLayer>("emb");
  const auto& pos = GetChildAs<PositionalEmbeddingLayer>("pos");
  const auto& stack = GetChildAs<TransformerStack>("stack");
  const auto& softmax = GetChildAs<SimpleFullSoftmax>("softmax");
  const int64_t b = prompts.size(0), p_len = prompts.size(1);
  const int64_t eos = 2;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor positions = pos.FProp(theta.at("pos").AsMap(), p_len + max_new_tokens);
  NestedMap states = stack.InitStates(b, at::kFloat);
  std::vector<at::Tensor> out = {prompts};
  at::Tensor done = at::zeros({b}, at::kBool);
  at::Tensor token = prompts.select(1, 0);
  for (int64_t t = 0; t < p_len + max_new_tokens - 1; ++t) {
    at::Tensor x = emb.FProp(theta.at("emb").AsMap(), token.unsqueeze(1)).squeeze(1) + positions[t];
    auto [y, new_states] = stack.ExtendStep(theta.at("stack").AsMap(), x, states);
    states = std::move(new_states);
    if (t + 1 < p_len) {
      token = prompts.select(1, t + 1);
      continue;
    }
    at::Tensor logits = softmax.Logits(theta.at("softmax").AsMap(), y).to(at::kFloat);
    at::Tensor next;
    if (temperature <= 0) {
      next = logits.argmax(-1);
    } else {
      logits = logits / temperature;
      if (top_k > 0 && top_k < logits.size(-1)) {
        at::Tensor kth = std::get<0>(logits.topk(top_k, -1)).select(-1, top_k - 1).unsqueeze(-1);
        logits = logits.masked_fill(logits < kth, -INFINITY);
      }
      next = at::multinomial(at::softmax(logits, -1), 1, /*replacement=*/false, gen).squeeze(1);
    }
    next = next.masked_fill(done, eos);
    done = done | (next == eos);
    out.push_back(next.unsqueeze(1));
    token = next;
    if (done.all().item<bool>()) break;
  }
  return at::cat(out, 1);
}

NestedMap TransformerLmTask::Decode(const NestedMap& batch) {
  const at::Tensor& ids = batch.GetTensor("ids");
  const at::Tensor lengths = (1 - batch.GetTensor("paddings").to(at::kFloat)).sum(1).to(at::kLong);
  const int64_t p_len = std::min<int64_t>(params().GetInt("decode_prompt_length"), ids.size(1));
  const uint64_t seed = static_cast<uint64_t>(GenerateSeedFromName(path())) ^
                        static_cast<uint64_t>(GetGlobalStep()) ^
                        static_cast<uint64_t>(GetIncStepSeed());
  at::Tensor prompts = ids.slice(1, 0, p_len);
  at::Tensor samples =
      Sample(theta(), prompts, params().GetInt("decode_max_new_tokens"),
             params().GetFloat("decode_temperature"), params().GetInt("decode_top_k"), seed);
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

UnigramBaseline::UnigramBaseline(int64_t vocab_size)
    : counts(static_cast<size_t>(vocab_size), 1.0), total(static_cast<double>(vocab_size)) {}

void UnigramBaseline::Count(const NestedMap& batch) {
  const at::Tensor labels = batch.GetTensor("labels").to(at::kLong).contiguous();
  const at::Tensor keep = (batch.GetTensor("paddings") < 0.5).contiguous();
  const int64_t* l = labels.data_ptr<int64_t>();
  const bool* k = keep.data_ptr<bool>();
  for (int64_t i = 0; i < labels.numel(); ++i) {
    if (!k[i]) continue;
    if (l[i] < 0 || l[i] >= static_cast<int64_t>(counts.size())) {
      throw InvalidArgumentError(
          StrCat("unigram baseline: label ", l[i], " outside the vocabulary of ", counts.size()));
    }
    counts[static_cast<size_t>(l[i])] += 1;
    total += 1;
  }
}

std::pair<double, double> UnigramBaseline::Score(const NestedMap& batch) const {
  const at::Tensor labels = batch.GetTensor("labels").to(at::kLong).contiguous();
  const at::Tensor keep = (batch.GetTensor("paddings") < 0.5).contiguous();
  const int64_t* l = labels.data_ptr<int64_t>();
  const bool* k = keep.data_ptr<bool>();
  double nll = 0, n = 0;
  for (int64_t i = 0; i < labels.numel(); ++i) {
    if (!k[i]) continue;
    nll -= std::log(counts.at(static_cast<size_t>(l[i])) / total);
    n += 1;
  }
  return {nll, n};
}

GLOSSA_REGISTER_CLASS(TransformerLmTask, "glossa.models.TransformerLmTask");

std::string TransformerLmTask::Report(const ReportInputs& in) {
  for (const char* metric : {"log_pplx", "fraction_of_correct_next_step_preds"}) {
    if (!in.eval_metrics.count(metric))
      throw InvalidArgumentError(StrCat("report: the eval metrics lack ", metric));
  }
  if (!in.train_input) throw FailedPreconditionError("report: no Train input for the unigram");
  // The unigram baseline: token counts over one pass of Train, scored on the same split.
  std::unique_ptr<BaseInputGenerator> train_input = in.train_input();
  UnigramBaseline unigram(params().GetInt("vocab_size"));
  int64_t batches = 0;
  std::fprintf(stderr, "counting unigrams over Train: ");
  while (true) {
    try {
      unigram.Count(train_input->GetPreprocessedInputBatch());
    } catch (const OutOfRangeError&) {
      break;
    }
    if (++batches % 50 == 0) std::fprintf(stderr, ".");
  }
  std::fprintf(stderr, " %lld tokens\n",
               static_cast<long long>(unigram.total - static_cast<double>(unigram.counts.size())));
  input().Reset();
  double nll = 0, n = 0;
  while (true) {
    try {
      auto [a, b] = unigram.Score(input().GetPreprocessedInputBatch());
      nll += a;
      n += b;
    } catch (const OutOfRangeError&) {
      break;
    }
  }
  const double model_pplx = in.eval_metrics.at("log_pplx").first;
  const double unigram_pplx = nll / std::max(n, 1.0);
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof(buf), "%s step %lld on %s (%.0f tokens):\n", in.model_key.c_str(),
                static_cast<long long>(in.global_step), in.dataset.c_str(), n);
  out += buf;
  std::snprintf(buf, sizeof(buf),
                "  model   log_pplx: %.4f  (fraction_of_correct_next_step_preds: %.4f)\n",
                model_pplx, in.eval_metrics.at("fraction_of_correct_next_step_preds").first);
  out += buf;
  std::snprintf(buf, sizeof(buf), "  unigram log_pplx: %.4f\n  ratio model/unigram: %.3f\n",
                unigram_pplx, model_pplx / unigram_pplx);
  out += buf;
  out += "sampled continuations (prompt ||| sample):\n";
  for (int64_t i = 0; i < in.num_samples && i < static_cast<int64_t>(in.decode_lines.size()); ++i) {
    out += StrCat("  ", in.decode_lines[static_cast<size_t>(i)], "\n");
  }
  return out;
}

}  // namespace glossa
