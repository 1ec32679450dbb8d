// A complete custom model: a sequence tagger composed from sub-Params (embedding → Transformer
// encoder → softmax), trained a few steps. Compiled into the test binary (tests/CMakeLists.txt);
// docs/layers.md shows this file verbatim.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "glossa/layers/embedding.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/model/base_task.h"
#include "glossa/optim/schedule.h"

namespace example {

using glossa::NestedMap;

class TaggerTask : public glossa::BaseTask {
 public:
  // Every sublayer is a template: `enc.transformer_layer_params_tpl.tr_fflayer_tpl.activation`
  // is as reachable as `softmax.num_classes`.
  static glossa::Params Params() {
    glossa::Params p = BaseTask::Params();
    p.Set("cls", glossa::ClsOf<TaggerTask>());
    p.Define("emb", glossa::EmbeddingLayer::Params(), "Token embedding.");
    p.Define("enc", glossa::TransformerEncoder::Params(), "Transformer encoder (BaseTask already has an `encoder` field).");
    p.Define("softmax", glossa::SimpleFullSoftmax::Params(), "Per-token tag softmax.");
    return p;
  }

  explicit TaggerTask(const glossa::Params& p) : BaseTask(p) {
    emb_ = CreateChild<glossa::EmbeddingLayer>("emb", p.GetParams("emb"));
    enc_ = CreateChild<glossa::TransformerStack>("enc", p.GetParams("enc"));
    softmax_ = CreateChild<glossa::SimpleFullSoftmax>("softmax", p.GetParams("softmax"));
  }

  NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const override {
    at::Tensor x = emb_->FProp(emb_.Theta(theta), batch.GetTensor("ids"));
    x = enc_->FProp(enc_.Theta(theta), x, batch.GetTensor("paddings"));
    return NestedMap{{"encoded", x}};
  }

  LossOutput ComputeLoss(const NestedMap& theta, const NestedMap& predictions,
                         const NestedMap& batch) const override {
    NestedMap xent = softmax_->FProp(softmax_.Theta(theta), predictions.GetTensor("encoded"),
                                     batch.GetTensor("tags"), {}, batch.GetTensor("paddings"));
    LossOutput out;
    out.metrics["loss"] = glossa::Metric{xent.GetTensor("avg_xent"), xent.GetTensor("total_weight")};
    return out;
  }

 private:
  glossa::Child<glossa::EmbeddingLayer> emb_;
  glossa::Child<glossa::TransformerStack> enc_;
  glossa::Child<glossa::SimpleFullSoftmax> softmax_;
};
GLOSSA_REGISTER_CLASS(TaggerTask, "example.TaggerTask");

TEST(DocsExample, TaggerTaskComposesTrainsAndOverridesDeepFields) {
  glossa::Params p = TaggerTask::Params();
  p.FromText(R"(
    name : 'tagger'
    random_seed : 1
    emb.vocab_size : 10
    emb.embedding_dim : 8
    enc.num_layers : 2
    enc.mdl_dim : 8
    enc.num_atten_heads : 2
    enc.hidden_dim : 16
    enc.transformer_layer_params_tpl.tr_fflayer_tpl.activation : 'GELU'
    softmax.input_dim : 8
    softmax.num_classes : 3
    train.learner.learning_rate : 0.01
  )");
  p.Set("train.learner.lr_schedule", glossa::ConstantSchedule::Params());
  auto task = glossa::InstantiateLayer<TaggerTask>(p);
  EXPECT_EQ(task->GetDescendant("enc.x_layers[1].fflayer.fc0").params().GetString("activation"),
            "GELU");

  // Tag = token id mod 3.
  at::Tensor ids = at::randint(0, 10, {4, 6}, at::kLong);
  NestedMap batch{{"ids", ids}, {"tags", ids.remainder(3)}, {"paddings", at::zeros({4, 6})}};
  const auto vars = glossa::LearnerVariables(*task);
  double first = 0, last = 0;
  for (int64_t step = 0; step < 30; ++step) {
    auto r = task->FPropDefaultTheta(batch);
    (step == 0 ? first : last) = r.loss.item<double>();
    task->learner().Apply({{"loss", glossa::Metric{r.loss, r.metrics.at("loss").weight}}}, vars,
                          step);
  }
  EXPECT_LT(last, first * 0.5);
}

}  // namespace example
