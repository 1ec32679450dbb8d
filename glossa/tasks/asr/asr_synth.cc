// asr.synth.*: speech recognisers on the synthetic read-speech corpus that
// scripts/prepare_speech.sh builds with espeak-ng from the Austen text (data/speech: wav/ and
// {train,dev,test}.tsv manifests; $GLOSSA_DATA_DIR/speech when set). Characters (AsciiTokenizer).
//
//   asr.synth.LasTiny  conv subsampling + 4-layer Transformer encoder, 2-layer attention decoder
//                      with beam search; joint CTC in the loss (weight 0.3) and in decoding (0.2).
//   asr.synth.CtcTiny  the same encoder with a CTC head alone, greedy CTC decoding.
//   asr.synth.CharLm   a character Transformer LM on the Austen Train chapters' text.
//   asr.synth.LasTinyLm LasTiny with CharLm fused into a beam of 16 (shallow fusion).
// Beam and greedy decoding spell only words of <speech dir>/lexicon.txt when the corpus has it.
#include <cstdlib>
#include <string>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/input/asr_input.h"
#include "glossa/input/input_generator.h"
#include "glossa/input/tokenizers.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/asr/asr.h"
#include "glossa/tasks/data_dir.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"

namespace glossa {
namespace {

std::string SpeechDir() { return FindDataDir("speech", "scripts/prepare_speech.sh"); }

// The frontend's per-bin normalisation from <speech dir>/feature_stats.txt (prepare_speech.sh
// computes it over Train), as Lingvo's recipes fix per_bin_mean and per_bin_stddev from their
// data. Without the corpus the defaults (0 and 1) stay.
void SetFeatureStats(Params& p) {
  std::string file;
  try {
    file = JoinPath(SpeechDir(), "feature_stats.txt");
  } catch (const NotFoundError&) {
    return;
  }
  if (!FileExists(file)) return;
  for (const std::string& line : Split(ReadFileToString(file), '\n')) {
    const std::vector<std::string> f = Split(line, ' ');
    if (f.size() < 2 || (f[0] != "per_bin_mean" && f[0] != "per_bin_stddev")) continue;
    ParamValue::List values;
    for (size_t i = 1; i < f.size(); ++i) {
      if (f[i].empty()) continue;
      try {
        values.emplace_back(std::stod(f[i]));
      } catch (const std::exception&) {
        throw DataLossError(StrCat(file, ": ", f[0], ": '", f[i], "' is not a number (rerun "
                                   "scripts/prepare_speech.sh)"));
      }
    }
    p.Set(StrCat("frontend.", f[0]), values);
  }
}

// <speech dir>/lexicon.txt when the corpus has one, else ''.
std::string LexiconFile() {
  try {
    const std::string file = JoinPath(SpeechDir(), "lexicon.txt");
    return FileExists(file) ? file : std::string();
  } catch (const NotFoundError&) {
    return "";
  }
}

class SynthSpeechBase : public ModelParamsBase {
 protected:
  Params Input(const std::string& split, bool train) const {
    Params p = AsrInput::Params();
    p.Set("name", "input");
    const std::string dir = SpeechDir();
    p.Set("file_pattern", StrCat("text:", dir, "/", split, ".tsv"));
    p.Set("audio_root", dir);
    p.Set("file_parallelism", 1).Set("num_batcher_threads", 2);
    // Utterances of up to 4 s (400 frames) in batches of ~12,800 frames.
    p.Set("bucket_upper_bound", ParamValue::List{150, 250, 400, 600});
    p.Set("bucket_batch_limit", ParamValue::List{64, 48, 32, 20});
    if (!train) {
      // Every Dev and Test utterance is scored, however long (up to max_audio_seconds).
      p.Set("repeat_count", 1).Set("require_sequential_order", true);
      p.Set("bucket_upper_bound", ParamValue::List{600, 2000});
      p.Set("bucket_batch_limit", ParamValue::List{20, 6});
    }
    return p;
  }

  Params Model(double ctc_weight, int64_t max_steps) const {
    Params p = asr::AsrModel::CommonParams(/*vocab_size=*/76, /*model_dim=*/144, /*hidden_dim=*/576,
                                           /*num_heads=*/4, /*encoder_layers=*/4,
                                           /*decoder_layers=*/2, ctc_weight);
    Params& tp = p.GetParams("train");
    tp.Set("max_steps", max_steps).Set("steps_per_loop", 100).Set("summary_interval_steps", 100);
    tp.Set("save_interval_seconds", 120).Set("save_max_to_keep", 3);
    tp.Set("learner.learning_rate", 2e-3).Set("learner.clip_gradient_norm_to_value", 5.0);
    tp.Set("learner.lr_schedule", LinearRampupCosineSchedule::Params()
                                      .Set("warmup_steps", 300)
                                      .Set("total_steps", max_steps)
                                      .Set("final_value", 0.05));
    tp.Set("learner.optimizer", Adam::Params().Set("beta1", 0.9).Set("beta2", 0.98).Set("epsilon", 1e-9));
    p.GetParams("eval").Set("samples_per_summary", 0);
    // SpecAugment's frequency masks only: on 2,000 steps, time masks of up to 40 frames (whole
    // words) slowed learning more than they regularised (Dev WER 38.7% without them, docs/asr.md).
    p.Set("specaugment.time_mask_count", 0).Set("specaugment.freq_mask_max_bins", 10);
    if (p.IsSet("decoder")) {
      p.Set("decoder.beam_search.num_hyps_per_beam", 4);
      // Joint CTC/attention decoding: halves the CER of attention-only beam search, mostly by
      // ending fewer hypotheses early. 0.1 to 0.3 score alike on Dev (docs/asr.md).
      p.Set("joint_ctc_decoding_weight", 0.2);
      // The closed vocabulary of the Austen Train chapters (prepare_speech.sh writes it; 0.6-0.9%
      // of Dev and Test words are outside it): every decoded word is a real one. Dev WER 37.1% ->
      // 27.5% on the same checkpoint (docs/asr.md).
      const std::string lexicon = LexiconFile();
      if (!lexicon.empty()) p.Set("lexicon_file", lexicon);
    }
    SetFeatureStats(p);
    return p;
  }

 public:
  std::map<std::string, std::function<Params()>> Datasets() const override {
    return {{"Train", [this] { return Input("train", true); }},
            {"Dev", [this] { return Input("dev", false); }},
            {"Test", [this] { return Input("test", false); }}};
  }
};

class LasTiny : public SynthSpeechBase {
 public:
  Params Task() const override { return Model(0.3, 2000); }
};
GLOSSA_REGISTER_MODEL(LasTiny, "asr.synth.LasTiny");

// LasTiny's network and recipe over 4,000 steps (the cosine schedule stretched to them): about
// 50 minutes on 2 cores. Test WER 10.6% against LasTiny's 26.5% (docs/asr.md): at 2,000 steps
// the acoustic model is still learning.
class LasTinyLong : public SynthSpeechBase {
 public:
  Params Task() const override { return Model(0.3, 4000); }
};
GLOSSA_REGISTER_MODEL(LasTinyLong, "asr.synth.LasTinyLong");

class CtcTiny : public SynthSpeechBase {
 public:
  Params Task() const override { return Model(1.0, 2000); }
};
GLOSSA_REGISTER_MODEL(CtcTiny, "asr.synth.CtcTiny");

// ---- The speech LM and shallow fusion ----

// A character Transformer LM over the transcripts' alphabet (AsciiTokenizer, the decoder's
// vocabulary) on the Austen Train chapters' sentences (<speech dir>/lm_train.txt, written by
// prepare_speech.sh; 35k sentences, 2.8 MB), about 6x the text of the Train transcripts. Dev: the
// Dev chapters' sentences.
Params CharLmTask(int64_t max_steps) {
  Params p = TransformerLmTask::CommonParams(/*vocab_size=*/76, /*model_dim=*/256,
                                             /*hidden_dim=*/1024, /*num_heads=*/4,
                                             /*num_layers=*/4);
  p.Set("name", "lm");
  return TransformerLmTask::SetTrainingRecipe(p, max_steps, /*lr=*/2e-3, /*warmup_steps=*/100,
                                              /*final_lr_fraction=*/0.05, /*keep=*/3);
}

constexpr int64_t kCharLmSteps = 800;

class CharLm : public ModelParamsBase {
 public:
  Params Task() const override { return CharLmTask(kCharLmSteps); }
  std::map<std::string, std::function<Params()>> Datasets() const override {
    return {{"Train", [] { return Input("lm_train.txt", true); }},
            {"Dev", [] { return Input("lm_dev.txt", false); }}};
  }

 private:
  static Params Input(const std::string& file, bool train) {
    Params p = TextLmInput::Params();
    p.Set("name", "input");
    p.Set("file_pattern", StrCat("text:", JoinPath(SpeechDir(), file)));
    p.Set("tokenizer", AsciiTokenizer::Params());
    // Sentences of up to 40 words (prepare_speech.sh) fit 256 characters; ~8k characters a batch.
    p.Set("target_max_length", 256);
    p.Set("bucket_upper_bound", ParamValue::List{64, 128, 256});
    p.Set("bucket_batch_limit", ParamValue::List{128, 64, 32});
    p.Set("file_parallelism", 1);
    if (!train) p.Set("repeat_count", 1).Set("require_sequential_order", true);
    return p;
  }
};
GLOSSA_REGISTER_MODEL(CharLm, "asr.synth.CharLm");

// Where LasTinyLm loads the LM from: $GLOSSA_SPEECH_LM, else runs/speech/lm/train (where
// docs/asr.md trains asr.synth.CharLm). A train dir gives its latest checkpoint.
std::string SpeechLmCheckpoint() {
  const char* env = std::getenv("GLOSSA_SPEECH_LM");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("runs/speech/lm/train");
}

// LasTiny with asr.synth.CharLm fused into a wider beam search (shallow fusion, docs/asr.md). The
// LM's variables come from its own checkpoint (init_from_checkpoint_rules at step 0) and are not
// trained here. Variable names: the model "asr" (the key's first part), then the task ("asr"
// here, "lm" in CharLm).
class LasTinyLm : public SynthSpeechBase {
 public:
  Params Task() const override {
    Params p = Model(0.3, 2000);
    p.Set("lm", CharLmTask(kCharLmSteps));
    // Tuned on Dev with the lexicon (docs/asr.md): β 0.5 (0.2 to 0.6 within a point at beam 4),
    // a beam of 16 (beam 4: 26.1% Dev WER, 8: 24.0%, 16: 22.2%) and λ 0.4 (0.3: 21.9%, 0.5: 22.2%).
    p.Set("lm_fusion_weight", 0.5);
    p.Set("decoder.beam_search.num_hyps_per_beam", 16);
    p.Set("joint_ctc_decoding_weight", 0.4);
    Params& tp = p.GetParams("train");
    tp.Set("learner.bprop_variable_exclusion", "^asr/asr/lm/");
    ParamValue::List rules{ParamValue::List{ParamValue("^asr/asr/lm/(.*)$"), ParamValue("asr/lm/%s")}};
    ParamValue::Dict init;
    init[SpeechLmCheckpoint()] = ParamValue::List{ParamValue(rules), ParamValue(ParamValue::List{})};
    tp.Set("init_from_checkpoint_rules", init);
    return p;
  }
};
GLOSSA_REGISTER_MODEL(LasTinyLm, "asr.synth.LasTinyLm");

}  // namespace
}  // namespace glossa
