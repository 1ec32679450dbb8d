// The Params a run was trained with, applied to the jobs that follow it (checkpoint/trained_params.h).
#include "glossa/checkpoint/trained_params.h"

#include <gtest/gtest.h>

#include "glossa/base/file.h"
#include "glossa/core/params.h"
#include "glossa/model/datasets.h"
#include "glossa/model/model_registry.h"
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
  // The tokenizer is the model's: the ids it was trained on.
  EXPECT_FALSE(IsRunSettingKey("task.input.tokenizer.spm_model_file"));
  EXPECT_FALSE(IsRunSettingKey("task_params.a.input.tokenizer.vocab_size"));
  // What the datasets read is the run's too (datasets.train is not the `train` settings).
  EXPECT_FALSE(IsRunSettingKey("datasets.train"));
}

// Issue 46: a run trained on one's own text, evaluated on the registered corpus without a word.
constexpr char kLm[] = "lm.austen.TransformerLmTiny";

TEST(Datasets, TheModelParamsSayWhatEveryDatasetReads) {
  const Params train = GetModelParams(kLm, "Train");
  const std::string dir = train.GetString("datasets.train");
  EXPECT_EQ(train.GetString("task.input.file_pattern"), dir);
  EXPECT_NE(dir.find("austen/train.txt"), std::string::npos) << dir;
  EXPECT_NE(train.GetString("datasets.dev").find("austen/dev.txt"), std::string::npos);
  EXPECT_NE(train.GetString("datasets.test").find("austen/test.txt"), std::string::npos);
  EXPECT_EQ(GetModelParams(kLm, "Dev").GetString("task.input.file_pattern"),
            train.GetString("datasets.dev"));
  // datasets.<name> decides what a job on that dataset reads.
  const std::string mine =
      "datasets.train : 'text:/m/train.txt'; datasets.dev : 'text:/m/dev.txt'; datasets.test : ''";
  EXPECT_EQ(GetModelParams(kLm, "Train", mine).GetString("task.input.file_pattern"),
            "text:/m/train.txt");
  EXPECT_EQ(GetModelParams(kLm, "Dev", mine).GetString("task.input.file_pattern"),
            "text:/m/dev.txt");
  // A dataset given as '' reads nothing: a job on it (the CLI resolves it once the run's data is
  // known) is told which key to set.
  Params test = GetModelParams(kLm, "Test", mine);
  EXPECT_ERROR_CONTAINS(
      ResolveDatasetInput(test, "Test", {}), InvalidArgumentError,
      "dataset Test reads no data: datasets.test is unset; say what it reads, "
      "e.g. --model_params_override=\"datasets.test : 'text:/path/to/test.txt'\"");
  // An eval on a slice of the registered Dev (task.input.file_pattern, Lingvo's way) is fine and
  // recorded.
  const Params slice = GetModelParams(kLm, "Dev", "task.input.file_pattern : 'text:/s/dev48.txt'");
  EXPECT_EQ(slice.GetString("datasets.dev"), "text:/s/dev48.txt");
}

TEST(Datasets, TheTextFamilyReadsOnlyWhatItIsTold) {
  // lm.text.* have no corpus: every dataset reads nothing until datasets.* say what.
  Params dev = GetModelParams("lm.text.TransformerLmTiny", "Dev");
  EXPECT_EQ(dev.GetString("datasets.train"), "");
  EXPECT_EQ(dev.GetString("datasets.dev"), "");
  EXPECT_EQ(dev.GetInt("task.emb.vocab_size"), 8000);
  EXPECT_ERROR_CONTAINS(ResolveDatasetInput(dev, "Dev", {}), InvalidArgumentError,
                        "dataset Dev reads no data: datasets.dev is unset");
  Params told = GetModelParams("lm.text.TransformerLmTiny", "Dev", "datasets.dev : 'text:/m/d.txt'");
  ResolveDatasetInput(told, "Dev", {"datasets.dev"});
  EXPECT_EQ(told.GetString("task.input.file_pattern"), "text:/m/d.txt");
  EXPECT_FALSE(told.IsSet("task.input.tokenizer.spm_model_file"));  // the user's to give
  // Its own data is no registered corpus: nothing to refuse.
  EXPECT_NO_THROW(RefuseTrainingOnMixedData("lm.text.TransformerLmTiny", told, {"datasets.dev"}));
}

TEST(Datasets, TheTranslationTextFamilyReadsOnlyWhatItIsTold) {
  // mt.text.*: pairs from the files the Params name, one tokenizer for both sides.
  Params train = GetModelParams("mt.text.TransformerTiny", "Train");
  EXPECT_EQ(train.GetString("datasets.train"), "");
  EXPECT_EQ(train.GetInt("task.encoder.token_emb.vocab_size"), 8000);
  EXPECT_EQ(train.GetInt("task.decoder.token_emb.vocab_size"), 8000);
  EXPECT_EQ(train.GetInt("task.input.tokenizer.vocab_size"), 8000);
  EXPECT_ERROR_CONTAINS(ResolveDatasetInput(train, "Train", {}), InvalidArgumentError,
                        "dataset Train reads no data: datasets.train is unset");
  Params told = GetModelParams("mt.text.TransformerBase", "Dev",
                               "datasets.dev : 'text:/m/dev.tsv'");
  ResolveDatasetInput(told, "Dev", {"datasets.dev"});
  EXPECT_EQ(told.GetString("task.input.file_pattern"), "text:/m/dev.tsv");
  EXPECT_EQ(told.GetInt("task.input.repeat_count"), 1);  // Dev is read once
  EXPECT_EQ(told.GetInt("task.encoder.model_dim"), 512);
  EXPECT_FALSE(told.IsSet("task.input.tokenizer.spm_model_file"));
  EXPECT_NO_THROW(RefuseTrainingOnMixedData("mt.text.TransformerBase", told, {"datasets.dev"}));
}

TEST(Datasets, TrainingOnOtherDataWhileDevReadsTheRegisteredCorpusIsRefused) {
  const Params reg = GetModelParams(kLm, "Train");
  // The most natural route (task.input.file_pattern) trains on the user's text, and Dev and Test
  // would read Austen's: refused, with the override that says what each reads.
  const std::string lingvo_way = "task.input.file_pattern : 'text:/m/train.txt'";
  // inspect_model and the like build it (the check is the training run's).
  const Params trained = GetModelParams(kLm, "Train", lingvo_way);
  try {
    RefuseTrainingOnMixedData(kLm, trained, {"task.input.file_pattern"});
    ADD_FAILURE() << "not refused";
  } catch (const InvalidArgumentError& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("Train reads 'text:/m/train.txt', not lm.austen.TransformerLmTiny's "
                     "registered '" +
                     reg.GetString("datasets.train") + "'"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("Dev ('" + reg.GetString("datasets.dev") + "') and Test ('" +
                     reg.GetString("datasets.test") + "') would still read the registered data"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("--model_params_override=\"datasets.dev : '" + reg.GetString("datasets.dev") +
                     "'; datasets.test : '" + reg.GetString("datasets.test") +
                     "'; datasets.train : 'text:/m/train.txt'\""),
              std::string::npos)
        << m;
  }
  // Naming them (even as the registered data: a deliberate choice) is accepted.
  const Params named = GetModelParams(kLm, "Train",
                                      "datasets.train : 'text:/m/train.txt'; datasets.dev : '" +
                                          reg.GetString("datasets.dev") + "'; datasets.test : ''");
  EXPECT_NO_THROW(RefuseTrainingOnMixedData(
      kLm, named, {"datasets.train", "datasets.dev", "datasets.test"}));
  // The registered data: nothing to say.
  EXPECT_NO_THROW(RefuseTrainingOnMixedData(kLm, reg, {}));
}

TEST(Datasets, JobsAfterARunReadTheRunsDataAndTokenizer) {
  const std::string mine =
      "datasets.train : 'text:/m/train.txt'; datasets.dev : 'text:/m/dev.txt'; "
      "datasets.test : 'text:/m/test.txt'; task.input.tokenizer.spm_model_file : '/m/spm.model'";
  const std::string logdir = RunWith("own_data", GetModelParams(kLm, "Train", mine));
  // An eval on Dev with no override: the run's Dev and the run's tokenizer, said once.
  Params dev = GetModelParams(kLm, "Dev");
  const auto notes = ApplyTrainedParams(dev, logdir, {}, false);
  ResolveDatasetInput(dev, "Dev", {});
  EXPECT_EQ(dev.GetString("task.input.file_pattern"), "text:/m/dev.txt");
  Params train = GetModelParams(kLm, "Train");
  ApplyTrainedParams(train, logdir, {}, false);
  ResolveDatasetInput(train, "Train", {});
  EXPECT_EQ(train.GetString("task.input.file_pattern"), "text:/m/train.txt");
  EXPECT_EQ(dev.GetString("task.input.tokenizer.spm_model_file"), "/m/spm.model");
  std::string all;
  for (const auto& n : notes) all += n + "\n";
  EXPECT_NE(all.find("reading the data the run was trained with"), std::string::npos) << all;
  EXPECT_NE(all.find("datasets.dev: 'text:/m/dev.txt'"), std::string::npos) << all;
  // A new test set given to the job is the job's business: kept.
  Params test = GetModelParams(kLm, "Test", "datasets.test : 'text:/n/test2.txt'");
  ApplyTrainedParams(test, logdir, {"datasets.test"}, false);
  ResolveDatasetInput(test, "Test", {"datasets.test"});
  EXPECT_EQ(test.GetString("task.input.file_pattern"), "text:/n/test2.txt");
  // Another tokenizer than the run's is refused with the difference.
  Params other = GetModelParams(kLm, "Dev", "task.input.tokenizer.spm_model_file : '/x.model'");
  EXPECT_ERROR_CONTAINS(
      ApplyTrainedParams(other, logdir, {"task.input.tokenizer.spm_model_file"}, false),
      InvalidArgumentError,
      "task.input.tokenizer.spm_model_file: trained '/m/spm.model', given '/x.model'");
}

// Packing is for training: Dev and Test read a sequence a row, whether the override is given to
// the job or the run was trained packed (inputs are run settings, not taken from its params.txt).
TEST(Datasets, OnlyTrainReadsPackedRows) {
  const std::string packed = "task.input.packed_input : True";
  EXPECT_TRUE(GetModelParams(kLm, "Train", packed).GetBool("task.input.packed_input"));
  EXPECT_FALSE(GetModelParams(kLm, "Dev", packed).GetBool("task.input.packed_input"));
  EXPECT_FALSE(GetModelParams("mt.text.TransformerTiny", "Test", packed)
                   .GetBool("task.input.packed_input"));
  const std::string logdir = RunWith(
      "packed", GetModelParams(kLm, "Train", packed + "; datasets.dev : 'text:/m/d.txt'"));
  Params dev = GetModelParams(kLm, "Dev");
  ApplyTrainedParams(dev, logdir, {}, false);
  ResolveDatasetInput(dev, "Dev", {});
  EXPECT_FALSE(dev.GetBool("task.input.packed_input"));
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
