// Speech recognition: edit distances (WER, CER), the AsrModel's losses (attention, CTC, joint) and
// their gradients, training steps on a fixed batch, CTC greedy and beam transcription, and the
// `transcribe` subgraph's feed checks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <regex>
#include <set>

#include "glossa/base/errors.h"
#include "glossa/core/step_seed.h"
#include "glossa/input/tokenizers.h"
#include "glossa/io/wav.h"
#include "glossa/metrics/wer.h"
#include "glossa/tasks/asr/asr.h"
#include "glossa/tasks/mt/mt.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/model/model_registry.h"
#include "glossa/optim/learner.h"
#include "glossa/optim/schedule.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(WerTest, EditDistancesCountSubstitutionsInsertionsDeletions) {
  ErrorCounts e = WordErrors("the cat sat on the mat", "the bat sat on mat");
  EXPECT_EQ(e.substitutions, 1);  // cat -> bat
  EXPECT_EQ(e.deletions, 1);      // one "the" or "mat"
  EXPECT_EQ(e.insertions, 0);
  EXPECT_EQ(e.reference_length, 6);
  EXPECT_NEAR(e.rate(), 2.0 / 6, 1e-12);
  EXPECT_EQ(WordErrors("a b", "a x b").insertions, 1);
  EXPECT_EQ(WordErrors("a b c", "a b c").errors(), 0);
  EXPECT_EQ(WordErrors("", "x y").insertions, 2);
  EXPECT_EQ(WordErrors("x y", "").deletions, 2);
  // Characters count the single space between words; runs of whitespace collapse.
  ErrorCounts c = CharErrors("ab  cd", "abd");
  EXPECT_EQ(c.reference_length, 5);  // a b ' ' c d
  EXPECT_EQ(c.errors(), 2);
  // Against a brute-force Levenshtein on random strings.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> a, b;
    for (int i = 0, n = rng() % 7; i < n; ++i) a.push_back(std::string(1, 'a' + rng() % 3));
    for (int i = 0, n = rng() % 7; i < n; ++i) b.push_back(std::string(1, 'a' + rng() % 3));
    std::vector<std::vector<int>> d(a.size() + 1, std::vector<int>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = static_cast<int>(i);
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = static_cast<int>(j);
    for (size_t i = 1; i <= a.size(); ++i) {
      for (size_t j = 1; j <= b.size(); ++j) {
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      }
    }
    EXPECT_EQ(EditDistance(a, b).errors(), d[a.size()][b.size()]);
  }
}

Params TinyAsr(double ctc_weight) {
  Params p = asr::AsrModel::CommonParams(/*vocab_size=*/76, /*model_dim=*/32, /*hidden_dim=*/64,
                                         /*num_heads=*/2, /*encoder_layers=*/1,
                                         /*decoder_layers=*/1, ctc_weight);
  p.Set("random_seed", 4).Set("frontend.num_bins", 20).Set("encoder.conv_channels", 4);
  p.Set("train.learner.learning_rate", 3e-3);
  p.Set("train.learner.lr_schedule", ConstantSchedule::Params());
  if (p.IsSet("decoder")) p.Set("decoder.target_seq_len", 12);
  return p;
}

// Two utterances of different lengths: tones whose pitch spells the transcript.
NestedMap TinyBatch() {
  AsciiTokenizer tok(AsciiTokenizer::Params());
  const std::vector<std::string> texts = {"ab", "ba c"};
  const int64_t n = 9000;
  at::Tensor pcm = at::zeros({2, n}), pad = at::zeros({2, n});
  for (int64_t i = 0; i < 2; ++i) {
    const at::Tensor t = at::arange(n, at::kFloat);
    pcm[i] = 4000 * at::sin(t * (0.05 + 0.05 * static_cast<double>(i)));
  }
  pad[0].slice(0, 7000).fill_(1);
  pcm[0].slice(0, 7000).fill_(0);
  at::Tensor ids = at::full({2, 5}, tok.eos_id(), at::kLong), labels = ids.clone();
  at::Tensor tpad = at::ones({2, 5}), w = at::zeros({2, 5});
  for (int64_t i = 0; i < 2; ++i) {
    std::vector<int64_t> x = tok.StringToIds(texts[i]);
    ids[i][0] = tok.sos_id();
    for (size_t j = 0; j < x.size(); ++j) {
      ids[i][static_cast<int64_t>(j) + 1] = x[j];
      labels[i][static_cast<int64_t>(j)] = x[j];
    }
    const int64_t len = static_cast<int64_t>(x.size()) + 1;
    labels[i][len - 1] = tok.eos_id();
    tpad[i].slice(0, 0, len).fill_(0);
    w[i].slice(0, 0, len).fill_(1);
  }
  NestedMap b;
  b.Set("src.src_inputs", pcm);
  b.Set("src.paddings", pad);
  b.Set("tgt.ids", ids);
  b.Set("tgt.labels", labels);
  b.Set("tgt.paddings", tpad);
  b.Set("tgt.weights", w);
  return b;
}

TEST(AsrModelTest, LossesGradientsAndTraining) {
  const NestedMap batch = TinyBatch();
  for (double ctc_weight : {0.0, 0.3, 1.0}) {
    auto task = TinyAsr(ctc_weight).Instantiate<asr::AsrModel>();
    const auto vars = LearnerVariables(*task);
    double first = 0, last = 0;
    const int steps = ctc_weight > 0 && ctc_weight < 1 ? 250 : 60;  // the joint model memorises
    for (int step = 0; step < steps; ++step) {
      SetGlobalStep(step);
      auto r = task->FPropDefaultTheta(batch);
      const double loss = r.metrics.at("loss").value.item<double>();
      ASSERT_TRUE(std::isfinite(loss)) << ctc_weight;
      if (step == 0) {
        first = loss;
        EXPECT_EQ(r.metrics.count("ctc_loss"), ctc_weight > 0 ? 1u : 0u);
        EXPECT_EQ(r.metrics.count("log_pplx"), ctc_weight < 1 ? 1u : 0u);
        if (ctc_weight > 0 && ctc_weight < 1) {
          const double joint = (1 - ctc_weight) * r.metrics.at("log_pplx").value.item<double>() +
                               ctc_weight * r.metrics.at("ctc_loss").value.item<double>();
          // The attention part is label-smoothed, log_pplx is not: close, not equal.
          EXPECT_NEAR(loss, joint, 0.2 * joint);
        }
      }
      last = loss;
      task->learner().Apply(r.metrics, vars, step);
    }
    EXPECT_LT(last, first * 0.5) << "ctc_weight " << ctc_weight << ": " << first << " -> " << last;
    // The memorised batch transcribes: beam (attention) or CTC greedy.
    const NestedMap out = task->Transcribe(task->theta(), batch.GetItem("src").AsMap(), 0);
    EXPECT_EQ(out.GetTensor("topk_ids").size(0), 2);
    if (ctc_weight > 0 && ctc_weight < 1) {
      // Joint CTC/attention decoding of the same weights (decoding params do not change them):
      // both memorised transcripts come out whole, with </s>.
      // With terminate_beams_independently too: the CTC join reads its frames by hypothesis
      // index, so its search keeps every source in the batch (drop_finished_sources is set aside).
      Params jp = TinyAsr(ctc_weight);
      for (bool independent : {false, true}) {
        jp.Set("joint_ctc_decoding_weight", 0.5);
        jp.Set("decoder.beam_search.terminate_beams_independently", independent);
        auto joint = jp.Instantiate<asr::AsrModel>();
        {
          at::NoGradGuard no_grad;
          for (const auto& [key, v] : task->vars().FlattenItems()) {
            joint->vars().GetTensor(key).copy_(v.AsTensor());
          }
        }
        const NestedMap j = joint->Transcribe(joint->theta(), batch.GetItem("src").AsMap(), 0);
        const at::Tensor labels = batch.GetTensor("tgt.labels");
        for (int64_t i = 0; i < 2; ++i) {
          const int64_t len = j.GetTensor("topk_lens")[i][0].item<int64_t>();
          ASSERT_EQ(len, (1 - batch.GetTensor("tgt.paddings")[i]).sum().item<int64_t>()) << i;
          EXPECT_TRUE(at::equal(j.GetTensor("topk_ids")[i][0].slice(0, 0, len),
                                labels[i].slice(0, 0, len)))
              << i << " (independent " << independent << "): " << j.GetTensor("topk_ids")[i][0];
        }
      }
      jp.Set("ctc_weight", 0.0).Set("joint_ctc_decoding_weight", 0.5);
      EXPECT_ERROR_CONTAINS(jp.Instantiate<asr::AsrModel>(), InvalidArgumentError,
                            "joint_ctc_decoding_weight 0.5 needs a CTC head");
    }
  }
  SetGlobalStep(0);
}

TEST(AsrModelTest, BidirectionalLstmEncoderTrains) {
  const NestedMap batch = TinyBatch();
  Params p = TinyAsr(0.3);
  p.Set("encoder.encoder_type", "blstm").Set("encoder.lstm_layers", 2);
  auto task = p.Instantiate<asr::AsrModel>();
  EXPECT_TRUE(task->vars().contains("encoder"));
  EXPECT_TRUE(task->vars().GetItem("encoder").AsMap().contains("bwd"));
  EXPECT_FALSE(task->vars().GetItem("encoder").AsMap().contains("transformer_stack"));
  const auto vars = LearnerVariables(*task);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    SetGlobalStep(step);
    auto r = task->FPropDefaultTheta(batch);
    last = r.metrics.at("loss").value.item<double>();
    if (step == 0) first = last;
    task->learner().Apply(r.metrics, vars, step);
  }
  EXPECT_LT(last, first * 0.5) << first << " -> " << last;
  SetGlobalStep(0);
  p.Set("encoder.encoder_type", "gru");
  EXPECT_ERROR_CONTAINS(p.Instantiate<asr::AsrModel>(), InvalidArgumentError,
                        "encoder_type must be 'transformer' or 'blstm', got 'gru'");
}

TEST(AsrModelTest, TranscribeSubgraphChecksItsFeeds) {
  auto task = TinyAsr(0.3).Instantiate<asr::AsrModel>();
  AsciiTokenizer tok(AsciiTokenizer::Params());
  const std::string wav = EncodeWav16(4000 * at::sin(at::arange(8000, at::kFloat) * 0.07), 16000);
  InferenceMap f;
  f["wav"] = InferenceValue::Strings({wav});
  f["num_hyps"] = InferenceValue::Of(at::tensor(2, at::kLong).reshape({}));
  const InferenceMap out = task->RunInference(task->theta(), "transcribe", f, &tok);
  EXPECT_EQ(out.at("transcript").strings.size(), 1u);
  EXPECT_EQ(out.at("scores").tensor.sizes(), (std::vector<int64_t>{1, 2}));
  auto bad = [&](const std::string& bytes, const std::string& message) {
    InferenceMap g;
    g["wav"] = InferenceValue::Strings({bytes});
    EXPECT_ERROR_CONTAINS(task->RunInference(task->theta(), "transcribe", g, &tok), InvalidArgumentError, message);
  };
  bad("hello", "feed 'wav'[0]: not a WAV file, nor the base64 of one");
  bad(EncodeWav16(at::zeros({8000}), 8000), "feed 'wav'[0]: 8000 Hz; the model takes 16000 Hz");
  bad(EncodeWav16(at::zeros({300}), 16000), "300 samples are too short");
  bad(wav.substr(0, 100), "feed 'wav'[0]: truncated data chunk at byte 36");
}


// Shallow fusion: greedy decoding with a fused LM picks, at every step, the argmax of
// log p_dec + w·log p_lm, and scores the sum of those terms, where both log-probs are recomputed
// here over the whole hypothesis at once (teacher-forced Logits, not the incremental steps).
TEST(AsrModelTest, ShallowFusionAddsTheLanguageModelsScores) {
  const NestedMap batch = TinyBatch();
  Params lm = TransformerLmTask::CommonParams(/*vocab_size=*/76, /*model_dim=*/16,
                                              /*hidden_dim=*/32, /*num_heads=*/2,
                                              /*num_layers=*/2);
  lm.Set("random_seed", 9);
  const double w = 0.8;
  Params p = TinyAsr(0.0);
  p.Set("decoding", "greedy").Set("lm", lm).Set("lm_fusion_weight", w);
  auto task = p.Instantiate<asr::AsrModel>();
  ASSERT_TRUE(task->vars().contains("lm"));
  // The same layers, standalone, with the task's weights.
  auto dec = p.GetParams("decoder").Copy().Set("name", "decoder").Instantiate<mt::TransformerDecoder>();
  auto lm_task = lm.Copy().Set("name", "lm").Instantiate<TransformerLmTask>();
  {
    at::NoGradGuard no_grad;
    // A peaked LM (its softmax scaled up), so that fusion changes choices of the untrained decoder.
    for (const auto& [key, v] : task->vars().GetItem("lm").AsMap().FlattenItems()) {
      if (key.find("softmax") != std::string::npos) v.AsTensor().mul_(40);
    }
    for (const auto& [key, v] : task->vars().GetItem("decoder").AsMap().FlattenItems()) {
      dec->vars().GetTensor(key).copy_(v.AsTensor());
    }
    for (const auto& [key, v] : task->vars().GetItem("lm").AsMap().FlattenItems()) {
      lm_task->vars().GetTensor(key).copy_(v.AsTensor());
    }
  }
  at::NoGradGuard no_grad;
  EvalModeScope eval;
  const NestedMap& src = batch.GetItem("src").AsMap();
  const NestedMap out = task->Transcribe(task->theta(), src, 0);
  const NestedMap enc = task->Encode(task->theta(), src);
  int64_t lm_changed_choice = 0;
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t len = out.GetTensor("topk_lens")[i][0].item<int64_t>();
    ASSERT_GT(len, 0);
    const at::Tensor hyp = out.GetTensor("topk_ids")[i][0].slice(0, 0, len);
    at::Tensor in = at::empty({1, len}, at::kLong);
    in[0][0] = dec->sos_id();
    if (len > 1) in[0].slice(0, 1).copy_(hyp.slice(0, 0, len - 1));
    const at::Tensor pad = at::zeros({1, len});
    NestedMap enc_i{{"encoded", enc.GetTensor("encoded").slice(0, i, i + 1)},
                    {"paddings", enc.GetTensor("paddings").slice(0, i, i + 1)}};
    const at::Tensor dec_lp = at::log_softmax(dec->Logits(dec->theta(), enc_i, in, pad).to(at::kFloat), -1)[0];
    const at::Tensor lm_lp = at::log_softmax(lm_task->Logits(lm_task->theta(), in, pad).to(at::kFloat), -1)[0];
    const at::Tensor joint = dec_lp + w * lm_lp;
    double score = 0;
    for (int64_t t = 0; t < len; ++t) {
      const int64_t tok = hyp[t].item<int64_t>();
      EXPECT_EQ(joint[t].argmax().item<int64_t>(), tok) << "utterance " << i << " step " << t;
      if (dec_lp[t].argmax().item<int64_t>() != tok) ++lm_changed_choice;
      score += joint[t][tok].item<double>();
    }
    EXPECT_NEAR(out.GetTensor("topk_scores")[i][0].item<double>(), score, 1e-3) << i;
  }
  // The LM mattered: some step's choice differs from the decoder's own argmax.
  EXPECT_GT(lm_changed_choice, 0);

  // Beam search with the LM runs, and a zero weight is the decoder alone.
  p.Set("decoding", "beam");
  EXPECT_EQ(p.Instantiate<asr::AsrModel>()->Transcribe(task->theta(), src, 0).GetTensor("topk_ids").size(0), 2);
  // Errors name the field.
  Params bad = TinyAsr(0.0);
  bad.Set("lm_fusion_weight", 0.5);
  EXPECT_ERROR_CONTAINS(bad.Instantiate<asr::AsrModel>(), InvalidArgumentError,
                        "lm_fusion_weight 0.5 needs an lm");
  bad.Set("lm", lm.Copy().Set("emb.vocab_size", 80).Set("softmax.num_classes", 80));
  EXPECT_ERROR_CONTAINS(bad.Instantiate<asr::AsrModel>(), InvalidArgumentError,
                        "lm's vocabulary (80) differs from the decoder's (76)");
  bad.Set("lm", lm).Set("lm_fusion_weight", -1.0);
  EXPECT_ERROR_CONTAINS(bad.Instantiate<asr::AsrModel>(), InvalidArgumentError,
                        "lm_fusion_weight must be finite and >= 0");
}

// asr.synth.LasTinyLm: its LM is asr.synth.CharLm's network, loaded by init_from_checkpoint_rules
// (every LM variable maps to CharLm's name) and kept out of training (the learner's exclusion
// selects every variable but the LM's).
TEST(AsrModelTest, LasTinyLmLoadsAndFreezesTheCharLm) {
  // Both models as the trainer builds them (GetModelParams without the datasets, which need the
  // corpus): a SingleTaskModel named after the key's first part.
  auto build = [](const std::string& key) {
    Params mp = SingleTaskModel::Params();
    mp.Set("task", GetModelParamsClass(key)->Task()).Set("name", "asr");
    return InstantiateLayer<SingleTaskModel>(mp);
  };
  auto model = build("asr.synth.LasTinyLm");
  auto lm_model = build("asr.synth.CharLm");
  BaseTask* task = &model->task();
  const Params& p = task->params();
  std::set<std::string> lm_names;
  for (const auto& [info, t] : lm_model->AllVariables()) lm_names.insert(info.full_name);
  ASSERT_FALSE(lm_names.empty());
  const ParamValue::Dict& rules = p.GetParams("train").Get("init_from_checkpoint_rules").AsDict();
  ASSERT_EQ(rules.size(), 1u);
  const auto& rule = rules.begin()->second.AsList()[0].AsList()[0].AsList();
  const std::regex re(rule[0].AsString());
  const std::string fmt = rule[1].AsString();
  int64_t mapped = 0;
  for (const auto& [info, t] : model->AllVariables()) {
    std::smatch m;
    if (!std::regex_match(info.full_name, m, re)) continue;
    std::string source = fmt.substr(0, fmt.find("%s")) + m[1].str();
    EXPECT_EQ(lm_names.count(source), 1u) << info.full_name << " -> " << source;
    ++mapped;
  }
  EXPECT_EQ(mapped, static_cast<int64_t>(lm_names.size()));
  const auto all = LearnerVariables(*task);
  const auto trained = task->learner().SelectVariables(all);
  EXPECT_EQ(all.size() - trained.size(), lm_names.size());
  for (const auto& v : trained) EXPECT_FALSE(std::regex_match(v.name, re)) << v.name;
}

// asr.synth.LasTinyLong is LasTiny over 4,000 steps: the same task but for max_steps and the
// schedule's total_steps.
TEST(AsrModelTest, LasTinyLongIsLasTinyOverTwiceTheSteps) {
  Params tiny = GetModelParamsClass("asr.synth.LasTiny")->Task();
  Params longer = GetModelParamsClass("asr.synth.LasTinyLong")->Task();
  EXPECT_EQ(tiny.GetInt("train.max_steps"), 2000);
  EXPECT_EQ(longer.GetInt("train.max_steps"), 4000);
  EXPECT_EQ(longer.GetInt("train.learner.lr_schedule.total_steps"), 4000);
  longer.Set("train.max_steps", 2000).Set("train.learner.lr_schedule.total_steps", 2000);
  EXPECT_EQ(longer.ToText(), tiny.ToText());
}

}  // namespace
}  // namespace glossa
