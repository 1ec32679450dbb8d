// A model of one's own, built against the installed package into a shared library and run by the
// stock `glossa` with --load_library (docs/own_data.md): a task derived from the LM task that
// adds a metric, the share of <unk> tokens in the batch (how well the tokenizer covers the text),
// and keeps everything else of the LM: log_pplx, decode, the report with its unigram baseline,
// and the inference subgraphs export and serving use. Its datasets read what `datasets.*` say.
#include <ATen/ATen.h>

#include "glossa/input/input_generator.h"
#include "glossa/input/tokenizers.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/lm/transformer_lm.h"

namespace {

class UnkCountingLm : public glossa::TransformerLmTask {
 public:
  static glossa::Params Params() {
    glossa::Params p = TransformerLmTask::Params();
    p.Set("cls", glossa::ClsOf<UnkCountingLm>());
    p.Define("unk_id", 0, "The tokenizer's <unk> id.");
    return p;
  }
  explicit UnkCountingLm(const glossa::Params& p) : TransformerLmTask(p) {}

  LossOutput ComputeLoss(const glossa::NestedMap& theta, const glossa::NestedMap& predictions,
                         const glossa::NestedMap& batch) const override {
    LossOutput out = TransformerLmTask::ComputeLoss(theta, predictions, batch);
    const at::Tensor real = 1.0 - batch.GetTensor("paddings");
    const at::Tensor unk = batch.GetTensor("labels").eq(params().GetInt("unk_id")).to(real.dtype());
    const at::Tensor tokens = real.sum();
    out.metrics["unk_fraction"] = {(unk * real).sum() / tokens.clamp_min(1.0), tokens};
    return out;
  }
};
GLOSSA_REGISTER_CLASS(UnkCountingLm, "consumer.UnkCountingLm");

class MyLm : public glossa::ModelParamsBase {
 public:
  glossa::Params Task() const override {
    glossa::Params p = UnkCountingLm::Params();
    glossa::CopyFieldsTo(glossa::TransformerLmTask::CommonParams(2000, 16, 32, 2, 1), p);
    p.Set("name", "lm");
    return glossa::TransformerLmTask::SetTrainingRecipe(p, 100, 1e-3, 10, 0.1, 3);
  }
  std::map<std::string, std::function<glossa::Params()>> Datasets() const override {
    auto input = [](bool train) {
      glossa::Params p = glossa::TextLmInput::Params();
      p.Set("name", "input").Set("file_pattern", "");  // from datasets.<dataset>
      p.Set("tokenizer", glossa::SentencePieceTokenizer::Params().Set("vocab_size", 2000));
      p.Set("target_max_length", 64).Set("bucket_upper_bound", glossa::ParamValue::List{64});
      p.Set("bucket_batch_limit", glossa::ParamValue::List{16}).Set("file_parallelism", 1);
      if (!train) p.Set("repeat_count", 1).Set("require_sequential_order", true);
      return p;
    };
    return {{"Train", [=] { return input(true); }}, {"Dev", [=] { return input(false); }}};
  }
};
GLOSSA_REGISTER_MODEL(MyLm, "consumer.lm.MyLm");

}  // namespace
