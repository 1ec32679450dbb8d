#include "glossa/model/base_task.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "glossa/layers/linear.h"
#include "glossa/model/model_registry.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// y = x·w: predictions from a projection, loss = mean squared error with weight = batch size.
class RegressionTask : public BaseTask {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseTask::Params();
    p.Set("cls", ClsOf<RegressionTask>());
    p.Define("proj",
             ProjectionLayer::Params()
                 .Set("input_dim", 2)
                 .Set("output_dim", 1)
                 .Set("activation", "NONE"),
             "The projection.");
    return p;
  }
  explicit RegressionTask(const glossa::Params& p) : BaseTask(p) {
    CreateChild("proj", params().GetParams("proj"));
  }
  NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const override {
    return NestedMap{{"y", GetChildAs<ProjectionLayer>("proj").FProp(theta.at("proj").AsMap(),
                                                                     batch.GetTensor("x"))}};
  }
  LossOutput ComputeLoss(const NestedMap&, const NestedMap& preds,
                         const NestedMap& batch) const override {
    at::Tensor err = (preds.GetTensor("y") - batch.GetTensor("y")).square().squeeze(-1);
    const double n = static_cast<double>(err.size(0));
    LossOutput out;
    out.metrics["loss"] = Metric{err.mean(), at::full({}, n)};
    out.metrics["max_err"] = Metric{err.max().detach(), at::full({}, n)};
    out.per_example = NestedMap{{"err", err.detach()}};
    return out;
  }
};
GLOSSA_REGISTER_CLASS(RegressionTask, "glossa.testing.RegressionTask");

class RegressionModel : public ModelParamsBase {
 public:
  glossa::Params Task() const override {
    glossa::Params p = RegressionTask::Params();
    p.Set("train.learner.learning_rate", 0.1);
    return p;
  }
  std::map<std::string, std::function<glossa::Params()>> Datasets() const override {
    return {{"Train",
             [] { return DatasetInput::ParamsFor("glossa.input.Range").Set("name", "input"); }},
            {"Dev", [] {
               return DatasetInput::ParamsFor("glossa.input.Range")
                   .Set("name", "input")
                   .Set("args.end", 3);
             }}};
  }
};
GLOSSA_REGISTER_MODEL(RegressionModel, "test.regression.RegressionModel");

glossa::Params Task(int64_t splits) {
  glossa::Params p = RegressionTask::Params();
  p.Set("name", "reg")
      .Set("random_seed", 1)
      .Set("num_splits", splits)
      .Set("dtype", DType::kFloat64);
  return p;
}

NestedMap Batch() {
  at::Tensor x = at::arange(8, at::kDouble).view({4, 2}) / 8;
  return NestedMap{{"x", x}, {"y", x.sum(1, true)}};
}

TEST(BaseTask, ParamsCarryLingvosTrainAndEvalFields) {
  glossa::Params p = BaseTask::Params();
  for (const char* key : {"train.max_steps",
                          "train.steps_per_loop",
                          "train.learner",
                          "train.save_interval_steps",
                          "train.save_interval_seconds",
                          "train.save_max_to_keep",
                          "train.save_keep_checkpoint_every_n_hours",
                          "train.summary_interval_steps",
                          "train.ema_decay",
                          "train.init_from_checkpoint_rules",
                          "eval.samples_per_summary",
                          "eval.decoder_samples_per_summary",
                          "eval.load_checkpoint_from",
                          "eval.eval_all_checkpoints",
                          "eval.decode_all_checkpoints",
                          "eval.start_eval_after",
                          "input",
                          "encoder",
                          "decoder",
                          "num_splits"}) {
    EXPECT_NO_THROW(p.Get(key)) << key;
    EXPECT_FALSE(p.Doc(key).empty()) << key;
  }
}

TEST(BaseTask, TowersCombineMetricsByWeightAndSumLosses) {
  auto one = InstantiateLayer<RegressionTask>(Task(1));
  auto two = InstantiateLayer<RegressionTask>(Task(2));
  BaseTask::FPropResult a = one->FPropDefaultTheta(Batch());
  BaseTask::FPropResult b = two->FPropDefaultTheta(Batch());
  // Equal-weight towers: the weighted mean of the tower means is the batch mean.
  EXPECT_NEAR(a.metrics.at("loss").value.item<double>(), b.metrics.at("loss").value.item<double>(),
              1e-12);
  EXPECT_DOUBLE_EQ(b.metrics.at("loss").weight.item<double>(), 4.0);
  EXPECT_DOUBLE_EQ(b.metrics.at("num_samples_in_batch").value.item<double>(), 4.0);
  // The loss for gradients is the sum of the two tower losses.
  auto towers = BaseInputGenerator::SplitInputBatch(Batch(), 2);
  double sum = 0;
  for (const auto& t : towers) sum += one->FPropDefaultTheta(t).loss.item<double>();
  EXPECT_NEAR(b.loss.item<double>(), sum, 1e-12);
  EXPECT_EQ(b.per_example.GetTensor("err").numel(), 4);
  EXPECT_TRUE(b.loss.requires_grad());
  auto three = InstantiateLayer<RegressionTask>(Task(3));
  EXPECT_ERROR_CONTAINS(three->FPropDefaultTheta(Batch()), InvalidArgumentError,
                        "does not divide into 3");
}

TEST(BaseTask, CombineMetricsIsAWeightedAverage) {
  Metrics t1 = {{"acc", Metric{at::full({}, 1.0), at::full({}, 3.0)}}};
  Metrics t2 = {{"acc", Metric{at::full({}, 0.0), at::full({}, 1.0)}}};
  Metrics m = CombineMetrics({t1, t2});
  EXPECT_DOUBLE_EQ(m.at("acc").value.item<double>(), 0.75);
  EXPECT_DOUBLE_EQ(m.at("acc").weight.item<double>(), 4.0);
  EXPECT_THROW(CombineMetrics({t1, Metrics{}}), InvalidArgumentError);
}

TEST(BaseTask, LearnerFromTrainParamsTrainsTheTask) {
  glossa::Params p = Task(2);
  p.Set("train.learner.learning_rate", 0.05)
      .Set("train.learner.lr_schedule", ConstantSchedule::Params());
  auto task = InstantiateLayer<RegressionTask>(p);
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    auto r = task->FPropDefaultTheta(Batch());
    if (step == 0) first = r.metrics.at("loss").value.item<double>();
    last = r.metrics.at("loss").value.item<double>();
    task->learner().Apply({{"loss", {r.loss, r.metrics.at("loss").weight}}},
                          LearnerVariables(*task), step);
  }
  EXPECT_LT(last, first * 0.1);
}

TEST(ModelRegistry, GetModelParamsAppliesDatasetsAndOverrides) {
  Params p = GetModelParams("test.regression.RegressionModel", "Dev",
                            "task.train.max_steps : 7; task.num_splits : 2");
  EXPECT_EQ(p.ClsKey(), "glossa.model.SingleTaskModel");
  EXPECT_EQ(p.GetInt("task.train.max_steps"), 7);
  EXPECT_EQ(p.GetInt("task.num_splits"), 2);
  EXPECT_EQ(p.GetInt("task.input.args.end"), 3);
  EXPECT_DOUBLE_EQ(p.GetFloat("task.train.learner.learning_rate"), 0.1);
  auto model = InstantiateLayer<SingleTaskModel>(p.Set("task.dtype", DType::kFloat64));
  EXPECT_EQ(model->task().input().GetPreprocessedInputBatch().GetTensor("value").item<int64_t>(),
            0);
  const std::string file = (::glossa::testing::TestRoot() / "override.txt")
                               .string();
  std::ofstream(file) << "# an override file\ntask.train.max_steps : 9\n";
  EXPECT_EQ(GetModelParams("test.regression.RegressionModel", "Train", "", file)
                .GetInt("task.train.max_steps"),
            9);
  EXPECT_ERROR_CONTAINS(GetModelParams("test.regression.RegressionModel", "Train", "a : 1", file),
                        InvalidArgumentError, "not both");
  EXPECT_ERROR_CONTAINS(GetModelParams("test.regression.RegresionModel", "Train"), NotFoundError,
                        "did you mean: [test.regression.RegressionModel]");
  EXPECT_ERROR_CONTAINS(GetModelParams("test.regression.RegressionModel", "Tran"), NotFoundError,
                        "has no dataset Tran");
  EXPECT_ERROR_CONTAINS(
      GetModelParams("test.regression.RegressionModel", "Train", "task.train.max_stepz : 1"),
      NotFoundError,
      "--model_params_override: params text line 1: task.train.max_stepz (did you mean: "
      "[max_consecutive_skipped_steps,max_skipped_steps_fraction,max_steps])");
  EXPECT_THROW(RegisterModel("two.parts", [] { return std::make_unique<RegressionModel>(); }),
               InvalidArgumentError);
}

}  // namespace
}  // namespace glossa
