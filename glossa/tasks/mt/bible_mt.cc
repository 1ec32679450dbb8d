// mt.bible.*: English→Spanish Transformers on the Bible corpus that scripts/prepare_bible_mt.sh
// builds from Debian's public-domain SWORD modules (King James / Reina-Valera 1909), aligned by
// verse, with Dev and Test books held out and a joint SentencePiece vocabulary of 8,000 pieces
// (data/bible_mt/, or $GLOSSA_DATA_DIR/bible_mt).
#include <string>

#include "glossa/base/strings.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/data_dir.h"
#include "glossa/tasks/mt/mt.h"
#include "glossa/tasks/text_inputs.h"

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
    return TextPairInputParams({StrCat("text:", BibleDir(), "/", split, ".tsv"),
                                StrCat(BibleDir(), "/spm_8000.model"), kVocabSize, MaxLength(),
                                TokensPerBatch()},
                               train);
  }

  static Params MtTask(int64_t dim, int64_t layers, int64_t heads, int64_t hidden,
                       int64_t max_steps, int64_t warmup) {
    Params p = mt::TransformerModel::CommonParams(kVocabSize, dim, hidden, heads, layers);
    p.Set("name", "mt");
    return mt::TransformerModel::SetTrainingRecipe(p, max_steps, warmup);
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
