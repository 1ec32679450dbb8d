// Summaries end to end: what layers record with summary::Scalar / Tensor / PerExampleTensor during
// FProp reaches the train, eval and decode programs' event files and metrics.jsonl, reduced over
// each program's loop, and per-example tensors reach the outfeed and the decode output.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/io/event_file.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/moe.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/runtime/executor.h"
#include "glossa/runtime/program.h"
#include "glossa/summary/summary.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

std::string LogDir(const std::string& name) {
  fs::path dir =
      ::glossa::testing::TestRoot() / "summaries" / name;
  fs::remove_all(dir);
  return dir.string();
}

// Every event of every event file in `dir`, and every metrics.jsonl line.
std::vector<EventRecord> Events(const std::string& dir) {
  std::vector<EventRecord> out;
  for (const auto& f : ListDirectory(dir)) {
    if (f.rfind("events.out.tfevents.", 0) != 0) continue;
    for (auto& e : ReadEvents(JoinPath(dir, f))) out.push_back(std::move(e));
  }
  return out;
}
std::vector<nlohmann::json> MetricsLog(const std::string& dir) {
  std::vector<nlohmann::json> out;
  for (const auto& line : Split(ReadFileToString(JoinPath(dir, "metrics.jsonl")), '\n')) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(std::string(line)));
  }
  return out;
}
// tag -> {step -> value} of the scalar events.
std::map<std::string, std::map<int64_t, double>> Scalars(const std::vector<EventRecord>& events) {
  std::map<std::string, std::map<int64_t, double>> out;
  for (const auto& e : events) {
    if (e.kind == EventRecord::Kind::kScalar) out[e.tag][e.step] = e.value;
  }
  return out;
}

// Token batches [4, 8] over a vocabulary of 16 that depend only on the global step.
class TokenDataset : public Dataset {
 public:
  NestedMap Next() override {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(77 + GetGlobalStep());
    at::Tensor ids = at::randint(3, 16, {4, 8}, gen, at::TensorOptions().dtype(at::kLong));
    return NestedMap{{"ids", ids}, {"labels", ids.roll(-1, 1)}, {"paddings", at::zeros({4, 8})}};
  }
};

// y = 3x - 1 on x [8, 1] drawn from the global step.
class LineDataset : public Dataset {
 public:
  NestedMap Next() override {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 + GetGlobalStep());
    at::Tensor x = at::empty({8, 1}).uniform_(-1, 1, gen);
    return NestedMap{{"x", x}, {"y", 3 * x - 1}};
  }
};

// x = 0, 1, 2, ... (one value per batch, [2, 1]): eval loops see known values.
class CounterDataset : public Dataset {
 public:
  NestedMap Next() override {
    at::Tensor x = at::full({2, 1}, static_cast<double>(next_++), at::kFloat);
    return NestedMap{{"x", x}, {"y", 2 * x}};
  }

 private:
  int64_t next_ = 0;
};

[[maybe_unused]] const bool kRegistered = [] {
  RegisterDatasetFn("test.summaries.Tokens", {},
                    [](const Params&) { return std::make_unique<TokenDataset>(); });
  RegisterDatasetFn("test.summaries.Line", {},
                    [](const Params&) { return std::make_unique<LineDataset>(); });
  RegisterDatasetFn("test.summaries.Counter", {},
                    [](const Params&) { return std::make_unique<CounterDataset>(); });
  return true;
}();

// A tiny MoE language model: two Transformer layers, both with a 2-expert MoE feed-forward.
class MoeLm : public ModelParamsBase {
 public:
  glossa::Params Task() const override {
    glossa::Params p = TransformerLmTask::CommonParams(/*vocab_size=*/16, /*model_dim=*/8,
                                                       /*hidden_dim=*/16, /*num_heads=*/2,
                                                       /*num_layers=*/2);
    p.Set("name", "lm").Set("random_seed", 3);
    p.Set("stack.transformer_layer_params_tpl.tr_fflayer_tpl",
          TransformerShardedMoeLayer::Params()
              .Set("hidden_dim", 16)
              .Set("num_experts", 2)
              .Set("num_groups", 1)
              .Set("expert_capacity_factor", 1.0));
    p.FromText(
        "train.max_steps : 4\ntrain.steps_per_loop : 2\ntrain.summary_interval_steps : 2\n"
        "train.save_interval_steps : 4\ntrain.async_checkpointing : False\n"
        "train.learner.learning_rate : 0.01\n");
    return p;
  }
  std::map<std::string, std::function<glossa::Params()>> Datasets() const override {
    return {{"Train",
             [] { return DatasetInput::ParamsFor("test.summaries.Tokens").Set("name", "input"); }}};
  }
};
GLOSSA_REGISTER_MODEL(MoeLm, "test.summaries.MoeLm");

TEST(TrainSummaries, MoeOverCapacityScalarsReachTheEventsAndMetricsLog) {
  const std::string logdir = LogDir("moe");
  Executor(GetModelParams("test.summaries.MoeLm", "Train"),
           {.logdir = logdir, .log = [](const std::string&) {}})
      .Run();
  const auto scalars = Scalars(Events(logdir + "/train"));
  // Each MoE layer records under its own scope (the layer's path).
  for (const char* layer : {"x_layers_0", "x_layers_1"}) {
    const std::string scope = StrCat("/test.lm.stack.", layer, ".fflayer");
    for (const char* name : {"over_capacity_1_ratio", "over_capacity_2_ratio"}) {
      const std::string tag = name + scope;
      ASSERT_TRUE(scalars.count(tag)) << tag;
      // Written once per train loop (two steps each), at the loop's last step.
      ASSERT_EQ(scalars.at(tag).size(), 2u) << tag;
      for (const auto& [step, v] : scalars.at(tag)) {
        EXPECT_TRUE(step == 2 || step == 4) << tag << " at " << step;
        EXPECT_GE(v, 0.0) << tag;
        EXPECT_LE(v, 1.0) << tag;
      }
    }
    // 32 tokens per group, 2 experts, capacity factor 1 (doubled for top-2 routing): 32 slots.
    const std::string capacity = "expert_capacity" + scope;
    ASSERT_TRUE(scalars.count(capacity)) << capacity;
    EXPECT_EQ(scalars.at(capacity), (std::map<int64_t, double>{{2, 32.0}, {4, 32.0}}));
  }
  // The same values in metrics.jsonl.
  const std::string tag = "over_capacity_1_ratio/test.lm.stack.x_layers_1.fflayer";
  std::map<int64_t, double> logged;
  for (const auto& j : MetricsLog(logdir + "/train")) {
    if (j.at("tag") == tag) logged[j.at("step")] = j.at("value");
  }
  EXPECT_EQ(logged, scalars.at(tag));
}

// A line fit y = 3x - 1 whose layer records summaries of every kind from inside ComputePredictions
// (scoped "probe"), and whose decode output reports whether a per-example summary reached it.
class ProbeTask : public BaseTask {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseTask::Params();
    p.Set("cls", ClsOf<ProbeTask>());
    p.Define("proj",
             FCLayer::Params().Set("input_dim", 1).Set("output_dim", 1).Set("activation", "NONE"),
             "");
    return p;
  }
  explicit ProbeTask(const glossa::Params& p) : BaseTask(p) {
    CreateChild("proj", params().GetParams("proj"));
  }
  NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const override {
    const at::Tensor x = batch.GetTensor("x");
    at::Tensor y = GetChildAs<FCLayer>("proj").FProp(theta.at("proj").AsMap(), x);
    SummaryNameScope scope("probe");
    summary::Scalar("global_step", static_cast<double>(GetGlobalStep()));
    summary::Scalar("batches", 1.0, SummaryReduce::kSum);
    summary::Scalar("x_first", x[0][0]);
    summary::Tensor("predictions", y);
    summary::PerExampleTensor("abs_x", x.abs().squeeze(1));
    summary::AddTpuSummaryTensor("x_mean", x.mean(), static_cast<double>(x.size(0)));
    return NestedMap{{"y", y}};
  }
  LossOutput ComputeLoss(const NestedMap&, const NestedMap& preds,
                         const NestedMap& batch) const override {
    LossOutput out;
    out.metrics["loss"] = Metric{(preds.GetTensor("y") - batch.GetTensor("y")).square().mean(),
                                 at::full({}, static_cast<double>(batch.GetTensor("x").size(0)))};
    return out;
  }
  void ProcessFPropResults(int64_t, const std::map<std::string, std::pair<double, double>>&,
                           const std::vector<NestedMap>& per_example) override {
    for (const auto& m : per_example) outfeed.push_back(m);
  }
  std::vector<NestedMap> outfeed;
  NestedMap Decode(const NestedMap& batch) override {
    return NestedMap{{"y", ComputePredictions(theta(), batch).GetTensor("y")}};
  }
  std::map<std::string, double> CreateDecoderMetrics() const override {
    return {{"per_example_summaries_seen", 0}};
  }
  std::vector<std::string> PostProcessDecodeOut(const NestedMap& out,
                                                std::map<std::string, double>& m) override {
    if (out.Has("probe__abs_x")) m["per_example_summaries_seen"] += 1;
    return {"decoded"};
  }
};
GLOSSA_REGISTER_CLASS(ProbeTask, "glossa.testing.ProbeTask");

class ProbeModel : public ModelParamsBase {
 public:
  glossa::Params Task() const override {
    glossa::Params p = ProbeTask::Params();
    p.Set("random_seed", 5);
    p.FromText(
        "train.max_steps : 10\ntrain.steps_per_loop : 5\ntrain.summary_interval_steps : 5\n"
        "train.save_interval_steps : 10\ntrain.async_checkpointing : False\n"
        "train.learner.learning_rate : 0.01\n");
    return p;
  }
  std::map<std::string, std::function<glossa::Params()>> Datasets() const override {
    return {{"Train",
             [] { return DatasetInput::ParamsFor("test.summaries.Line").Set("name", "input"); }},
            {"Count", [] {
               return DatasetInput::ParamsFor("test.summaries.Counter").Set("name", "input");
             }}};
  }
};
GLOSSA_REGISTER_MODEL(ProbeModel, "test.summaries.ProbeModel");

TEST(TrainSummaries, AUserLayersSummariesAreReducedOverEachTrainLoop) {
  const std::string logdir = LogDir("probe");
  Executor(GetModelParams("test.summaries.ProbeModel", "Train"),
           {.logdir = logdir, .log = [](const std::string&) {}})
      .Run();
  const std::vector<EventRecord> events = Events(logdir + "/train");
  const auto scalars = Scalars(events);
  // Steps 0..4 in the first loop, 5..9 in the second: the mean, and the sum of ones.
  ASSERT_TRUE(scalars.count("global_step/probe"));
  EXPECT_EQ(scalars.at("global_step/probe"), (std::map<int64_t, double>{{5, 2.0}, {10, 7.0}}));
  ASSERT_TRUE(scalars.count("batches/probe"));
  EXPECT_EQ(scalars.at("batches/probe"), (std::map<int64_t, double>{{5, 5.0}, {10, 5.0}}));
  // The tensor summary, stacked over the loop's 5 steps of 8 predictions: a histogram of 40.
  int histograms = 0;
  for (const auto& e : events) {
    if (e.kind != EventRecord::Kind::kHistogram || e.tag != "predictions/probe") continue;
    EXPECT_EQ(e.histogram_count, 40.0);
    ++histograms;
  }
  EXPECT_EQ(histograms, 2);
  // The per-example summary (8 values a step) is also written: a histogram of the loop's 40.
  std::vector<double> per_example_counts;
  for (const auto& e : events) {
    if (e.kind == EventRecord::Kind::kHistogram && e.tag == "probe__abs_x")
      per_example_counts.push_back(e.histogram_count);
  }
  EXPECT_EQ(per_example_counts, (std::vector<double>{40.0, 40.0}));
  std::set<std::string> logged;
  for (const auto& j : MetricsLog(logdir + "/train")) logged.insert(j.at("tag"));
  EXPECT_TRUE(logged.count("global_step/probe"));
}

TEST(TrainSummaries, PerExampleSummariesJoinTheOutfeed) {
  auto model = InstantiateLayer<BaseModel>(GetModelParams("test.summaries.ProbeModel", "Train"));
  TrainProgram train(*model, nullptr, nullptr);
  int64_t step = 0;
  train.RunLoop(&step);
  const auto& outfeed = dynamic_cast<ProbeTask&>(model->task()).outfeed;
  ASSERT_EQ(outfeed.size(), 5u);  // one per step
  for (const auto& m : outfeed) {
    ASSERT_TRUE(m.Has("probe__abs_x"));
    EXPECT_EQ(m.GetTensor("probe__abs_x").sizes(), (std::vector<int64_t>{8}));
  }
}

TEST(TrainSummaries, TpuSummaryTensorsBecomeWeightedTaskMetrics) {
  auto model = InstantiateLayer<BaseModel>(GetModelParams("test.summaries.ProbeModel", "Train",
                                                          "task.num_splits : 2"));
  const NestedMap batch = model->task().input().GetPreprocessedInputBatch();
  const BaseTask::FPropResult r = model->task().FPropDefaultTheta(batch);
  // Two towers of 4: the weighted mean of their means is the batch mean, with weight 8.
  ASSERT_TRUE(r.metrics.count("x_mean/probe"));
  EXPECT_NEAR(r.metrics.at("x_mean/probe").value.item<double>(),
              batch.GetTensor("x").mean().item<double>(), 1e-6);
  EXPECT_EQ(r.metrics.at("x_mean/probe").weight.item<double>(), 8.0);
}

TEST(EvalSummaries, EvalReducesSummariesOverItsBatches) {
  const std::string dir = LogDir("eval");
  auto model = InstantiateLayer<BaseModel>(GetModelParams("test.summaries.ProbeModel", "Count"));
  {
    EventWriter writer(dir);
    EvalProgram(*model, &writer).Run(/*global_step=*/7, /*max_batches=*/4);
  }
  const std::vector<EventRecord> events = Events(dir);
  const auto scalars = Scalars(events);
  // Batches x = 0, 1, 2, 3: the mean of x_first and the count of batches, at the eval's step.
  ASSERT_TRUE(scalars.count("x_first/probe"));
  EXPECT_EQ(scalars.at("x_first/probe"), (std::map<int64_t, double>{{7, 1.5}}));
  EXPECT_EQ(scalars.at("batches/probe"), (std::map<int64_t, double>{{7, 4.0}}));
  // Eval has no outfeed: per-example summaries become a histogram of all 8 values.
  bool per_example = false;
  for (const auto& e : events) {
    if (e.kind == EventRecord::Kind::kHistogram && e.tag == "probe__abs_x") {
      per_example = true;
      EXPECT_EQ(e.histogram_count, 8.0);
    }
  }
  EXPECT_TRUE(per_example);
}

TEST(EvalSummaries, TrainerEvalAndDecodeProgramsWriteTheirSummaries) {
  const std::string logdir = LogDir("trainer_programs");
  const std::string sched =
      "program_schedule.eval_dataset_names : ['Count']\n"
      "program_schedule.eval_steps_per_loop : 3\nprogram_schedule.decode_steps_per_loop : 2\n";
  ExecutorOptions o;
  o.logdir = logdir;
  o.log = [](const std::string&) {};
  o.dataset_params["Count"] = GetModelParams("test.summaries.ProbeModel", "Count", sched);
  Executor(GetModelParams("test.summaries.ProbeModel", "Train", sched), o).Run();
  const auto eval = Scalars(Events(logdir + "/eval_count"));
  ASSERT_TRUE(eval.count("batches/probe"));
  EXPECT_EQ(eval.at("batches/probe"), (std::map<int64_t, double>{{5, 3.0}, {10, 3.0}}));
  const auto decode = Scalars(Events(logdir + "/decoder_count"));
  ASSERT_TRUE(decode.count("batches/probe"));
  EXPECT_EQ(decode.at("batches/probe"), (std::map<int64_t, double>{{5, 2.0}, {10, 2.0}}));
  // Each decoded batch's output carried the per-example summary to PostProcessDecodeOut.
  ASSERT_TRUE(decode.count("per_example_summaries_seen"));
  EXPECT_EQ(decode.at("per_example_summaries_seen").at(10), 2.0);
}

}  // namespace
}  // namespace glossa
