// The Params a run was trained with, applied to the jobs that follow it (checkpoint/trained_params.h).
#include "glossa/checkpoint/trained_params.h"

#include <gtest/gtest.h>

#include "glossa/base/file.h"
#include "glossa/core/params.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

Params ModelParams() {
  Params task;
  task.Define("name", "lm", "");
  task.Define("activation", "RELU", "");
  task.Define("num_layers", 2, "");
  task.Define("random_seed", nullptr, "");
  Params input;
  input.Define("file_pattern", "train.txt", "");
  task.Define("input", input, "");
  Params train;
  train.Define("max_steps", 100, "");
  task.Define("train", train, "");
  Params p;
  p.Define("task", task, "");
  return p;
}

// A logdir whose control/params.txt is `trained`.
std::string RunWith(const std::string& name, const Params& trained) {
  const std::string logdir = testing::TempDir(name);
  CreateDirectories(JoinPath(logdir, "control"));
  AtomicWriteFile(JoinPath(logdir, "control/params.txt"), trained.ToText());
  return logdir;
}

TEST(TrainedParams, WithoutAParamsFileNothingChanges) {
  Params p = ModelParams();
  EXPECT_TRUE(ApplyTrainedParams(p, testing::TempDir("no_control"), {}, false).empty());
  EXPECT_EQ(p.ToText(), ModelParams().ToText());
}

TEST(TrainedParams, KeysTheRunChangedAreTakenFromItAndSaid) {
  Params trained = ModelParams();
  trained.Set("task.activation", "GELU");
  const std::string logdir = RunWith("taken", trained);
  Params p = ModelParams();
  const auto notes = ApplyTrainedParams(p, logdir, {}, false);
  EXPECT_EQ(p.GetString("task.activation"), "GELU");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("task.activation: trained 'GELU', given 'RELU'"), std::string::npos)
      << notes[0];
}

TEST(TrainedParams, RunSettingsAreNotTheModel) {
  // Another dataset, max_steps, seed: the jobs' own business, never taken from the run.
  Params trained = ModelParams();
  trained.Set("task.input.file_pattern", "dev.txt");
  trained.Set("task.train.max_steps", 5);
  trained.Set("task.random_seed", 7);
  const std::string logdir = RunWith("settings", trained);
  Params p = ModelParams();
  EXPECT_TRUE(ApplyTrainedParams(p, logdir, {}, false).empty());
  EXPECT_EQ(p.GetString("task.input.file_pattern"), "train.txt");
  EXPECT_EQ(p.GetInt("task.train.max_steps"), 100);
  EXPECT_TRUE(IsRunSettingKey("task.input.file_pattern"));
  EXPECT_TRUE(IsRunSettingKey("task_params.a.input.bucket_batch_limit"));
  EXPECT_TRUE(IsRunSettingKey("task.eval.samples_per_summary"));
  EXPECT_TRUE(IsRunSettingKey("program_schedule.eval_dataset_names"));
  EXPECT_TRUE(IsRunSettingKey("random_seed"));
  EXPECT_FALSE(IsRunSettingKey("task.stack.num_layers"));
  EXPECT_FALSE(IsRunSettingKey("task.inputs_dim"));  // a component, not a prefix, is `input`
}

TEST(TrainedParams, AnOverrideThatChangesTheTrainedModelIsRefusedWithTheDiff) {
  Params trained = ModelParams();
  trained.Set("task.activation", "GELU");
  const std::string logdir = RunWith("refused", trained);
  Params p = ModelParams();
  p.Set("task.num_layers", 3);  // what --model_params_override set
  EXPECT_ERROR_CONTAINS(ApplyTrainedParams(p, logdir, {"task.num_layers"}, false),
                        InvalidArgumentError, "task.num_layers: trained 2, given 3");
  // An override of a whole subtree covers its keys.
  EXPECT_ERROR_CONTAINS(ApplyTrainedParams(p, logdir, {"task"}, false), InvalidArgumentError,
                        "--allow_params_change");
  // With --allow_params_change the override stays, the rest comes from the run, and both are said.
  const auto notes = ApplyTrainedParams(p, logdir, {"task.num_layers"}, true);
  EXPECT_EQ(p.GetInt("task.num_layers"), 3);
  EXPECT_EQ(p.GetString("task.activation"), "GELU");
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[1].find("task.num_layers: trained 2, given 3"), std::string::npos) << notes[1];
  // An override equal to the trained value is no change.
  Params same = ModelParams();
  same.Set("task.activation", "GELU");
  EXPECT_TRUE(ApplyTrainedParams(same, logdir, {"task.activation"}, false).empty());
}

TEST(TrainedParams, AKeyTheModelNoLongerHasIsNamed) {
  Params trained = ModelParams();
  Params task = trained.GetParams("task").Copy();
  task.Define("old_knob", 1, "");
  trained.Set("task", task);
  const std::string logdir = RunWith("old_key", trained);
  Params p = ModelParams();
  EXPECT_ERROR_CONTAINS(ApplyTrainedParams(p, logdir, {}, false), InvalidArgumentError,
                        "'task.old_knob', which the model's Params no longer have");
}

TEST(TrainedParams, OverrideKeysReadOverrideLines) {
  EXPECT_EQ(OverrideKeys("a.b : 1\n# c : 2\n\n d[0].e  :  'x: y'\nnot a line\n"),
            (std::vector<std::string>{"a.b", "d[0].e"}));
}

}  // namespace
}  // namespace glossa
