// lm.austen.*: Transformer language models on Jane Austen's six novels (data/austen/, produced by
// scripts/prepare_austen.sh from Debian's r-cran-janeaustenr; split by chapter), with the
// SentencePiece vocabulary data/austen/spm_2k.model trained on the Train split. The data directory
// is $GLOSSA_DATA_DIR/austen when GLOSSA_DATA_DIR is set, else the installation's
// <prefix>/share/glossa/austen (found from libglossa's own location, so an installed tree works
// wherever it is moved), else the source tree's data/austen (a build tree).
#include <string>

#include "glossa/base/strings.h"
#include "glossa/layers/moe.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/data_dir.h"
#include "glossa/tasks/text_inputs.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"

namespace glossa {
namespace {

std::string AustenDir() { return FindDataDir("austen", "scripts/prepare_austen.sh"); }

constexpr int64_t kVocabSize = 2000;

// Shared by every size: the inputs, the tokenizer and the decode settings.
class AustenLmBase : public ModelParamsBase {
 protected:
  virtual int64_t MaxLength() const { return 128; }
  virtual int64_t TokensPerBatch() const { return 2048; }

  Params Input(const std::string& split, bool train) const {
    return TextLmInputParams({StrCat("text:", AustenDir(), "/", split, ".txt"),
                              StrCat(AustenDir(), "/spm_2k.model"), kVocabSize, MaxLength(),
                              TokensPerBatch()},
                             train);
  }

 public:
  std::map<std::string, std::function<Params()>> Datasets() const override {
    return {{"Train", [this] { return Input("train", true); }},
            {"Dev", [this] { return Input("dev", false); }},
            {"Test", [this] { return Input("test", false); }}};
  }
};

Params LmTask(int64_t dim, int64_t layers, int64_t heads, int64_t hidden, int64_t max_steps,
              double lr, int64_t warmup) {
  Params p = TransformerLmTask::CommonParams(kVocabSize, dim, hidden, heads, layers);
  p.Set("name", "lm");
  return TransformerLmTask::SetTrainingRecipe(p, max_steps, lr, warmup,
                                              /*final_lr_fraction=*/0.1, /*keep=*/5);
}

// The README's default: trains in a few minutes on 2 CPU cores.
class TransformerLmTiny : public AustenLmBase {
 public:
  Params Task() const override { return LmTask(128, 2, 4, 512, 1200, 2e-3, 100); }
};
GLOSSA_REGISTER_MODEL(TransformerLmTiny, "lm.austen.TransformerLmTiny");

// The tiny model with GShard Mixture-of-Experts feed-forward blocks in its second layer: 4
// experts of hidden dim 512, top-2 routing over one group per batch.
class TransformerLmMoeTiny : public AustenLmBase {
 public:
  Params Task() const override {
    Params p = LmTask(128, 2, 4, 512, 1200, 2e-3, 100);
    // A list of two layer templates over 2 layers: layer 0 dense, layer 1 MoE. (A list splits
    // the layers into equal runs, as in Lingvo: over 4 layers, 0-1 dense and 2-3 MoE; MoE in
    // every other layer takes a list as long as num_layers.)
    const Params dense = p.GetParams("stack.transformer_layer_params_tpl");
    Params moe = dense.Copy();
    moe.Set("tr_fflayer_tpl", TransformerShardedMoeLayer::Params()
                                  .Set("hidden_dim", 512)
                                  .Set("residual_dropout_prob", 0.1)
                                  .Set("num_experts", 4)
                                  .Set("num_groups", 1)
                                  .Set("expert_capacity_factor", 1.5));
    p.Set("stack.transformer_layer_params_tpl", ParamValue::List{dense, moe});
    p.Set("aux_loss_weight", 0.01);
    return p;
  }
};
GLOSSA_REGISTER_MODEL(TransformerLmMoeTiny, "lm.austen.TransformerLmMoeTiny");

// TransformerLmMoeTiny with its 4 experts on 2 ranks (GShard's expert parallelism, num_devices 2:
// `glossa train --nproc_per_node=2`, docs/distributed.md). The variables keep their names and
// its checkpoints load whole, so TransformerLmMoeTiny exports and serves them in one process.
class TransformerLmMoeTinyExpertParallel : public TransformerLmMoeTiny {
 public:
  Params Task() const override {
    Params p = TransformerLmMoeTiny::Task();
    ParamValue::List layers = p.Get("stack.transformer_layer_params_tpl").AsList();
    Params moe = layers[1].AsParams().Copy();
    moe.Set("tr_fflayer_tpl.num_devices", 2).Set("tr_fflayer_tpl.num_groups", 2);
    layers[1] = moe;
    p.Set("stack.transformer_layer_params_tpl", layers);
    return p;
  }
};
GLOSSA_REGISTER_MODEL(TransformerLmMoeTinyExpertParallel,
                      "lm.austen.TransformerLmMoeTinyExpertParallel");

// A larger model (model_dim 512, 6 layers, sequences up to 256): the throughput benchmark's size.
class TransformerLm512 : public AustenLmBase {
 protected:
  int64_t MaxLength() const override { return 256; }

 public:
  Params Task() const override { return LmTask(512, 6, 8, 2048, 100000, 1e-3, 2000); }
};
GLOSSA_REGISTER_MODEL(TransformerLm512, "lm.austen.TransformerLm512");

}  // namespace
}  // namespace glossa
