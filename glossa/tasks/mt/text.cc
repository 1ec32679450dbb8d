// mt.text.*: the Transformers of mt.bible.* for your own parallel text. Their datasets read what
// the Params say (`datasets.train`, `datasets.dev`, `datasets.test`: "text:/path/train.tsv", a
// "source<TAB>target" pair a line) with one SentencePiece model for both sides,
// `task.input.tokenizer.spm_model_file` (`glossa tokenizer train --input=src.txt,tgt.txt` makes
// one); a job on a dataset or a tokenizer left unset is an error naming the key to set. The
// vocabulary is 8,000 pieces unless the overrides say otherwise (the task checks that the
// tokenizer, task.encoder.token_emb.vocab_size and task.decoder.token_emb.vocab_size agree).
// docs/own_data.md, "Translation".
#include "glossa/model/model_registry.h"
#include "glossa/tasks/mt/mt.h"
#include "glossa/tasks/text_inputs.h"

namespace glossa {
namespace {

constexpr int64_t kVocabSize = 8000;

class TextMtBase : public ModelParamsBase {
 protected:
  virtual int64_t MaxLength() const { return 128; }
  virtual int64_t TokensPerBatch() const { return 4096; }

  Params Input(bool train) const {
    // The file from datasets.<dataset>; the tokenizer's model from the Params.
    return TextPairInputParams({"", "", kVocabSize, MaxLength(), TokensPerBatch()}, train);
  }

  static Params MtTask(int64_t dim, int64_t layers, int64_t heads, int64_t hidden,
                       int64_t max_steps, int64_t warmup) {
    Params p = mt::TransformerModel::CommonParams(kVocabSize, dim, hidden, heads, layers);
    p.Set("name", "mt");
    return mt::TransformerModel::SetTrainingRecipe(p, max_steps, warmup);
  }

 public:
  std::map<std::string, std::function<Params()>> Datasets() const override {
    return {{"Train", [this] { return Input(true); }},
            {"Dev", [this] { return Input(false); }},
            {"Test", [this] { return Input(false); }}};
  }
};

// mt.bible.TransformerEnEsTiny's shape: model dim 256, 3 + 3 layers, bf16 compute.
class TransformerTiny : public TextMtBase {
 public:
  Params Task() const override {
    Params p = MtTask(256, 3, 4, 1024, 1500, 400);
    p.Set("fprop_dtype", DType::kBFloat16);
    return p;
  }
};
GLOSSA_REGISTER_MODEL(TransformerTiny, "mt.text.TransformerTiny");

// Transformer-base shapes (model dim 512, 6 + 6 layers, 8 heads, hidden 2,048).
class TransformerBase : public TextMtBase {
 public:
  Params Task() const override { return MtTask(512, 6, 8, 2048, 40000, 4000); }
};
GLOSSA_REGISTER_MODEL(TransformerBase, "mt.text.TransformerBase");

}  // namespace
}  // namespace glossa
