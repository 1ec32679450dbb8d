#include "glossa/checkpoint/checkpointer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/layers/linear.h"
#include "glossa/model/model_registry.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

std::string Dir(const std::string& name) {
  fs::path dir = ::glossa::testing::TestRoot() / "ckpter" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

class LinearProbeTask : public BaseTask {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseTask::Params();
    p.Set("cls", ClsOf<LinearProbeTask>());
    return p;
  }
  explicit LinearProbeTask(const glossa::Params& p) : BaseTask(p) {
    CreateChild("proj", FCLayer::Params().Set("input_dim", 2).Set("output_dim", 2));
  }
  NestedMap ComputePredictions(const NestedMap&, const NestedMap&) const override { return {}; }
  LossOutput ComputeLoss(const NestedMap&, const NestedMap&, const NestedMap&) const override {
    return {};
  }
};
GLOSSA_REGISTER_CLASS(LinearProbeTask, "glossa.testing.LinearProbeTask");

// A one-layer model (m/task/proj/w and m/task/proj/b) with `train_text` applied.
std::unique_ptr<BaseModel> Model(const std::string& train_text, int64_t seed,
                                 const ParamValue& init_rules = ParamValue::Dict{}) {
  Params p = SingleTaskModel::Params();
  p.Set("name", "m").Set("task", LinearProbeTask::Params());
  p.Set("task.random_seed", seed);
  p.Set("task.train.init_from_checkpoint_rules", init_rules);
  p.FromText(train_text);
  return InstantiateLayer<BaseModel>(p);
}

std::map<std::string, at::Tensor> Vars(const BaseModel& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [info, t] : m.AllVariables()) out[info.full_name] = t;
  return out;
}

TEST(Checkpointer, SavesOnTheSecondsCadenceAndOnceAtTheEnd) {
  const std::string dir = Dir("cadence");
  double now = 1000;
  auto model = Model(
      "task.train.save_interval_seconds : 60\ntask.train.async_checkpointing : False\n"
      "task.train.max_steps : 100",
      1);
  Checkpointer ckpt(dir, *model, nullptr, [&] { return now; });
  std::vector<std::string> log;
  EXPECT_EQ(ckpt.RestoreOrInitialize([&](const std::string& l) { log.push_back(l); }), 0);
  EXPECT_TRUE(log.empty());  // nothing to restore, no init rules
  now += 30;
  EXPECT_FALSE(ckpt.MaybeSave(5));
  now += 31;
  EXPECT_TRUE(ckpt.MaybeSave(6));
  EXPECT_FALSE(ckpt.MaybeSave(7));  // the interval restarts at the save
  ckpt.SaveIfNew(7);
  ckpt.SaveIfNew(7);  // already the latest: no second save
  ckpt.Wait();
  EXPECT_EQ(ReadCheckpointState(dir).all_model_checkpoint_paths,
            (std::vector<std::string>{"ckpt-00000006", "ckpt-00000007"}));
}

TEST(Checkpointer, SavesOnTheStepsCadenceAndRestoresWhereItStopped) {
  const std::string dir = Dir("steps");
  const std::string text =
      "task.train.save_interval_steps : 10\ntask.train.async_checkpointing : False\n"
      "task.train.max_steps : 100";
  auto model = Model(text, 1);
  {
    Checkpointer ckpt(dir, *model, nullptr, [] { return 0.0; });
    ckpt.RestoreOrInitialize([](const std::string&) {});
    EXPECT_FALSE(ckpt.MaybeSave(9));
    EXPECT_TRUE(ckpt.MaybeSave(10));
    EXPECT_FALSE(ckpt.MaybeSave(19));
    ckpt.Wait();
  }
  auto other = Model(text, 2);  // different initial values
  Checkpointer ckpt(dir, *other, nullptr, [] { return 0.0; });
  std::vector<std::string> log;
  EXPECT_EQ(ckpt.RestoreOrInitialize([&](const std::string& l) { log.push_back(l); }), 10);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("restored "), std::string::npos) << log[0];
  for (const auto& [name, t] : Vars(*model)) EXPECT_TRUE(at::equal(t, Vars(*other).at(name)));
  EXPECT_TRUE(ckpt.MaybeSave(20));  // the cadence counts from the restored step
}

TEST(Checkpointer, WarmStartsFromInitFromCheckpointRules) {
  const std::string src = Dir("warm_src"), dst = Dir("warm_dst");
  const std::string text = "task.train.async_checkpointing : False\ntask.train.max_steps : 100";
  auto source = Model(text, 1);
  {
    Checkpointer ckpt(src, *source, nullptr, [] { return 0.0; });
    ckpt.Save(3);
    ckpt.Wait();
  }
  // Only the weight: the bias keeps its initial value.
  const auto fresh = Vars(*Model(text, 2));
  ASSERT_FALSE(at::equal(fresh.at("m/task/proj/w"), Vars(*source).at("m/task/proj/w")));
  const at::Tensor b_before = fresh.at("m/task/proj/b").clone();
  const ParamValue rules = ParamValue::Dict{
      {Saver::CheckpointPrefix(src, 3),
       ParamValue::List{ParamValue::List{ParamValue::List{"(.*)/w", "%s/w"}}, ParamValue::List{}}}};
  auto warm = Model(text, 2, rules);
  Checkpointer ckpt(dst, *warm, nullptr, [] { return 0.0; });
  std::vector<std::string> log;
  EXPECT_EQ(ckpt.RestoreOrInitialize([&](const std::string& l) { log.push_back(l); }), 0);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0], "initialized 1 variables from init_from_checkpoint_rules");
  EXPECT_TRUE(at::equal(Vars(*warm).at("m/task/proj/w"), Vars(*source).at("m/task/proj/w")));
  EXPECT_TRUE(at::equal(Vars(*warm).at("m/task/proj/b"), b_before));
}

TEST(Checkpointer, MalformedInitRulesNameTheCheckpoint) {
  const ParamValue one_element =
      ParamValue::Dict{{"/ckpts/a", ParamValue::List{ParamValue::List{}}}};
  try {
    ParseInitFromCheckpointRules(one_element);
    FAIL() << "no error";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("init_from_checkpoint_rules['/ckpts/a']"),
              std::string::npos)
        << e.what();
  }
  const ParamValue bad_rule = ParamValue::Dict{
      {"/ckpts/b",
       ParamValue::List{ParamValue::List{ParamValue::List{"only_a_regex"}}, ParamValue::List{}}}};
  EXPECT_THROW(ParseInitFromCheckpointRules(bad_rule), InvalidArgumentError);
  const auto parsed = ParseInitFromCheckpointRules(ParamValue::Dict{
      {"/ckpts/c", ParamValue::List{ParamValue::List{ParamValue::List{"a/(.*)", "b/%s"}},
                                    ParamValue::List{"ignored.*"}}}});
  ASSERT_EQ(parsed.size(), 1u);
  EXPECT_EQ(parsed.at("/ckpts/c").rules,
            (std::vector<std::pair<std::string, std::string>>{{"a/(.*)", "b/%s"}}));
  EXPECT_EQ(parsed.at("/ckpts/c").ignore, (std::vector<std::string>{"ignored.*"}));
}

// Three checkpoints (10, 20, 30) of models with seeds 10, 20, 30 in `dir`.
void SaveThree(const std::string& dir, const std::string& text) {
  for (int64_t step : {10, 20, 30}) {
    auto m = Model(text, step);
    Checkpointer ckpt(dir, *m, nullptr, [] { return 0.0; });
    ckpt.Save(step);
    ckpt.Wait();
  }
}

TEST(Checkpointer, FallsBackFromACorruptLatestCheckpointAndSetsItAside) {
  const std::string dir = Dir("fallback");
  const std::string text = "task.train.async_checkpointing : False\ntask.train.max_steps : 100";
  SaveThree(dir, text);
  // Flip one bit of the latest checkpoint's data (the file's last byte): a checksum failure.
  const std::string latest = dir + "/ckpt-00000030.safetensors";
  std::string data = ReadFileToString(latest);
  data.back() ^= 0x01;
  AtomicWriteFile(latest, data);
  auto model = Model(text, 99);
  Checkpointer ckpt(dir, *model, nullptr, [] { return 0.0; });
  std::vector<std::string> log;
  EXPECT_EQ(ckpt.RestoreOrInitialize([&](const std::string& l) { log.push_back(l); }), 20);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_NE(log[0].find("WARNING: checkpoint " + dir + "/ckpt-00000030 cannot be restored"),
            std::string::npos)
      << log[0];
  EXPECT_NE(log[0].find("CRC32C"), std::string::npos) << log[0];
  EXPECT_EQ(log[1], "restored " + dir + "/ckpt-00000020 at step 20");
  EXPECT_TRUE(FileExists(latest + ".corrupt"));  // set aside, not deleted
  EXPECT_FALSE(FileExists(latest));
  EXPECT_EQ(ReadCheckpointState(dir).all_model_checkpoint_paths,
            (std::vector<std::string>{"ckpt-00000010", "ckpt-00000020"}));
  auto seed20 = Model(text, 20);
  for (const auto& [name, t] : Vars(*seed20)) EXPECT_TRUE(at::equal(t, Vars(*model).at(name)));
  // Every checkpoint bad: an error naming them, and nothing moved.
  const std::string all_bad = Dir("all_bad");
  SaveThree(all_bad, text);
  for (int64_t step : {10, 20, 30}) {
    AtomicWriteFile(StrCat(all_bad, "/ckpt-000000", step, ".safetensors"), "garbage");
  }
  Checkpointer none(all_bad, *model, nullptr, [] { return 0.0; });
  EXPECT_ERROR_CONTAINS(none.RestoreOrInitialize([](const std::string&) {}), DataLossError,
                        "no checkpoint in " + all_bad + " can be restored (ckpt-00000030: ");
  EXPECT_TRUE(FileExists(all_bad + "/ckpt-00000030.safetensors"));
}

TEST(Checkpointer, AnEmptyOrUnreadableStateFileIsRebuiltNotAFreshStart) {
  const std::string text = "task.train.async_checkpointing : False\ntask.train.max_steps : 100";
  for (const std::string& state : {std::string(""), std::string("model_checkpoint_path: \"ck"),
                                   std::string("\x01\x02 garbage\n")}) {
    SCOPED_TRACE(state);
    const std::string dir = Dir("state");
    SaveThree(dir, text);
    AtomicWriteFile(dir + "/checkpoint", state);
    auto model = Model(text, 99);
    Checkpointer ckpt(dir, *model, nullptr, [] { return 0.0; });
    std::vector<std::string> log;
    EXPECT_EQ(ckpt.RestoreOrInitialize([&](const std::string& l) { log.push_back(l); }), 30);
    ASSERT_EQ(log.size(), 2u);
    EXPECT_NE(log[0].find("rebuilt it from the 3 checkpoint(s) on disk"), std::string::npos)
        << log[0];
    EXPECT_EQ(ReadCheckpointState(dir).all_model_checkpoint_paths,
              (std::vector<std::string>{"ckpt-00000010", "ckpt-00000020", "ckpt-00000030"}));
  }
  // Unreadable and no checkpoints: an error, not a silent start.
  const std::string empty = Dir("state_only");
  AtomicWriteFile(empty + "/checkpoint", "bogus");
  auto model = Model(text, 1);
  Checkpointer ckpt(empty, *model, nullptr, [] { return 0.0; });
  EXPECT_ERROR_CONTAINS(ckpt.RestoreOrInitialize([](const std::string&) {}), DataLossError,
                        "and no checkpoint files are in");
}

TEST(Checkpointer, ALearnerSlotOfTheWrongDtypeNamesTheTensor) {
  const std::string dir = Dir("slot_dtype");
  const std::string text = "task.train.async_checkpointing : False\ntask.train.max_steps : 100";
  auto model = Model(text, 1);
  std::map<std::string, at::Tensor> tensors = Vars(*model);
  tensors["m/task/proj/w/Adam/m"] = at::zeros({2, 2}, at::kDouble);
  Saver({.dir = dir}).Save(5, tensors);
  Checkpointer ckpt(dir, *model, nullptr, [] { return 0.0; });
  EXPECT_ERROR_CONTAINS(ckpt.RestoreOrInitialize([](const std::string&) {}), InvalidArgumentError,
                        "checkpoint tensor 'm/task/proj/w/Adam/m' (a learner slot of "
                        "'m/task/proj/w') is Double [2, 2], but the variable is Float [2, 2]");
}

TEST(Checkpointer, AGlobalStepThatDisagreesWithTheNameFallsBack) {
  const std::string text = "task.train.async_checkpointing : False\ntask.train.max_steps : 100";
  for (int64_t crafted : {7, -5}) {
    SCOPED_TRACE(crafted);
    const std::string dir = Dir("global_step");
    SaveThree(dir, text);
    auto source = Model(text, 40);
    std::map<std::string, at::Tensor> tensors = Vars(*source);
    tensors["global_step"] = at::full({}, crafted, at::kLong);
    Saver({.dir = dir}).Save(40, tensors);
    auto model = Model(text, 99);
    Checkpointer ckpt(dir, *model, nullptr, [] { return 0.0; });
    std::vector<std::string> log;
    EXPECT_EQ(ckpt.RestoreOrInitialize([&](const std::string& l) { log.push_back(l); }), 30);
    ASSERT_EQ(log.size(), 2u);
    EXPECT_NE(log[0].find(crafted < 0 ? "global_step is -5 (negative)"
                                      : "global_step is 7, but the name says step 40"),
              std::string::npos)
        << log[0];
  }
}

TEST(Checkpointer, AHeaderDtypeSwapFallsBackLikeOtherCorruption) {
  const std::string dir = Dir("dtype_swap");
  const std::string text = "task.train.async_checkpointing : False\ntask.train.max_steps : 100";
  SaveThree(dir, text);
  const std::string latest = dir + "/ckpt-00000030.safetensors";
  std::string data = ReadFileToString(latest);
  const size_t at = data.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  data.replace(at, 5, "\"I32\"");
  AtomicWriteFile(latest, data);
  auto model = Model(text, 99);
  Checkpointer ckpt(dir, *model, nullptr, [] { return 0.0; });
  std::vector<std::string> log;
  EXPECT_EQ(ckpt.RestoreOrInitialize([&](const std::string& l) { log.push_back(l); }), 20);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_NE(log[0].find("fail their CRC32C checksum"), std::string::npos) << log[0];
}

TEST(Checkpointer, AStateFileNamingOnlyADeletedCheckpointDoesNotHideTheOthers) {
  const std::string dir = Dir("stale_state");
  const std::string text = "task.train.async_checkpointing : False\ntask.train.max_steps : 100";
  SaveThree(dir, text);
  CheckpointState s;
  s.model_checkpoint_path = "ckpt-00000050";
  s.all_model_checkpoint_paths = {"ckpt-00000050"};
  AtomicWriteFile(dir + "/checkpoint", FormatCheckpointState(s));
  EXPECT_EQ(ExistingCheckpoints(dir).all_model_checkpoint_paths,
            (std::vector<std::string>{"ckpt-00000010", "ckpt-00000020", "ckpt-00000030"}));
  auto model = Model(text, 99);
  Checkpointer ckpt(dir, *model, nullptr, [] { return 0.0; });
  std::vector<std::string> log;
  EXPECT_EQ(ckpt.RestoreOrInitialize([&](const std::string& l) { log.push_back(l); }), 30);
  EXPECT_EQ(log.back(), "restored " + dir + "/ckpt-00000030 at step 30");
  EXPECT_EQ(ReadCheckpointState(dir).model_checkpoint_path, "ckpt-00000030");
  EXPECT_EQ(ReadCheckpointState(dir).all_model_checkpoint_paths,
            (std::vector<std::string>{"ckpt-00000030"}));
}

}  // namespace
}  // namespace glossa
