// docs/tutorial.md §5, "Write your own model": the file it shows is the part of this file above
// the test, verbatim (tests/tools/docs_test.py checks that every C++ block of the docs is a
// slice of a compiled file under docs/examples/). Compiled into the test binary.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "glossa/input/input_generator.h"
#include "glossa/layers/linear.h"
#include "glossa/model/base_task.h"
#include "glossa/model/model_registry.h"
#include "glossa/runtime/executor.h"
#include "glossa/runtime/jobs.h"

// The data: batches of points (x, y) near the line y = 3x + 1, `num_batches` of them (0: forever).
class LineData : public glossa::Dataset {
 public:
  LineData(int64_t batch_size, int64_t num_batches, int64_t seed)
      : batch_size_(batch_size), num_batches_(num_batches),
        gen_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  glossa::NestedMap Next() override {
    if (num_batches_ > 0 && produced_++ == num_batches_) {
      throw glossa::OutOfRangeError("end of data: LineData produced every batch");
    }
    at::Tensor x = at::empty({batch_size_, 1}).uniform_(-1, 1, gen_);
    at::Tensor y = 3 * x + 1 + 0.01 * at::normal(0, 1, {batch_size_, 1}, gen_);
    return {{"x", x}, {"y", y}};
  }

 private:
  int64_t batch_size_, num_batches_, produced_ = 0;
  at::Generator gen_;
};

// Registered as a dataset function: its arguments become the input's Params (p.args), except
// batch_size, which is the input generator's own batch_size (map_args).
[[maybe_unused]] const bool kLineDataRegistered = [] {
  glossa::RegisterDatasetFn(
      "my.LineData",
      {{"batch_size", std::nullopt, "Examples per batch."},
       {"num_batches", glossa::ParamValue(0), "Batches before the end of data; 0: forever."},
       {"seed", glossa::ParamValue(1), "Random seed of the points."}},
      [](const glossa::Params& args) {
        return std::make_unique<LineData>(args.GetInt("batch_size"), args.GetInt("num_batches"),
                                          args.GetInt("seed"));
      },
      "Noisy points on the line y = 3x + 1.", {.map_args = {{"batch_size", "batch_size"}}});
  return true;
}();

class RegressionTask : public glossa::BaseTask {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseTask::Params();
    p.Set("cls", glossa::ClsOf<RegressionTask>());
    p.Define("proj", glossa::FCLayer::Params().Set("input_dim", 1).Set("output_dim", 1)
                         .Set("activation", "NONE"), "The linear map.");
    return p;
  }
  explicit RegressionTask(const glossa::Params& p) : BaseTask(p) {
    proj_ = CreateChild<glossa::FCLayer>("proj", p.GetParams("proj"));
  }
  glossa::NestedMap ComputePredictions(const glossa::NestedMap& theta,
                                       const glossa::NestedMap& batch) const override {
    return {{"y", proj_->FProp(proj_.Theta(theta), batch.GetTensor("x"))}};
  }
  LossOutput ComputeLoss(const glossa::NestedMap&, const glossa::NestedMap& preds,
                         const glossa::NestedMap& batch) const override {
    LossOutput out;   // metrics: name -> (value, weight); "loss" is what the learner minimizes
    out.metrics["loss"] = {(preds.GetTensor("y") - batch.GetTensor("y")).square().mean(),
                           at::full({}, double(batch.GetTensor("x").size(0)))};
    return out;
  }

 private:
  glossa::Child<glossa::FCLayer> proj_;
};
GLOSSA_REGISTER_CLASS(RegressionTask, "my.RegressionTask");

class LineModel : public glossa::ModelParamsBase {
 public:
  glossa::Params Task() const override {
    glossa::Params p = RegressionTask::Params();
    p.Set("name", "line");
    p.Set("train.max_steps", 1000).Set("train.learner.learning_rate", 0.05);
    return p;
  }
  std::map<std::string, std::function<glossa::Params()>> Datasets() const override {
    auto line_data = [](int64_t num_batches, int64_t seed) {
      glossa::Params p = glossa::DatasetInput::ParamsFor("my.LineData");
      p.Set("name", "input").Set("batch_size", 32);
      p.Set("args.num_batches", num_batches).Set("args.seed", seed);
      return p;
    };
    return {{"Train", [=] { return line_data(0, 1); }},   // forever
            {"Dev", [=] { return line_data(8, 2); }}};    // 8 batches, other points
  }
};
GLOSSA_REGISTER_MODEL(LineModel, "regression.toy.LineModel");

// Trains the model in `logdir`, then evaluates its last checkpoint on Dev (in <logdir>/eval_dev/).
// `overrides` are --model_params_override text.
void TrainAndEvaluate(const std::string& logdir, const std::string& overrides = "") {
  glossa::ExecutorOptions o;
  o.logdir = logdir;
  glossa::Executor(glossa::GetModelParams("regression.toy.LineModel", "Train", overrides), o).Run();
  glossa::JobOptions e;
  e.logdir = logdir;
  e.dataset = "Dev";
  glossa::RunCheckpointJob(glossa::JobKind::kEval,
                           glossa::GetModelParams("regression.toy.LineModel", "Dev", overrides), e);
}

// ---- end of the part docs/tutorial.md shows; tests follow ----

#include <gtest/gtest.h>

#include "glossa/base/file.h"
#include "glossa/io/safetensors.h"
#include "tests/test_util.h"

namespace {

TEST(DocsExample, TutorialLineModelTrainsAndEvaluates) {
  const std::string logdir = glossa::testing::TempDir("tutorial_line");
  TrainAndEvaluate(logdir, "task.train.max_steps : 200; task.train.steps_per_loop : 50");
  // The line was learned: w near 3, b near 1, and the Dev loss near the noise's variance.
  const auto ckpt =
      glossa::LoadSafetensors(glossa::JoinPath(logdir, "train/ckpt-00000200.safetensors"));
  // Variables are named <model>/<task>/...: "regression/line/proj/w".
  EXPECT_NEAR(ckpt.tensors.at("regression/line/proj/w").item<double>(), 3.0, 0.1);
  EXPECT_NEAR(ckpt.tensors.at("regression/line/proj/b").item<double>(), 1.0, 0.1);
  const std::string score =
      glossa::ReadFileToString(glossa::JoinPath(logdir, "eval_dev/score-00000200.txt"));
  const size_t at = score.find("loss: ");
  ASSERT_NE(at, std::string::npos) << score;
  EXPECT_LT(std::stod(score.substr(at + 6)), 0.01) << score;
}

TEST(DocsExample, AnEmptyTrainingBatchIsAnErrorNotADivergence) {
  // The tutorial's first version left batch_size at its default, 0: every batch was empty and the
  // run ended as "training diverged". It must say the batch is empty and why.
  const std::string logdir = glossa::testing::TempDir("tutorial_line_empty");
  glossa::ExecutorOptions o;
  o.logdir = logdir;
  try {
    glossa::Executor(glossa::GetModelParams("regression.toy.LineModel", "Train",
                                            "task.input.batch_size : 0; task.train.max_steps : 5"),
                     o)
        .Run();
    FAIL() << "an empty batch trained";
  } catch (const glossa::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("batch_size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("0"), std::string::npos) << e.what();
  }
}

}  // namespace
