// The MT task (Lingvo's mt.model.TransformerModel): training, BLEU decoding, the translate subgraph.
#include "glossa/tasks/mt/mt.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <cmath>

#include "glossa/base/errors.h"
#include "glossa/tasks/mt/mt_common.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/input/tokenizers.h"
#include "glossa/input/vocabulary_check.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"
#include "glossa/layers/embedding.h"
#include "glossa/kernels/fused_xent.h"
#include "glossa/search/fusion.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/metrics/bleu.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/search/beam_search.h"
#include "glossa/search/ctc_prefix_score.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/search/lexicon.h"
#include "glossa/input/shortlist.h"

namespace glossa {
namespace mt {

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
  p.Define("shortlist_file", "",
           "A vocabulary shortlist (`glossa shortlist`, glossa/input/shortlist.h): decoding "
           "computes each batch's logits over its sources' candidate target pieces and the most "
           "frequent ones only. '': the whole vocabulary.");
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
  // A finished sentence stops and leaves the decoding batch (drop_finished_sources), as in
  // CTranslate2 and Marian: the batch's cost follows the sentences still running.
  p.Set("decoder.beam_search.terminate_beams_independently", true);
  return p;
}

glossa::Params& TransformerModel::SetTrainingRecipe(glossa::Params& p, int64_t max_steps,
                                                    int64_t warmup_steps) {
  p.Set("decoder.target_seq_len", 160);
  p.Set("decoder.beam_search.num_hyps_per_beam", 4);
  p.Set("decoder.beam_search.force_eos_in_last_step", true);
  glossa::Params& tp = p.GetParams("train");
  tp.Set("max_steps", max_steps).Set("steps_per_loop", 50).Set("summary_interval_steps", 50);
  tp.Set("save_interval_seconds", 120).Set("save_max_to_keep", 5);
  glossa::Params& lp = tp.GetParams("learner");
  lp.Set("learning_rate", 1.0);
  lp.Set("lr_schedule", TransformerSchedule::Params()
                            .Set("warmup_steps", warmup_steps)
                            .Set("model_dim", p.GetInt("encoder.model_dim")));
  lp.Set("optimizer", Adam::Params().Set("beta1", 0.9).Set("beta2", 0.98).Set("epsilon", 1e-9));
  lp.Set("clip_gradient_norm_to_value", 1.0);
  p.GetParams("eval").Set("samples_per_summary", 0);
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
  if (const std::string file = p.GetString("shortlist_file"); !file.empty()) {
    try {
      shortlist_ = std::make_shared<const VocabShortlist>(VocabShortlist::Load(file));
    } catch (const Error& e) {
      ThrowError(e.code(), StrCat("task '", path(), "': shortlist_file: ", e.message()));
    }
    const int64_t src_v = p.GetInt("encoder.token_emb.vocab_size");
    if (shortlist_->source_vocab() != src_v || shortlist_->target_vocab() != decoder_->vocab_size()) {
      throw InvalidArgumentError(StrCat(
          "task '", path(), "': shortlist_file '", file, "' is for vocabularies of ",
          shortlist_->source_vocab(), " and ", shortlist_->target_vocab(), " pieces; the model's are ",
          src_v, " and ", decoder_->vocab_size()));
    }
  }
  if (has_input()) {
    std::vector<std::pair<std::string, int64_t>> keys = {
        {"encoder.token_emb.vocab_size", p.GetInt("encoder.token_emb.vocab_size")},
        {"decoder.token_emb.vocab_size", p.GetInt("decoder.token_emb.vocab_size")}};
    // A softmax tied to the embedding has no classes of its own; an untied one's 0 means the
    // vocabulary.
    if (!p.GetBool("decoder.shared_emb") && p.GetInt("decoder.softmax.num_classes") != 0) {
      keys.emplace_back("decoder.softmax.num_classes", p.GetInt("decoder.softmax.num_classes"));
    }
    CheckVocabularyAgrees(input(), keys, StrCat("task '", path(), "'"));
  }
}

NestedMap TransformerModel::ComputePredictions(const NestedMap& theta,
                                               const NestedMap& batch) const {
  return encoder_->FProp(encoder_.Theta(theta), batch.GetItem("src").AsMap());
}

BaseTask::LossOutput TransformerModel::ComputeLoss(const NestedMap& theta,
                                                   const NestedMap& predictions,
                                                   const NestedMap& batch) const {
  LossOutput out = decoder_->ComputeLoss(decoder_.Theta(theta), predictions, batch.GetItem("tgt").AsMap());
  // Packed rows: every segment is a sample.
  const at::Tensor segment_ids = OptionalInput(batch.GetItem("tgt").AsMap(), "segment_ids");
  out.metrics["num_samples_in_batch"] = Metric{
      segment_ids.defined()
          ? std::get<0>(segment_ids.max(1)).sum().to(at::kDouble)
          : at::full({}, static_cast<double>(batch.GetTensor("tgt.ids").size(0))),
      at::full({}, 1.0)};
  return out;
}

namespace {

// The source's per-hypothesis rows (each layer's cross-attention keys and values, the source
// paddings: "per_source" in the search states, which a search dropping finished sources compacts
// with the caches, GatherStates) and the rest of it (positions, the softmax weight: the same for
// every row).
std::pair<NestedMap, NestedMap> SplitSource(NestedMap source) {
  NestedMap rows;
  for (const char* key : {"aux", "aux_paddings"}) {
    rows.Put(key, source.at(key));
    source.erase(key);
  }
  return {std::move(source), std::move(rows)};
}

// The decoder's step on the source rows of its states and the shared rest (with a shortlist's
// projection prepared under the model's plan: shortlist_plan).
DecodeStepFn StepReadingSourceRows(const TransformerDecoder& dec, const NestedMap& dec_theta,
                                   const NestedMap& shared,
                                   std::shared_ptr<const ComputePlan> shortlist_plan) {
  return [&dec, &dec_theta, shared, shortlist_plan](const at::Tensor& ids, int64_t step,
                                                    const NestedMap& states) {
    NestedMap source = shared, dec_states = states;
    const NestedMap& rows = states.GetItem("per_source").AsMap();
    for (const auto& [key, value] : rows) source.Put(key, value);
    dec_states.erase("per_source");
    auto [log_probs, next] =
        dec.ExtendStep(dec_theta, source, ids, step, dec_states, shortlist_plan.get());
    next.Put("per_source", rows);
    return std::make_pair(log_probs, std::move(next));
  };
}

}  // namespace

NestedMap SearchDecoder(const TransformerDecoder& dec, const NestedMap& dec_theta,
                        const NestedMap& enc, int64_t b, const std::string& decoding,
                        int64_t num_hyps, const CtcPrefixScorer* ctc, const LmFusion* lm,
                        const LexiconConstraint* lexicon, const at::Tensor& shortlist_ids) {
  if (lm && lm->lm == nullptr) lm = nullptr;
  if (lm && lm->lm->vocab_size() != dec.vocab_size()) {
    throw InvalidArgumentError(StrCat("shallow fusion: the language model's vocabulary (",
                                      lm->lm->vocab_size(), ") differs from the decoder's (",
                                      dec.vocab_size(), ")"));
  }
  // The decoder's step joined with the CTC prefix scores, the fused LM's log-probs and the
  // lexicon mask when there are any (glossa/search/fusion.h), their states riding along.
  std::vector<FusedScorer> scorers;
  if (ctc) scorers.push_back(CtcJoin(*ctc));
  if (lm) {
    scorers.push_back(LmShallowFusion(
        [lm](int64_t n) { return lm->lm->InitDecodeStates(n); },
        [lm](const at::Tensor& ids, int64_t step, const NestedMap& states) {
          return lm->lm->ExtendStep(*lm->theta, ids, step, states);
        },
        lm->weight));
  }
  if (lexicon) scorers.push_back(LexiconMask(*lexicon));
  auto make_step = [&](NestedMap shared) {
    std::shared_ptr<const ComputePlan> shortlist_plan;
    if (shortlist_ids.defined()) {
      const NestedMap shortlist = dec.ShortlistSource(dec_theta, shortlist_ids);
      for (const auto& [key, value] : shortlist) shared.Put(key, value);
      shortlist_plan = dec.PlanShortlist(shortlist);
    }
    return FuseScorers(StepReadingSourceRows(dec, dec_theta, shared, shortlist_plan), scorers);
  };
  auto init_states = [&](int64_t n, const NestedMap& rows) {
    NestedMap states = FuseInitStates(dec.InitDecodeStates(n), scorers, n);
    states.Put("per_source", rows);
    return states;
  };
  SearchResult r;
  if (decoding == "beam") {
    // Another width than the configured one (the translate subgraph's num_hyps): a helper of
    // the same Params with that width.
    std::unique_ptr<BeamSearchHelper> other;
    const BeamSearchHelper* beam = &dec.beam_search();
    // The CTC join reads its frames by hypothesis index (h % B): with it every source stays in
    // the batch to the end.
    const glossa::Params& params = dec.beam_search_params();
    const bool keep_sources = ctc != nullptr && params.GetBool("drop_finished_sources") &&
                              params.GetBool("terminate_beams_independently");
    if ((num_hyps > 0 && num_hyps != beam->num_hyps_per_beam()) || keep_sources) {
      glossa::Params bp = dec.beam_search_params().Copy();
      if (num_hyps <= 0) num_hyps = beam->num_hyps_per_beam();
      bp.Set("name", "beam_search").Set("num_hyps_per_beam", num_hyps);
      if (keep_sources) bp.Set("drop_finished_sources", false);
      if (bp.GetInt("num_hyps_to_return") > num_hyps) bp.Set("num_hyps_to_return", num_hyps);
      other = InstantiateLayer<BeamSearchHelper>(bp);
      beam = other.get();
    }
    const int64_t n = beam->num_hyps_per_beam() * b;
    auto [shared, rows] = SplitSource(dec.PrecomputeSource(dec_theta, enc, n));
    r = beam->Search(b, init_states(n, rows), make_step(shared));
  } else {
    auto [shared, rows] = SplitSource(dec.PrecomputeSource(dec_theta, enc, b));
    const double temperature = decoding == "greedy" ? 0.0 : dec.sampling_temperature();
    r = SampleSearch(b, init_states(b, rows), make_step(shared), dec.target_seq_len(),
                     dec.sos_id(), dec.eos_id(), temperature, dec.sampling_top_k(),
                     dec.sampling_seed());
  }
  return NestedMap{{"topk_ids", r.topk_ids},
                   {"topk_lens", r.topk_lens},
                   {"topk_scores", r.topk_scores}};
}

NestedMap TransformerModel::Translate(const NestedMap& theta, const NestedMap& src,
                                      int64_t num_hyps) const {
  if (src.Has("segment_ids")) {
    throw InvalidArgumentError(StrCat("task '", path(), "': cannot translate packed rows (the ",
                                      "batch has src.segment_ids); decode from an input with ",
                                      "packed_input False"));
  }
  at::NoGradGuard no_grad;
  EvalModeScope eval;
  const NestedMap enc = encoder_->FProp(encoder_.Theta(theta), src);
  at::Tensor shortlist_ids;
  if (shortlist_) {
    shortlist_ids = shortlist_->Candidates(src.GetTensor("ids"), OptionalInput(src, "paddings"),
                                           {decoder_->eos_id()});
  }
  return SearchDecoder(*decoder_, decoder_.Theta(theta), enc, src.GetTensor("ids").size(0),
                       decoding_, num_hyps, nullptr, nullptr, nullptr, shortlist_ids);
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

InferenceMap TransformerModel::RunInference(const NestedMap& theta, const std::string& subgraph,
                                            const InferenceMap& feeds,
                                            const BaseTokenizer* tokenizer) const {
  if (subgraph != "translate") return BaseTask::RunInference(theta, subgraph, feeds, tokenizer);
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
  const NestedMap r = Translate(theta, src, num_hyps);
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

GLOSSA_REGISTER_CLASS(TransformerModel, "glossa.mt.model.TransformerModel");

}  // namespace mt
}  // namespace glossa
