// lm.text.*: the Transformer language models of lm.austen.* for your own text. Their datasets read
// what the Params say (`datasets.train`, `datasets.dev`, `datasets.test`: "text:/path/*.txt", one
// example a line) with the SentencePiece model `task.input.tokenizer.spm_model_file` (`glossa
// tokenizer train` makes one); a job on a dataset or a tokenizer left unset is an error naming the
// key to set. The vocabulary is 8,000 pieces unless the overrides say otherwise (the task checks
// that the tokenizer, task.emb.vocab_size and task.softmax.num_classes agree). docs/own_data.md.
#include <string>

#include "glossa/model/model_registry.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/tasks/text_inputs.h"

namespace glossa {
namespace {

constexpr int64_t kVocabSize = 8000;

class TextLmBase : public ModelParamsBase {
 protected:
  virtual int64_t MaxLength() const { return 128; }
  virtual int64_t TokensPerBatch() const { return 2048; }

  Params Input(bool train) const {
    // The file from datasets.<dataset>; the tokenizer's model from the Params.
    return TextLmInputParams({"", "", kVocabSize, MaxLength(), TokensPerBatch()}, train);
  }

  static Params Lm(int64_t dim, int64_t layers, int64_t heads, int64_t hidden, int64_t max_steps,
                   double lr, int64_t warmup) {
    Params p = TransformerLmTask::CommonParams(kVocabSize, dim, hidden, heads, layers);
    p.Set("name", "lm");
    return TransformerLmTask::SetTrainingRecipe(p, max_steps, lr, warmup,
                                                /*final_lr_fraction=*/0.1, /*keep=*/5);
  }

 public:
  std::map<std::string, std::function<Params()>> Datasets() const override {
    return {{"Train", [this] { return Input(true); }},
            {"Dev", [this] { return Input(false); }},
            {"Test", [this] { return Input(false); }}};
  }
};

// lm.austen.TransformerLmTiny's shape: 2 layers, 128 wide.
class TransformerLmTiny : public TextLmBase {
 public:
  Params Task() const override { return Lm(128, 2, 4, 512, 1200, 2e-3, 100); }
};
GLOSSA_REGISTER_MODEL(TransformerLmTiny, "lm.text.TransformerLmTiny");

// lm.austen.TransformerLm512's shape: 6 layers, 512 wide, sequences up to 256.
class TransformerLm512 : public TextLmBase {
 protected:
  int64_t MaxLength() const override { return 256; }

 public:
  Params Task() const override { return Lm(512, 6, 8, 2048, 100000, 1e-3, 2000); }
};
GLOSSA_REGISTER_MODEL(TransformerLm512, "lm.text.TransformerLm512");

}  // namespace
}  // namespace glossa
