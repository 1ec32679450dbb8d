#include "glossa/runtime/executor.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/io/event_file.h"
#include "glossa/layers/linear.h"
#include "glossa/model/model_registry.h"
#include "glossa/runtime/jobs.h"
#include "glossa/model/metric_history.h"
#include "glossa/runtime/program.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

// Batches that depend only on the global step, so a resumed run sees what an uninterrupted one
// does.
class StepLineDataset : public Dataset {
 public:
  NestedMap Next() override {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 + GetGlobalStep());
    at::Tensor x = at::empty({8, 1}).uniform_(-1, 1, gen);
    return NestedMap{{"x", x}, {"y", 3 * x - 1}};
  }
};

// The same batch every time: a multi-task model's inputs are consumed at different rates, so a
// step-keyed stream (prefetched ahead) would differ between a resumed and an uninterrupted run.
class FixedLineDataset : public Dataset {
 public:
  NestedMap Next() override {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000);
    at::Tensor x = at::empty({8, 1}).uniform_(-1, 1, gen);
    return NestedMap{{"x", x}, {"y", 3 * x - 1}};
  }
};

// Batches with no rows (a filter that dropped everything, a batch size of 0 inside the function).
class EmptyLineDataset : public Dataset {
 public:
  NestedMap Next() override { return NestedMap{{"x", at::zeros({0, 1})}, {"y", at::zeros({0, 1})}}; }
};

[[maybe_unused]] const bool kRegistered = [] {
  RegisterDatasetFn("test.FixedLine", {},
                    [](const Params&) { return std::make_unique<FixedLineDataset>(); });
  RegisterDatasetFn("test.StepLine", {},
                    [](const Params&) { return std::make_unique<StepLineDataset>(); });
  RegisterDatasetFn("test.EmptyLine", {},
                    [](const Params&) { return std::make_unique<EmptyLineDataset>(); });
  return true;
}();

class LineTask : public BaseTask {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseTask::Params();
    p.Set("cls", ClsOf<LineTask>());
    p.Define("proj",
             FCLayer::Params().Set("input_dim", 1).Set("output_dim", 1).Set("activation", "NONE"),
             "");
    return p;
  }
  explicit LineTask(const glossa::Params& p) : BaseTask(p) {
    CreateChild("proj", params().GetParams("proj"));
  }
  NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const override {
    return NestedMap{
        {"y", GetChildAs<FCLayer>("proj").FProp(theta.at("proj").AsMap(), batch.GetTensor("x"))}};
  }
  LossOutput ComputeLoss(const NestedMap&, const NestedMap& preds,
                         const NestedMap& batch) const override {
    LossOutput out;
    out.metrics["loss"] =
        Metric{(preds.GetTensor("y") - batch.GetTensor("y")).square().mean(), at::full({}, 8.0)};
    out.per_example.Put("sq_err",
                        (preds.GetTensor("y") - batch.GetTensor("y")).square().squeeze(1));
    return out;
  }
  void ProcessFPropResults(int64_t step,
                           const std::map<std::string, std::pair<double, double>>& metrics,
                           const std::vector<NestedMap>& per_example) override {
    outfeed_log.push_back({step, metrics.at("loss").first, per_example});
  }
  struct OutfeedEntry {
    int64_t step;
    double loss;
    std::vector<NestedMap> per_example;
  };
  std::vector<OutfeedEntry> outfeed_log;
  NestedMap Decode(const NestedMap& batch) override {
    return NestedMap{
        {"err", (ComputePredictions(theta(), batch).GetTensor("y") - batch.GetTensor("y")).abs()}};
  }
  std::map<std::string, double> CreateDecoderMetrics() const override {
    return {{"accuracy", 0}, {"n", 0}};
  }
  std::vector<std::string> PostProcessDecodeOut(const NestedMap& out,
                                                std::map<std::string, double>& m) override {
    const at::Tensor err = out.GetTensor("err");
    m["accuracy"] += (err < 0.05).sum().item<double>();
    m["n"] += static_cast<double>(err.size(0));
    std::vector<std::string> lines;
    for (int64_t i = 0; i < err.size(0); ++i) lines.push_back(PyFloatRepr(err[i].item<double>()));
    return lines;
  }
  void DecodeFinalize(std::map<std::string, double>& m) override {
    m["accuracy"] /= std::max(1.0, m["n"]);
  }
};
GLOSSA_REGISTER_CLASS(LineTask, "glossa.testing.LineTask");

class LineModel : public ModelParamsBase {
 public:
  glossa::Params Task() const override {
    glossa::Params p = LineTask::Params();
    p.Set("random_seed", 5);
    p.FromText(
        "train.max_steps : 20\ntrain.steps_per_loop : 5\ntrain.save_interval_steps : 10\n"
        "train.summary_interval_steps : 5\ntrain.ema_decay : 0.9\ntrain.async_checkpointing : "
        "False\n"
        "train.learner.learning_rate : 0.05\n");
    p.Set("train.learner.lr_schedule", ConstantSchedule::Params());
    return p;
  }
  std::map<std::string, std::function<glossa::Params()>> Datasets() const override {
    return {
        {"Train", [] { return DatasetInput::ParamsFor("test.StepLine").Set("name", "input"); }}};
  }
};
GLOSSA_REGISTER_MODEL(LineModel, "test.line.LineModel");

// Two line tasks trained by one MultiTaskModel, sampled 3:1.
class TwoLineModel : public ModelParamsBase {
 public:
  std::optional<glossa::Params> MultiTaskModelParams() const override {
    glossa::Params p = MultiTaskModel::Params();
    p.Set("random_seed", 11);
    glossa::Params tasks, probs;
    for (const char* name : {"a", "b"}) {
      glossa::Params t = LineModel().Task();
      t.Set("name", name);
      tasks.Define(name, t, "");
      probs.Define(name, std::string(name) == "a" ? 3.0 : 1.0, "");
    }
    p.Set("task_params", tasks);
    p.Set("task_probs", probs);
    return p;
  }
  std::map<std::string, std::function<glossa::Params()>> Datasets() const override {
    return {{"Train", [] {
               glossa::Params in;
               for (const char* name : {"a", "b"}) {
                 in.Define(name, DatasetInput::ParamsFor("test.FixedLine").Set("name", "input"),
                           "");
               }
               return in;
             }}};
  }
};
GLOSSA_REGISTER_MODEL(TwoLineModel, "test.line.TwoLineModel");

std::string LogDir(const std::string& name) {
  fs::path dir = ::glossa::testing::TestRoot() / "exec" / name;
  fs::remove_all(dir);
  return dir.string();
}

TEST(Executor, TrainsSavesAndLaysOutTheLogDirectory) {
  const std::string logdir = LogDir("basic");
  std::vector<std::string> lines;
  Executor ex(GetModelParams("test.line.LineModel", "Train"),
              {.logdir = logdir, .log = [&](const std::string& l) { lines.push_back(l); }});
  EXPECT_EQ(ex.Run(), 20);
  EXPECT_EQ(ReadCheckpointState(logdir + "/train").all_model_checkpoint_paths,
            (std::vector<std::string>{"ckpt-00000010", "ckpt-00000020"}));
  EXPECT_TRUE(FileExists(logdir + "/control/params.txt"));
  EXPECT_NE(ReadFileToString(logdir + "/control/model_analysis.txt").find("total #params: 2"),
            std::string::npos);
  ASSERT_GE(lines.size(), 5u);
  // The first step's line comes before the first loop ends (a long first loop is not silent).
  EXPECT_EQ(lines[0].rfind("step 1/20 (5%) \xC2\xB7 ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(" \xC2\xB7 first step"), std::string::npos) << lines[0];
  // The concise progress line (glossa/base/progress.h).
  EXPECT_EQ(lines[1].rfind("step 5/20 (25%) \xC2\xB7 loss ", 0), 0u) << lines[1];
  EXPECT_NE(lines[1].find(" steps/s \xC2\xB7 elapsed "), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find(" \xC2\xB7 ETA "), std::string::npos) << lines[1];
  // The model sets random_seed: no seed notice.
  for (const auto& l : lines) EXPECT_EQ(l.find("No random_seed"), std::string::npos) << l;
  SafetensorsContents c = LoadLatestCheckpoint(logdir + "/train");
  EXPECT_EQ(c.tensors.at("global_step").item<int64_t>(), 20);
  EXPECT_TRUE(c.tensors.count("test/task/proj/w"));
  EXPECT_TRUE(c.tensors.count("test/task/proj/w/Adam/m"));
  EXPECT_TRUE(c.tensors.count("test/task/proj/w/ExponentialMovingAverage"));
  // Train events hold the loss and the throughput summaries.
  std::vector<std::string> event_files;
  for (const auto& f : ListDirectory(logdir + "/train")) {
    if (f.rfind("events.out.tfevents.", 0) == 0) event_files.push_back(f);
  }
  ASSERT_EQ(event_files.size(), 1u);
  std::set<std::string> tags;
  for (const auto& e : ReadEvents(logdir + "/train/" + event_files[0])) tags.insert(e.tag);
  for (const char* tag : {"loss", "learning_rate", "grad_norm/all", "global_step/sec",
                          "examples/sec", "total_samples", "total_num_params"}) {
    EXPECT_TRUE(tags.count(tag)) << tag;
  }
}

TEST(Executor, AnEmptyBatchIsAnErrorSayingSoNotADivergence) {
  // Without the check, the loss of an empty batch is NaN, every step is skipped, and after
  // max_consecutive_skipped_steps the run ends as "training diverged".
  Params p = GetModelParams("test.line.LineModel", "Train");
  p.Set("task.input", DatasetInput::ParamsFor("test.EmptyLine").Set("name", "input"));
  try {
    Executor(p, {.logdir = LogDir("empty_batch"), .log = [](const std::string&) {}}).Run();
    ADD_FAILURE() << "an empty batch trained";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.message()).find("the training batch at step 0 is empty (every tensor "
                                            "in it has 0 rows; the input's batch_size is 0 (its "
                                            "default is 0: set it))"),
              std::string::npos)
        << e.message();
  } catch (const TrainingDivergedError& e) {
    ADD_FAILURE() << "reported as a divergence: " << e.message();
  }
}

TEST(DecodeProgram, SaysHowFarItIsWhileItDecodes) {
  // With every_seconds 0, a line after each batch (30 s in the jobs): a long decode is not silent.
  auto model = InstantiateLayer<BaseModel>(GetModelParams("test.line.LineModel", "Train"));
  DecodeProgram decode(*model, nullptr);
  std::vector<std::string> lines;
  decode.SetProgressLog([&](const std::string& l) { lines.push_back(l); }, 0);
  EXPECT_EQ(decode.Run(7, 3).batches, 3);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("decoding at step 7: 1 batches, 8 examples, 0:0", 0), 0u) << lines[0];
  EXPECT_EQ(lines[2].rfind("decoding at step 7: 3 batches, 24 examples, ", 0), 0u) << lines[2];
  // Without a log, nothing is said.
  DecodeProgram quiet(*model, nullptr);
  EXPECT_EQ(quiet.Run(7, 2).batches, 2);
}

TEST(Executor, SummaryStepsCarryVarNormWithinALoop) {
  // Summaries every 5 steps inside loops of 10: the learner's var_norm/all pass, skipped on
  // other steps, must run on each summary step (the first after 4 steps, then every 5).
  const std::string logdir = LogDir("var_norm");
  Executor(GetModelParams("test.line.LineModel", "Train", "task.train.steps_per_loop : 10"),
           {.logdir = logdir, .log = [](const std::string&) {}})
      .Run();
  std::map<std::string, std::vector<int64_t>> steps;
  for (const auto& f : ListDirectory(logdir + "/train")) {
    if (f.rfind("events.out.tfevents.", 0) != 0) continue;
    for (const auto& e : ReadEvents(logdir + "/train/" + f)) steps[e.tag].push_back(e.step);
  }
  EXPECT_EQ(steps["var_norm/all"], (std::vector<int64_t>{4, 9, 14, 19}));
  EXPECT_EQ(steps["grad_norm/all"], steps["var_norm/all"]);
}

TEST(Executor, ResumedRunsMatchUninterruptedRunsBitForBit) {
  const std::string a = LogDir("a"), b = LogDir("b"), c = LogDir("c");
  auto quiet = [](const std::string&) {};
  // Whatever step an earlier run in this process ended on, the input of step s sees step s
  // (StepLineDataset keys its batches on it): this test passed only after another run had left
  // the process-wide step at 19, and failed when run alone.
  SetGlobalStep(12345);
  Executor(GetModelParams("test.line.LineModel", "Train"), {.logdir = a, .log = quiet}).Run();
  Executor(GetModelParams("test.line.LineModel", "Train"), {.logdir = b, .log = quiet}).Run();
  // Interrupted at step 10, then resumed to 20.
  Executor(GetModelParams("test.line.LineModel", "Train", "task.train.max_steps : 10"),
           {.logdir = c, .log = quiet})
      .Run();
  Executor resumed(GetModelParams("test.line.LineModel", "Train"), {.logdir = c, .log = quiet});
  EXPECT_EQ(resumed.Run(), 20);
  SafetensorsContents ca = LoadLatestCheckpoint(a + "/train"),
                      cb = LoadLatestCheckpoint(b + "/train"),
                      cc = LoadLatestCheckpoint(c + "/train");
  for (const auto& [name, t] : ca.tensors) {
    EXPECT_TRUE(at::equal(t, cb.tensors.at(name))) << "two runs differ at " << name;
    EXPECT_TRUE(at::equal(t, cc.tensors.at(name))) << "the resumed run differs at " << name;
  }
}

TEST(Executor, StopsCleanlyWhenAsked) {
  const std::string logdir = LogDir("stop");
  Executor* ex_ptr = nullptr;
  int loops = 0;
  Executor ex(GetModelParams("test.line.LineModel", "Train", "task.train.max_steps : 1000"),
              {.logdir = logdir, .log = [&](const std::string&) {
                 if (++loops == 2) ex_ptr->RequestStop();
               }});
  ex_ptr = &ex;
  const int64_t step = ex.Run();
  EXPECT_LT(step, 1000);
  EXPECT_EQ(LoadLatestCheckpoint(logdir + "/train").tensors.at("global_step").item<int64_t>(),
            step);
}

TEST(Executor, OneTrainerPerLogdirAndAKilledRunsLeftoversAreCleaned) {
  const std::string logdir = LogDir("leftovers");
  const std::string train = logdir + "/train";
  CreateDirectories(train);
  // What kill -9 leaves: temporary files of atomic writes and a torn metrics line.
  AtomicWriteFile(train + "/ckpt-00000005.safetensors.tmp.999.0", "half a checkpoint");
  AtomicWriteFile(train + "/checkpoint.tmp.12.3", "half a state file");
  AtomicWriteFile(train + "/keep.tmp.txt", "not ours");
  AtomicWriteFile(train + "/metrics.jsonl",
                  "{\"step\": 1, \"tag\": \"loss\", \"value\": 1.0}\n{\"step\": 2, \"tag\": \"num_samp");
  std::vector<std::string> lines;
  Executor ex(GetModelParams("test.line.LineModel", "Train"),
              {.logdir = logdir, .log = [&](const std::string& l) { lines.push_back(l); }});
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("removed 2 temporary file(s)"), std::string::npos) << lines[0];
  EXPECT_FALSE(FileExists(train + "/ckpt-00000005.safetensors.tmp.999.0"));
  EXPECT_FALSE(FileExists(train + "/checkpoint.tmp.12.3"));
  EXPECT_TRUE(FileExists(train + "/keep.tmp.txt"));
  // A second trainer on the same logdir is refused while the first lives.
  EXPECT_ERROR_CONTAINS(Executor(GetModelParams("test.line.LineModel", "Train"),
                                 {.logdir = logdir, .log = [](const std::string&) {}}),
                        FailedPreconditionError, "is in use by another trainer (pid ");
  ex.Run();
  // Every line of metrics.jsonl parses: the torn one was dropped, not appended onto.
  int n = 0;
  for (const auto& line : Split(ReadFileToString(train + "/metrics.jsonl"), '\n')) {
    if (line.empty()) continue;
    EXPECT_TRUE(nlohmann::json::accept(line)) << line;
    ++n;
  }
  EXPECT_GT(n, 2);
}

TEST(Executor, EveryLoopsLossIsWrittenEvenOffTheSummaryInterval) {
  // 7 steps in loops of 5 with summaries every 100: no step is a summary step, yet both loops'
  // metrics (the means the console line shows) are in metrics.jsonl, at steps 5 and 7.
  const std::string logdir = LogDir("short_run_loss");
  std::vector<std::string> lines;
  Executor(GetModelParams("test.line.LineModel", "Train",
                          "task.train.max_steps : 7\ntask.train.summary_interval_steps : 100"),
           {.logdir = logdir, .log = [&](const std::string& l) { lines.push_back(l); }})
      .Run();
  std::map<int64_t, double> loss;
  int64_t loss_lines = 0;
  for (const auto& line : Split(ReadFileToString(logdir + "/train/metrics.jsonl"), '\n')) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["tag"] == "loss") {
      loss[j["step"].get<int64_t>()] = j["value"].get<double>();
      ++loss_lines;
    }
  }
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_EQ(loss_lines, 2);  // one value per step: none written twice
  ASSERT_TRUE(loss.count(5) && loss.count(7));
  // The values the console printed for those loops.
  int said = 0;
  for (const auto& l : lines) {
    for (const auto& [step, v] : loss) {
      if (l.rfind(StrCat("step ", step, "/7"), 0) != 0) continue;
      const size_t at = l.find("loss ");
      ASSERT_NE(at, std::string::npos) << l;
      // The console rounds to 4 significant digits.
      EXPECT_NEAR(std::stod(l.substr(at + 5)), v, 1e-3 * std::max(1.0, std::fabs(v))) << l;
      ++said;
    }
  }
  EXPECT_EQ(said, 2);
}

TEST(Executor, ADivergedRunFailsAndKeepsItsLastHealthyCheckpoint) {
  const std::string logdir = LogDir("diverged");
  auto quiet = [](const std::string&) {};
  // Healthy training to step 10 (checkpoint 10), then a learning rate that blows up.
  Executor(GetModelParams("test.line.LineModel", "Train", "task.train.max_steps : 10"),
           {.logdir = logdir, .log = quiet})
      .Run();
  const SafetensorsContents good = LoadLatestCheckpoint(logdir + "/train");
  std::vector<std::string> lines;
  Executor ex(GetModelParams("test.line.LineModel", "Train",
                             "task.train.max_steps : 1000\n"
                             "task.train.learner.learning_rate : 1e30\n"
                             "task.train.save_interval_steps : 5\n"
                             "task.train.save_max_to_keep : 2\n"
                             "task.train.max_consecutive_skipped_steps : 30\n"),
              {.logdir = logdir, .log = [&](const std::string& l) { lines.push_back(l); }});
  EXPECT_ERROR_CONTAINS(ex.Run(), AbortedError,
                        "training diverged: 30 consecutive steps were skipped");
  EXPECT_ERROR_CONTAINS(ex.Run(), AbortedError,
                        "The last checkpoint of healthy training is " + logdir +
                            "/train/ckpt-00000010");
  // Retention kept the healthy checkpoint beside the latest two (unhealthy) ones.
  const CheckpointState state = ReadCheckpointState(logdir + "/train");
  ASSERT_EQ(state.all_model_checkpoint_paths.size(), 3u);
  EXPECT_EQ(state.all_model_checkpoint_paths.front(), "ckpt-00000010");
  const SafetensorsContents kept = LoadCheckpoint(logdir + "/train/ckpt-00000010");
  EXPECT_TRUE(at::equal(kept.tensors.at("test/task/proj/w"), good.tensors.at("test/task/proj/w")));
  EXPECT_EQ(LoadLatestCheckpoint(logdir + "/train").metadata.at("healthy"), "false");
  // The progress line and the summaries count the skipped steps.
  bool counted = false;
  for (const auto& l : lines) counted = counted || l.find("skipped 5 steps (") != std::string::npos;
  EXPECT_TRUE(counted);
  EXPECT_NE(ReadFileToString(logdir + "/train/metrics.jsonl").find("\"tag\":\"skipped_steps\""),
            std::string::npos);
}

TEST(Executor, RefusesBadLearningRatesAndStepLimitsBeforeWritingAnything) {
  const std::string logdir = LogDir("limits");
  auto make = [&](const std::string& override_text) {
    return Executor(GetModelParams("test.line.LineModel", "Train", override_text),
                    {.logdir = logdir, .log = [](const std::string&) {}});
  };
  EXPECT_ERROR_CONTAINS(make("task.train.learner.learning_rate : 0.0"), InvalidArgumentError,
                        "train.learner.learning_rate must be finite and > 0, got 0.0");
  EXPECT_ERROR_CONTAINS(make("task.train.learner.learning_rate : -1.0"), InvalidArgumentError,
                        "got -1.0");
  EXPECT_ERROR_CONTAINS(make("task.train.learner.learning_rate : nan"),
                        InvalidArgumentError, "got nan");
  EXPECT_ERROR_CONTAINS(make("task.train.max_steps : 9223372036854775807"), InvalidArgumentError,
                        "train.max_steps must be in [0, 2^53]");
  EXPECT_ERROR_CONTAINS(make("task.train.steps_per_loop : -3"), InvalidArgumentError,
                        "train.steps_per_loop must be in [1, 2^53], got -3");
  EXPECT_ERROR_CONTAINS(make("task.train.steps_per_loop : 9223372036854775807"),
                        InvalidArgumentError, "train.steps_per_loop must be in [1, 2^53]");
  EXPECT_FALSE(fs::exists(logdir)) << "a refused run wrote to its logdir";
}

TEST(MetricsAccumulator, WeightedMeansOverALoop) {
  MetricsAccumulator acc;
  acc.Add({{"loss", Metric{at::full({}, 1.0), at::full({}, 1.0)}}});
  acc.Add({{"loss", Metric{at::full({}, 4.0), at::full({}, 3.0)}}});
  EXPECT_DOUBLE_EQ(acc.Means().at("loss").first, 13.0 / 4.0);
  EXPECT_DOUBLE_EQ(acc.Means().at("loss").second, 4.0);
  EXPECT_EQ(
      FormatStepLine(1200, 3.414, 54.61, {{"loss", {2.31411, 1}}, {"log_pplx", {2.31411, 1}}}),
      "step: 1200, steps/sec: 3.41, examples/sec: 54.6, loss: 2.3141, log_pplx: 2.3141");
}

}  // namespace
}  // namespace glossa

namespace glossa {
namespace {

TEST(Executor, TrainAndDecodeStopsAtTheMlPerfTargetWithMlLogLines) {
  const std::string logdir = LogDir("mlperf");
  std::vector<std::string> lines;
  const std::string sched =
      "program_schedule.eval_dataset_names : ['Train']\nprogram_schedule.eval_steps_per_loop : 1\n"
      "program_schedule.decode_steps_per_loop : 2\nprogram_schedule.train_executions_per_eval : 2\n"
      "program_schedule.ml_perf.enabled : True\nprogram_schedule.ml_perf.benchmark_name : 'line'\n"
      "program_schedule.ml_perf.decoder_metric_name : 'accuracy'\n"
      "program_schedule.ml_perf.decoder_metric_success_threshold : 0.9\ntask.train.max_steps : "
      "400\n"
      "task.train.ema_decay : 0.0\ntask.train.learner.learning_rate : 0.1\n";
  ExecutorOptions o;
  o.logdir = logdir;
  o.log = [&](const std::string& l) { lines.push_back(l); };
  o.dataset_params["Train"] = GetModelParams("test.line.LineModel", "Train", sched);
  Executor ex(GetModelParams("test.line.LineModel", "Train", sched), o);
  const int64_t final_step = ex.Run();
  EXPECT_LT(final_step, 400);  // stopped at the target
  std::vector<std::string> keys;
  std::vector<nlohmann::ordered_json> events;
  for (const auto& l : lines) {
    if (l.rfind(":::MLLOG ", 0) != 0) continue;
    auto j = nlohmann::ordered_json::parse(l.substr(9));
    // Lingvo's line: time_ms, key, value, metadata (no namespace or event_type), metadata ending
    // with lineno and file.
    std::vector<std::string> fields;
    for (auto it = j.begin(); it != j.end(); ++it) fields.push_back(it.key());
    EXPECT_EQ(fields, (std::vector<std::string>{"time_ms", "key", "value", "metadata"})) << l;
    EXPECT_TRUE(j.at("time_ms").is_number_integer()) << l;
    const auto& meta = j.at("metadata");
    ASSERT_GE(meta.size(), 2u) << l;
    EXPECT_EQ(std::prev(meta.end()).key(), "file") << l;
    EXPECT_EQ(std::prev(meta.end(), 2).key(), "lineno") << l;
    keys.push_back(j.at("key").get<std::string>());
    events.push_back(j);
  }
  // The hyper-parameters (Lingvo's five, then what MLPerf's checker also wants), init_stop,
  // run_start; then per run of train_executions_per_eval loops: block_start on a new epoch,
  // eval_start, eval_stop, eval_accuracy; run_stop success once the metric is strictly past the
  // threshold.
  const std::vector<std::string> head = {
      "global_batch_size", "opt_name",        "opt_base_learning_rate",
      "opt_learning_rate_warmup_steps", "opt_adam_beta_1", "opt_adam_beta_2",
      "opt_adam_epsilon",  "max_steps_to_train", "init_stop", "run_start", "block_start",
      "eval_start",        "eval_stop",       "eval_accuracy"};
  ASSERT_GE(keys.size(), head.size() + 1);
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + head.size()), head);
  EXPECT_TRUE(events[0].at("value").is_number_integer());  // the input's global batch size
  EXPECT_EQ(events[1].at("value"), "adam");
  EXPECT_EQ(events[2].at("value"), 0.1);
  EXPECT_EQ(events[7].at("value"), 400);
  // Epochs are 1-based in block_start/eval_start/eval_stop, 0-based in eval_accuracy (Lingvo's).
  EXPECT_EQ(events[10].at("metadata").at("first_epoch_num"), 1);
  EXPECT_EQ(events[10].at("metadata").at("epoch_count"), 1);
  EXPECT_EQ(events[11].at("metadata").at("first_epoch_num"), 1);
  EXPECT_EQ(events[12].at("metadata").at("epoch_num"), 1);
  EXPECT_EQ(events[13].at("metadata").at("epoch_num"), 0);
  EXPECT_TRUE(events[13].at("value").is_number());
  EXPECT_EQ(keys.back(), "run_stop");
  EXPECT_EQ(events.back().at("metadata").at("status"), "success");
  EXPECT_GT(events[events.size() - 2].at("value").get<double>(), 0.9);
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "block_stop"), 0);
  // An unreachable threshold: run_stop abort once a run starts at max_steps_to_train.
  std::vector<std::string> abort_lines;
  ExecutorOptions ao;
  ao.logdir = LogDir("mlperf_abort");
  ao.log = [&](const std::string& l) { abort_lines.push_back(l); };
  const std::string abort_sched = sched +
                                  "program_schedule.ml_perf.decoder_metric_success_threshold : 2.0\n"
                                  "program_schedule.ml_perf.max_steps_to_train : 20\n"
                                  "program_schedule.ml_perf.global_batch_size : 8\n";
  ao.dataset_params["Train"] = GetModelParams("test.line.LineModel", "Train", abort_sched);
  Executor aborted(GetModelParams("test.line.LineModel", "Train", abort_sched), ao);
  EXPECT_EQ(aborted.Run(), 30);  // the run starting at step 20 trains its loops, then aborts
  nlohmann::json first, last;
  for (const auto& l : abort_lines) {
    if (l.rfind(":::MLLOG ", 0) != 0) continue;
    if (first.is_null()) first = nlohmann::json::parse(l.substr(9));
    last = nlohmann::json::parse(l.substr(9));
  }
  EXPECT_EQ(first.at("value"), 8);
  EXPECT_EQ(last.at("key"), "run_stop");
  EXPECT_EQ(last.at("metadata").at("status"), "abort");
  // The in-trainer eval and decode programs wrote their directories.
  EXPECT_FALSE(ListDirectory(logdir + "/eval_train").empty());
  char name[64];
  std::snprintf(name, sizeof(name), "/decoder_train/decoder_out_%09lld",
                static_cast<long long>(final_step));
  EXPECT_TRUE(FileExists(logdir + name));
}

TEST(Executor, ScheduleWithAnUnknownDatasetIsAnError) {
  ExecutorOptions o;
  o.logdir = LogDir("sched_err");
  o.log = [](const std::string&) {};
  Executor ex(GetModelParams("test.line.LineModel", "Train",
                             "program_schedule.eval_dataset_names : "
                             "['Dev']\nprogram_schedule.eval_steps_per_loop : 1"),
              o);
  EXPECT_THROW(ex.Run(), InvalidArgumentError);
}

}  // namespace
}  // namespace glossa

namespace glossa {
namespace {

TEST(TrainProgram, EveryLoopsEventsReachTheDiskAtTheLoopsEnd) {
  const std::string dir = LogDir("flush");
  Params p = GetModelParams("test.line.LineModel", "Train", "task.train.steps_per_loop : 4");
  auto model = InstantiateLayer<SingleTaskModel>(p);
  EventWriter writer(dir, /*flush_secs=*/1e9);  // the timer never flushes in this test
  TrainProgram train(*model, &writer, nullptr);
  int64_t step = 0;
  train.RunLoop(&step);
  // Without Close: what a kill -9 after the loop would leave on disk.
  std::set<std::string> tags;
  for (const auto& e : ReadEvents(writer.path())) tags.insert(e.tag);
  EXPECT_TRUE(tags.count("global_step/sec"));
  EXPECT_TRUE(tags.count("skipped_steps"));
  EXPECT_NE(ReadFileToString(dir + "/metrics.jsonl").find("\"examples/sec\""), std::string::npos);
}

TEST(TrainProgram, HandsTheOutfeedToTheTaskAfterEachLoop) {
  Params p = GetModelParams("test.line.LineModel", "Train", "task.train.steps_per_loop : 4");
  auto model = InstantiateLayer<SingleTaskModel>(p);
  TrainProgram train(*model, nullptr, nullptr);
  int64_t step = 0;
  train.RunLoop(&step);
  train.RunLoop(&step);
  auto& task = dynamic_cast<LineTask&>(model->task());
  ASSERT_EQ(task.outfeed_log.size(), 2u);
  EXPECT_EQ(task.outfeed_log[1].step, 8);
  ASSERT_EQ(task.outfeed_log[0].per_example.size(), 4u);
  // The loop's mean loss (equal weights) is the mean of the per-example squared errors.
  double total = 0;
  for (const auto& m : task.outfeed_log[0].per_example) {
    EXPECT_EQ(m.GetTensor("sq_err").size(0), 8);
    total += m.GetTensor("sq_err").mean().item<double>();
  }
  EXPECT_NEAR(task.outfeed_log[0].loss, total / 4, 1e-6);
}

}  // namespace
}  // namespace glossa

namespace glossa {
namespace {

TEST(MultiTaskModel, SamplesTasksByProbabilityDeterministically) {
  auto m1 = InstantiateLayer<BaseModel>(GetModelParams("test.line.TwoLineModel", "Train"));
  auto m2 = InstantiateLayer<BaseModel>(GetModelParams("test.line.TwoLineModel", "Train"));
  ASSERT_EQ(m1->task_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(&m1->task(), &m1->GetTask("a"));  // main_task defaults to the first
  int a = 0;
  for (int64_t step = 0; step < 4000; ++step) {
    const std::string name = m1->SampleTask(step).params().GetString("name");
    EXPECT_EQ(name, m2->SampleTask(step).params().GetString("name")) << step;
    a += name == "a";
  }
  EXPECT_NEAR(a / 4000.0, 0.75, 0.03);
  EXPECT_THROW(m1->GetTask("c"), NotFoundError);
}

TEST(MultiTaskModel, RejectsBadTaskProbs) {
  glossa::Params p = GetModelParams("test.line.TwoLineModel", "Train");
  glossa::Params bad = p.Copy();
  bad.Set("task_probs.b", -1.0);
  EXPECT_THROW(InstantiateLayer<BaseModel>(bad), InvalidArgumentError);
  glossa::Params zero = p.Copy();
  zero.Set("task_probs.a", 0.0).Set("task_probs.b", 0.0);
  EXPECT_THROW(InstantiateLayer<BaseModel>(zero), InvalidArgumentError);
  glossa::Params main = p.Copy();
  main.Set("main_task", "c");
  EXPECT_THROW(InstantiateLayer<BaseModel>(main), InvalidArgumentError);
}

TEST(MultiTaskModel, TrainsEachTaskWithItsLearnerAndResumesBitForBit) {
  const std::string a = LogDir("mt_a"), c = LogDir("mt_c");
  auto quiet = [](const std::string&) {};
  Executor(GetModelParams("test.line.TwoLineModel", "Train"), {.logdir = a, .log = quiet}).Run();
  Executor(GetModelParams("test.line.TwoLineModel", "Train", "task_params.a.train.max_steps : 10"),
           {.logdir = c, .log = quiet})
      .Run();
  Executor(GetModelParams("test.line.TwoLineModel", "Train"), {.logdir = c, .log = quiet}).Run();
  SafetensorsContents ca = LoadLatestCheckpoint(a + "/train"),
                      cc = LoadLatestCheckpoint(c + "/train");
  EXPECT_EQ(ca.tensors.at("global_step").item<int64_t>(), 20);
  // Each task's learner has its own slots, under the task's name.
  for (const char* name : {"a/test/a/proj/w/Adam/m", "b/test/b/proj/w/Adam/m", "a/Adam/beta1_power",
                           "b/Adam/beta1_power"}) {
    EXPECT_TRUE(ca.tensors.count(name)) << name;
  }
  // Adam's beta1 power counts each task's own updates: a trained 3x as often as b, in total 20.
  const double b1 = 0.9;
  const double na = std::log(ca.tensors.at("a/Adam/beta1_power").item<double>()) / std::log(b1) - 1;
  const double nb = std::log(ca.tensors.at("b/Adam/beta1_power").item<double>()) / std::log(b1) - 1;
  EXPECT_NEAR(na + nb, 20, 1e-3);
  EXPECT_GT(na, nb);
  for (const auto& [name, t] : ca.tensors) {
    EXPECT_TRUE(at::equal(t, cc.tensors.at(name))) << "the resumed run differs at " << name;
  }
}

TEST(MultiTaskModel, ATaskWithZeroProbabilityNeverTrains) {
  const std::string dir = LogDir("mt_zero");
  glossa::Params p = GetModelParams("test.line.TwoLineModel", "Train", "task_probs.b : 0.0");
  auto fresh = InstantiateLayer<BaseModel>(p);
  Executor(p, {.logdir = dir, .log = [](const std::string&) {}}).Run();
  SafetensorsContents ckpt = LoadLatestCheckpoint(dir + "/train");
  at::Tensor b0;
  for (const auto& [info, t] : fresh->AllVariables()) {
    if (info.full_name == "test/b/proj/w") b0 = t;
  }
  ASSERT_TRUE(b0.defined());
  EXPECT_TRUE(at::equal(ckpt.tensors.at("test/b/proj/w"), b0));
  EXPECT_FALSE(at::equal(ckpt.tensors.at("test/a/proj/w"), [&] {
    for (const auto& [info, t] : fresh->AllVariables())
      if (info.full_name == "test/a/proj/w") return t;
    return at::Tensor();
  }()));
}

TEST(CheckpointJob, SkipsACheckpointRetentionRemovedAndGoesOn) {
  const std::string logdir = LogDir("job_gone");
  auto quiet = [](const std::string&) {};
  Executor(GetModelParams("test.line.LineModel", "Train"), {.logdir = logdir, .log = quiet}).Run();
  // The state file still lists ckpt-10, but retention deleted its files meanwhile.
  for (const auto& f : SafetensorsFiles(logdir + "/train/ckpt-00000010")) RemoveFileIfExists(f);
  std::vector<std::string> lines;
  const Params p = GetModelParams("test.line.LineModel", "Train",
                                  "task.eval.eval_all_checkpoints : True\n"
                                  "task.eval.samples_per_summary : 8");
  JobOptions o{.logdir = logdir, .dataset = "Train",
               .log = [&](const std::string& l) { lines.push_back(l); }};
  EXPECT_EQ(RunCheckpointJob(JobKind::kEval, p, o), 1);  // ckpt-20 evaluated, ckpt-10 not seen
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("eval Train \xC2\xB7 ckpt-00000020 (step 20)", 0), 0u) << lines[0];
}

TEST(CheckpointJob, AStateFileListingOnlyDeletedCheckpointsNeitherSpinsNorHidesTheRest) {
  const std::string logdir = LogDir("job_stale_state");
  auto quiet = [](const std::string&) {};
  Executor(GetModelParams("test.line.LineModel", "Train"), {.logdir = logdir, .log = quiet}).Run();
  CheckpointState s;
  s.model_checkpoint_path = "ckpt-00000099";
  s.all_model_checkpoint_paths = {"ckpt-00000099"};
  AtomicWriteFile(logdir + "/train/checkpoint", FormatCheckpointState(s));
  std::vector<std::string> lines;
  const Params p = GetModelParams("test.line.LineModel", "Train",
                                  "task.eval.samples_per_summary : 8");
  JobOptions o{.logdir = logdir, .dataset = "Train",
               .log = [&](const std::string& l) { lines.push_back(l); }};
  EXPECT_EQ(RunCheckpointJob(JobKind::kEval, p, o), 1);  // ckpt-20, found on disk
  ASSERT_EQ(lines.size(), 1u) << lines.back();
  EXPECT_NE(lines[0].find("ckpt-00000020 (step 20)"), std::string::npos) << lines[0];
  // --once takes the newest checkpoint that exists as the last one: ckpt-20 gone, ckpt-10, at
  // once (no wait).
  for (const auto& f : SafetensorsFiles(logdir + "/train/ckpt-00000020")) RemoveFileIfExists(f);
  RemoveFileIfExists(logdir + "/eval_train/processed_ckpts.txt");
  lines.clear();
  int sleeps = 0;
  o.once = true;
  o.sleep = [&](double) { ++sleeps; };
  EXPECT_EQ(RunCheckpointJob(JobKind::kEval, p, o), 1);
  EXPECT_EQ(sleeps, 0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("ckpt-00000010 (step 10)"), std::string::npos) << lines[0];
  // With none left: NotFound, not a wait.
  for (const auto& f : SafetensorsFiles(logdir + "/train/ckpt-00000010")) RemoveFileIfExists(f);
  EXPECT_ERROR_CONTAINS(RunCheckpointJob(JobKind::kEval, p, o), NotFoundError,
                        "no checkpoint in " + logdir + "/train");
  EXPECT_EQ(sleeps, 0);
}

TEST(CheckpointJob, OnceOnAnAlreadyProcessedCheckpointSaysWhereItsScoresAreAndForceRedoesIt) {
  const std::string logdir = LogDir("job_once_again");
  auto quiet = [](const std::string&) {};
  Executor(GetModelParams("test.line.LineModel", "Train"), {.logdir = logdir, .log = quiet}).Run();
  const Params p =
      GetModelParams("test.line.LineModel", "Train", "task.eval.samples_per_summary : 8");
  std::vector<std::string> lines;
  JobOptions o{.logdir = logdir, .dataset = "Train", .log = [&](const std::string& l) {
                 lines.push_back(l);
               }};
  o.once = true;
  EXPECT_EQ(RunCheckpointJob(JobKind::kEval, p, o), 1);
  const std::string score = logdir + "/eval_train/score-00000020.txt";
  ASSERT_TRUE(FileExists(score));
  // Again: nothing new to do, and it says so rather than ending mute.
  lines.clear();
  EXPECT_EQ(RunCheckpointJob(JobKind::kEval, p, o), 0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("ckpt-00000020 (step 20) was already evaluated"), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("its scores: " + score), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("--force"), std::string::npos) << lines[0];
  // --force evaluates it again and rewrites its score file.
  AtomicWriteFile(score, "stale\n");
  lines.clear();
  o.force = true;
  EXPECT_EQ(RunCheckpointJob(JobKind::kEval, p, o), 1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("eval Train \xC2\xB7 ckpt-00000020 (step 20)", 0), 0u) << lines[0];
  EXPECT_EQ(ReadFileToString(score, 1 << 20).find("stale"), std::string::npos);
  // --force means "redo the --once checkpoint": alone it is an error, not a silent no-op.
  o.once = false;
  EXPECT_ERROR_CONTAINS(RunCheckpointJob(JobKind::kEval, p, o), InvalidArgumentError,
                        "--force redoes the checkpoint --once processes");
}

TEST(Executor, AResumedRunStopsSkippingItsInputWhenAskedAndRefusesAnAbsurdPosition) {
  const std::string logdir = LogDir("fast_forward");
  auto quiet = [](const std::string&) {};
  Executor(GetModelParams("test.line.LineModel", "Train"), {.logdir = logdir, .log = quiet}).Run();
  const std::string ckpt = logdir + "/train/ckpt-00000020";
  const SafetensorsContents saved = LoadCheckpoint(ckpt);
  ASSERT_EQ(saved.tensors.at("__input_position__").item<int64_t>(), 20);
  // A stop requested before the skip is done: no batch is read, nothing is trained or saved.
  std::vector<std::string> lines;
  {
    Executor stopped(GetModelParams("test.line.LineModel", "Train", "task.train.max_steps : 40"),
                     {.logdir = logdir, .log = [&](const std::string& l) { lines.push_back(l); }});
    stopped.RequestStop();
    EXPECT_EQ(stopped.Run(), 20);
  }
  bool said = false;
  for (const auto& l : lines) said = said || l.find("stopped at batch 0 of the 20") != std::string::npos;
  EXPECT_TRUE(said) << lines.front();
  EXPECT_FALSE(FileExists(logdir + "/train/ckpt-00000040.safetensors"));
  // A crafted position far past the checkpoint's step (1e15 would read the data for ever) is
  // damage: the checkpoint falls back like a corrupt one.
  SafetensorsContents crafted = saved;
  crafted.tensors["__input_position__"] = at::full({}, int64_t{1000000000000000}, at::kLong);
  lines.clear();
  crafted.tensors["global_step"] = at::full({}, int64_t{30}, at::kLong);
  Saver({.dir = logdir + "/train"}).Save(30, crafted.tensors, crafted.metadata);
  Executor resumed(GetModelParams("test.line.LineModel", "Train", "task.train.max_steps : 30"),
                   {.logdir = logdir, .log = [&](const std::string& l) { lines.push_back(l); }});
  EXPECT_EQ(resumed.Run(), 30);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_NE(lines[0].find("is 1000000000000000, outside [0, global_step 30]"), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[1].find("restored " + ckpt + " at step 20"), std::string::npos) << lines[1];
}

TEST(Executor, AShortRunThatEndsSkippingStepsDivergesInsteadOfSavingIt) {
  const std::string logdir = LogDir("short_diverged");
  std::vector<std::string> lines;
  Executor ex(GetModelParams("test.line.LineModel", "Train",
                             "task.train.learner.learning_rate : 1e30"),
              {.logdir = logdir, .log = [&](const std::string& l) { lines.push_back(l); }});
  EXPECT_ERROR_CONTAINS(ex.Run(), AbortedError, "training diverged: the run ended inside a streak");
  for (const auto& l : lines) EXPECT_EQ(l.find("saved "), std::string::npos) << l;
  EXPECT_FALSE(FileExists(logdir + "/train/ckpt-00000020.safetensors"));
  // The fraction alone: a run that skipped most of its steps but not its last one.
  EXPECT_ERROR_CONTAINS(
      Executor(GetModelParams("test.line.LineModel", "Train",
                              "task.train.max_skipped_steps_fraction : 1.5"),
               {.logdir = LogDir("bad_fraction"), .log = [](const std::string&) {}}),
      InvalidArgumentError, "max_skipped_steps_fraction must be in [0, 1], got 1.5");
}

TEST(Executor, AResumedRunDropsTheMetricLinesOfTheStepsItReplays) {
  const std::string logdir = LogDir("replayed_metrics");
  auto quiet = [](const std::string&) {};
  Executor(GetModelParams("test.line.LineModel", "Train"), {.logdir = logdir, .log = quiet}).Run();
  // The run lost its last checkpoint: the next one resumes from step 10 and replays 11..20.
  for (const auto& f : SafetensorsFiles(logdir + "/train/ckpt-00000020")) RemoveFileIfExists(f);
  Executor(GetModelParams("test.line.LineModel", "Train"), {.logdir = logdir, .log = quiet}).Run();
  std::map<std::pair<std::string, int64_t>, int> seen;
  for (const auto& line : Split(ReadFileToString(logdir + "/train/metrics.jsonl"), '\n')) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    ++seen[{j["tag"].get<std::string>(), j["step"].get<int64_t>()}];
  }
  int64_t last_loss_step = 0;
  for (const auto& [key, n] : seen) {
    if (key.first == "loss") last_loss_step = std::max(last_loss_step, key.second);
  }
  ASSERT_GT(last_loss_step, 10);  // the replayed steps wrote their lines again, once
  for (const auto& [key, n] : seen) EXPECT_EQ(n, 1) << key.first << " at step " << key.second;
}

TEST(CheckpointJob, EmaEvaluationRefusesACheckpointWithoutAverages) {
  const std::string logdir = LogDir("job_no_ema");
  auto quiet = [](const std::string&) {};
  // Trained without EMA...
  Executor(GetModelParams("test.line.LineModel", "Train", "task.train.ema_decay : 0.0"),
           {.logdir = logdir, .log = quiet})
      .Run();
  // ...evaluated by a model that keeps one: an error naming the variables, not a score of the
  // averages' initial values.
  JobOptions o{.logdir = logdir, .dataset = "Train", .log = quiet};
  EXPECT_ERROR_CONTAINS(RunCheckpointJob(JobKind::kEval, GetModelParams("test.line.LineModel",
                                                                        "Train"),
                                         o),
                        NotFoundError,
                        "the checkpoint has no ExponentialMovingAverage for 2 variable(s) "
                        "(test/task/proj/b, test/task/proj/w)");
  // Resuming training with EMA turned on starts the averages from the restored weights.
  Executor resumed(GetModelParams("test.line.LineModel", "Train", "task.train.max_steps : 25"),
                   {.logdir = logdir, .log = quiet});
  EXPECT_EQ(resumed.Run(), 25);
  EXPECT_EQ(RunCheckpointJob(JobKind::kEval, GetModelParams("test.line.LineModel", "Train"),
                             o),
            1);
}

TEST(Executor, EarlyStopsOnTheEvalersMetricHistory) {
  const std::string logdir = LogDir("early_stop");
  auto quiet = [](const std::string&) {};
  const std::string es =
      "task.train.early_stop.window : 10\n"
      "task.train.early_stop.metric_history.jobname : 'eval_train'\n"
      "task.train.early_stop.metric_history.metric : 'loss'\n"
      "task.eval.eval_all_checkpoints : True\ntask.eval.samples_per_summary : 8\n";
  Executor(GetModelParams("test.line.LineModel", "Train", es), {.logdir = logdir, .log = quiet})
      .Run();
  // The evaler appends the tracked metric for each checkpoint it evaluates.
  JobOptions o{.logdir = logdir, .dataset = "Train", .log = quiet};
  EXPECT_EQ(RunCheckpointJob(JobKind::kEval, GetModelParams("test.line.LineModel", "Train", es), o),
            2);
  const std::string history = logdir + "/eval_train/loss.history.txt";
  const auto lines = Split(ReadFileToString(history), '\n');
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(std::string(lines[0]).rfind("10 ", 0), 0u);
  EXPECT_EQ(std::string(lines[1]).rfind("20 ", 0), 0u);
  // A history whose best is long past: training stops at its first check.
  AppendMetricHistory(history, 200, 1e9);
  AppendMetricHistory(history, 300, 1e9);
  std::vector<std::string> log;
  Executor more(GetModelParams("test.line.LineModel", "Train", es + "task.train.max_steps : 1000"),
                {.logdir = logdir, .log = [&](const std::string& l) { log.push_back(l); }});
  EXPECT_EQ(more.Run(), 25);  // one loop of 5 after the restore at 20
  bool checked = false;
  for (const auto& l : log) {
    checked = checked || l.find("early stop check: best_step=") != std::string::npos;
  }
  EXPECT_TRUE(checked);
}

TEST(MultiTaskModel, ModelTaskNameSelectsTheTaskToTrainAndEvaluate) {
  Params p = GetModelParams("test.line.TwoLineModel", "Train");
  Params train = p.Copy();
  SelectModelTask(train, "b", /*training=*/true);
  EXPECT_EQ(train.GetString("main_task"), "b");
  EXPECT_EQ(train.GetFloat("task_probs.a"), 0.0);
  EXPECT_EQ(train.GetFloat("task_probs.b"), 1.0);
  const std::string logdir = LogDir("task_name");
  Executor ex(train, {.logdir = logdir, .log = [](const std::string&) {}});
  ex.Run();
  // Only b trained: a's weights are still their initial values.
  auto fresh = InstantiateLayer<BaseModel>(p);
  const SafetensorsContents c = LoadLatestCheckpoint(logdir + "/train");
  for (const auto& [info, t] : fresh->AllVariables()) {
    const bool is_a = info.full_name.find("/a/") != std::string::npos;
    EXPECT_EQ(at::equal(c.tensors.at(info.full_name), t), is_a) << info.full_name;
  }
  Params eval = p.Copy();
  SelectModelTask(eval, "a", /*training=*/false);
  EXPECT_EQ(eval.GetString("main_task"), "a");
  EXPECT_EQ(eval.GetFloat("task_probs.b"), 1.0);  // sampling unchanged outside training
  EXPECT_ERROR_CONTAINS(SelectModelTask(eval, "c", false), NotFoundError,
                        "--model_task_name 'c': the model has tasks [a, b]");
  Params single = GetModelParams("test.line.LineModel", "Train");
  EXPECT_ERROR_CONTAINS(SelectModelTask(single, "task", true), InvalidArgumentError,
                        "is for multi-task models");
}

}  // namespace
}  // namespace glossa
