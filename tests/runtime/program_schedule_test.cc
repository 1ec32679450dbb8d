// The program schedule runs eval and decode on the trained model itself (its EMA in eval mode) on
// each dataset's input; test.line.LineModel and the test.FixedLine dataset are registered in
// executor_test.cc (the same test binary).
#include "glossa/runtime/program_schedule.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "glossa/base/strings.h"
#include "glossa/model/model_registry.h"
#include "glossa/runtime/executor.h"
#include "glossa/runtime/program.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

std::string LogDir(const std::string& name) {
  fs::path dir = ::glossa::testing::TestRoot() / "sched" / name;
  fs::remove_all(dir);
  return dir.string();
}

const char* kEvalFixedEachLoop =
    "program_schedule.eval_dataset_names : ['Fixed']\nprogram_schedule.eval_steps_per_loop : 1\n";

// LineModel's params for a dataset that always yields the same batch.
Params FixedParams(const std::string& overrides) {
  Params p = GetModelParams("test.line.LineModel", "Train", overrides);
  p.Set("task.input", DatasetInput::ParamsFor("test.FixedLine").Set("name", "input"));
  return p;
}

double LossOfLine(const std::vector<std::string>& lines, const std::string& prefix) {
  for (const auto& l : lines) {
    if (l.rfind(prefix, 0) != 0) continue;
    const auto at = l.find("loss: ");
    if (at == std::string::npos) break;
    return std::stod(l.substr(at + 6));
  }
  ADD_FAILURE() << "no line starts with '" << prefix << "'";
  return 0;
}

TEST(ProgramSchedule, EvalRunsOnTheTrainedModelsEmaWeights) {
  const std::string logdir = LogDir("ema");
  std::vector<std::string> lines;
  ExecutorOptions o;
  o.logdir = logdir;
  o.log = [&](const std::string& l) { lines.push_back(l); };
  o.dataset_params["Fixed"] = FixedParams(kEvalFixedEachLoop);
  Executor(GetModelParams("test.line.LineModel", "Train", kEvalFixedEachLoop), o).Run();
  const double in_trainer = LossOfLine(lines, "eval Fixed step 20, ");
  // The final checkpoint's EMA shadows as the weights of a separate model: the same loss.
  SafetensorsContents ckpt = LoadLatestCheckpoint(logdir + "/train");
  auto with_ema = InstantiateLayer<BaseModel>(FixedParams(kEvalFixedEachLoop));
  auto ema = MakeModelEma(*with_ema);
  ASSERT_NE(ema, nullptr);
  RestoreForEval(ckpt, *with_ema, ema.get());
  EXPECT_EQ(EvalProgram(*with_ema, nullptr).Run(20, 1).at("loss").first, in_trainer);
  // The raw variables give another loss: the trainer evaluated the EMA.
  auto raw = InstantiateLayer<BaseModel>(FixedParams(kEvalFixedEachLoop));
  RestoreForEval(ckpt, *raw, nullptr);
  EXPECT_NE(EvalProgram(*raw, nullptr).Run(20, 1).at("loss").first, in_trainer);
}

TEST(ProgramSchedule, ADatasetMayChangeTheInputOnly) {
  ExecutorOptions o;
  o.logdir = LogDir("differs");
  o.log = [](const std::string&) {};
  o.dataset_params["Fixed"] =
      FixedParams(StrCat(kEvalFixedEachLoop, "task.train.learner.learning_rate : 0.5\n"));
  Executor ex(GetModelParams("test.line.LineModel", "Train", kEvalFixedEachLoop), o);
  try {
    ex.Run();
    FAIL() << "no error";
  } catch (const InvalidArgumentError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("dataset Fixed"), std::string::npos) << what;
    EXPECT_NE(what.find("learning_rate"), std::string::npos) << what;
  }
}

TEST(ProgramSchedule, AMultiTaskModelsDatasetGivesEveryTaskItsInput) {
  // Each task's input changes with the dataset; the eval runs the main task (a) on its input.
  const std::string logdir = LogDir("multi");
  std::vector<std::string> lines;
  ExecutorOptions o;
  o.logdir = logdir;
  o.log = [&](const std::string& l) { lines.push_back(l); };
  Params fixed = GetModelParams("test.line.TwoLineModel", "Train", kEvalFixedEachLoop);
  for (const char* task : {"a", "b"}) {
    fixed.Set(StrCat("task_params.", task, ".input"),
              DatasetInput::ParamsFor("test.StepLine").Set("name", "input"));
  }
  o.dataset_params["Fixed"] = fixed;
  Executor(GetModelParams("test.line.TwoLineModel", "Train", kEvalFixedEachLoop), o).Run();
  EXPECT_GT(LossOfLine(lines, "eval Fixed step 20, "), 0.0);
}

TEST(ProgramSchedule, RunsEveryTrainExecutionsPerEvalLoopsAndAfterTheLast) {
  auto model = InstantiateLayer<BaseModel>(GetModelParams(
      "test.line.LineModel", "Train",
      StrCat(kEvalFixedEachLoop, "program_schedule.train_executions_per_eval : 3\n")));
  std::vector<std::string> lines;
  const std::string logdir = LogDir("cadence");
  ProgramSchedule schedule(
      *model,
      {{"Fixed", FixedParams(StrCat(kEvalFixedEachLoop,
                                    "program_schedule.train_executions_per_eval : 3\n"))}},
      logdir, [&](const std::string& l) { lines.push_back(l); }, [] { return 0.0; });
  ASSERT_TRUE(schedule.has_programs());
  std::vector<int64_t> eval_steps;
  for (int64_t loop = 1; loop <= 7; ++loop) {
    const size_t before = lines.size();
    EXPECT_FALSE(schedule.AfterTrainLoop(loop * 5, 5, /*last=*/loop == 7));
    if (lines.size() > before) eval_steps.push_back(loop * 5);
  }
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{15, 30, 35}));
  // The programs read the dataset's input only while they run.
  EXPECT_EQ(model->task().input().params().GetString("dataset_fn"), "test.StepLine");
}

TEST(TaskInputScope, SwapsTheTasksInputWhileAlive) {
  auto model = InstantiateLayer<BaseModel>(GetModelParams("test.line.LineModel", "Train"));
  auto other = InstantiateLayer<BaseInputGenerator>(
      DatasetInput::ParamsFor("test.FixedLine").Set("name", "input"));
  BaseInputGenerator* own = &model->task().input();
  {
    TaskInputScope scope(model->task(), *other);
    EXPECT_EQ(&model->task().input(), other.get());
  }
  EXPECT_EQ(&model->task().input(), own);
}

TEST(BaseTaskReport, ListsTheEvalMetricsAndUpToNumSamplesDecodeLines) {
  auto model = InstantiateLayer<BaseModel>(GetModelParams("test.line.LineModel", "Train"));
  BaseTask::ReportInputs in;
  in.model_key = "test.line.LineModel";
  in.dataset = "Dev";
  in.global_step = 20;
  in.eval_metrics = {{"loss", {0.25, 8}}};
  in.decode_lines = {"a", "b", "c"};
  in.num_samples = 2;
  EXPECT_EQ(model->task().Report(in),
            "test.line.LineModel step 20 on Dev:\n  loss: 0.25\ndecoded:\n  a\n  b\n");
}

}  // namespace
}  // namespace glossa
