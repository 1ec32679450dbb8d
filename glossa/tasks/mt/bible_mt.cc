// mt.bible.*: English→Spanish Transformers on the Bible corpus that scripts/prepare_bible_mt.sh
// builds from Debian's public-domain SWORD modules (King James / Reina-Valera 1909), aligned by
// verse, with Dev and Test books held out and a joint SentencePiece vocabulary of 8,000 pieces
// (data/bible_mt/, or $GLOSSA_DATA_DIR/bible_mt).
#include <algorithm>
#include <string>

#include "glossa/base/strings.h"
#include "glossa/input/nmt_input.h"
#include "glossa/input/tokenizers.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/data_dir.h"
#include "glossa/tasks/mt/mt.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"

namespace glossa {
namespace {

constexpr int64_t kVocabSize = 8000;

std::string BibleDir() { return FindDataDir("bible_mt", "scripts/prepare_bible_mt.sh"); }

class BibleEnEsBase : public ModelParamsBase {
 protected:
  // Pairs longer than this many pieces on either side are dropped from training (about 1%).
  virtual int64_t MaxLength() const { return 128; }
  virtual int64_t TokensPerBatch() const { return 4096; }

  Params Input(const std::string& split, bool train) const {
    Params p = TextPairInput::Params();
    p.Set("name", "input");
    p.Set("file_pattern", StrCat("text:", BibleDir(), "/", split, ".tsv"));
    p.Set("tokenizer", SentencePieceTokenizer::Params()
                           .Set("spm_model_file", StrCat(BibleDir(), "/spm_8000.model"))
                           .Set("vocab_size", kVocabSize));
    // Evaluation keeps every pair: no sentence of Dev or Test is longer than 4x the limit.
    const int64_t max_len = train ? MaxLength() : 4 * MaxLength();
    p.Set("source_max_length", max_len).Set("target_max_length", max_len);
    ParamValue::List bounds, limits;
    for (int64_t b : {16, 24, 32, 48, 64, 96, 128, 256, 512}) {
      if (b > max_len) break;
      bounds.push_back(ParamValue(b));
      limits.push_back(ParamValue(std::max<int64_t>(1, (train ? TokensPerBatch() : 2048) / b)));
    }
    p.Set("bucket_upper_bound", bounds);
    p.Set("bucket_batch_limit", limits);
    p.Set("file_parallelism", 1);
    if (!train) {
      p.Set("repeat_count", 1);
      p.Set("require_sequential_order", true);
    }
    return p;
  }

  Params MtTask(int64_t dim, int64_t layers, int64_t heads, int64_t hidden, int64_t max_steps,
                int64_t warmup) const {
    Params p = mt::TransformerModel::CommonParams(kVocabSize, dim, hidden, heads, layers);
    p.Set("name", "mt");
    p.Set("decoder.target_seq_len", 160);
    p.Set("decoder.beam_search.num_hyps_per_beam", 4);
    // Every verse gets a translation: a hypothesis still live at the last step ends there.
    p.Set("decoder.beam_search.force_eos_in_last_step", true);
    Params& tp = p.GetParams("train");
    tp.Set("max_steps", max_steps).Set("steps_per_loop", 50).Set("summary_interval_steps", 50);
    tp.Set("save_interval_seconds", 120).Set("save_max_to_keep", 5);
    Params& lp = tp.GetParams("learner");
    lp.Set("learning_rate", 1.0);
    lp.Set("lr_schedule",
           TransformerSchedule::Params().Set("warmup_steps", warmup).Set("model_dim", dim));
    lp.Set("optimizer", Adam::Params().Set("beta1", 0.9).Set("beta2", 0.98).Set("epsilon", 1e-9));
    lp.Set("clip_gradient_norm_to_value", 1.0);
    p.GetParams("eval").Set("samples_per_summary", 0);
    return p;
  }

 public:
  std::map<std::string, std::function<Params()>> Datasets() const override {
    return {{"Train", [this] { return Input("train", true); }},
            {"Dev", [this] { return Input("dev", false); }},
            {"Test", [this] { return Input("test", false); }}};
  }
};

// The default: model dim 256, 3 + 3 layers, bf16 compute; about 20 minutes on 2 cores.
class TransformerEnEsTiny : public BibleEnEsBase {
 public:
  Params Task() const override {
    Params p = MtTask(256, 3, 4, 1024, 1500, 400);
    p.Set("fprop_dtype", DType::kBFloat16);
    return p;
  }
};
GLOSSA_REGISTER_MODEL(TransformerEnEsTiny, "mt.bible.TransformerEnEsTiny");

// Transformer-base shapes (model dim 512, 6 + 6 layers, 8 heads, hidden 2,048): hours on CPU.
class TransformerEnEsBase : public BibleEnEsBase {
 public:
  Params Task() const override { return MtTask(512, 6, 8, 2048, 40000, 4000); }
};
GLOSSA_REGISTER_MODEL(TransformerEnEsBase, "mt.bible.TransformerEnEsBase");

}  // namespace
}  // namespace glossa
