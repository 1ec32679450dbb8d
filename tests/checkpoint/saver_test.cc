#include "glossa/checkpoint/saver.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "tests/test_util.h"

extern char** environ;

namespace glossa {
namespace {

namespace fs = std::filesystem;

std::string NewDir(const std::string& name) {
  fs::path dir = ::glossa::testing::TestRoot() / "saver" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::map<std::string, at::Tensor> Vars(double v) {
  return {{"lm/emb/w", at::full({4, 3}, v)},
          {"lm/emb/w/Adam/m", at::full({4, 3}, v / 2)},
          {"lm/emb/w/ExponentialMovingAverage", at::full({4, 3}, v / 4)}};
}

std::vector<std::string> CheckpointFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& f : ListDirectory(dir)) {
    if (f.rfind("ckpt-", 0) == 0) out.push_back(f);
  }
  return out;
}

TEST(Saver, SavesLoadsAndWritesTheStateFile) {
  const std::string dir = NewDir("basic");
  Saver saver({.dir = dir});
  const std::string prefix = saver.Save(1000, Vars(1.5), {{"input_position", "7"}});
  EXPECT_EQ(prefix, dir + "/ckpt-00001000");
  EXPECT_TRUE(FileExists(dir + "/ckpt-00001000.safetensors"));
  SafetensorsContents c = LoadLatestCheckpoint(dir);
  EXPECT_TRUE(at::equal(c.tensors.at("lm/emb/w"), at::full({4, 3}, 1.5)));
  EXPECT_EQ(c.tensors.at("global_step").item<int64_t>(), 1000);
  EXPECT_EQ(c.metadata.at("format_version"), kCheckpointFormatVersion);
  EXPECT_EQ(c.metadata.at("input_position"), "7");
  const CheckpointState s = ReadCheckpointState(dir);
  EXPECT_EQ(s.model_checkpoint_path, "ckpt-00001000");
  EXPECT_EQ(s.all_model_checkpoint_paths, std::vector<std::string>{"ckpt-00001000"});
  const std::string text = ReadFileToString(dir + "/checkpoint");
  EXPECT_NE(text.find("model_checkpoint_path: \"ckpt-00001000\"\n"), std::string::npos);
  EXPECT_NE(text.find("all_model_checkpoint_timestamps: "), std::string::npos);
}

TEST(Saver, ShardsLargeCheckpoints) {
  const std::string dir = NewDir("sharded");
  Saver saver({.dir = dir, .max_shard_bytes = 100});
  saver.Save(5, Vars(2.0));
  EXPECT_TRUE(FileExists(dir + "/ckpt-00000005.safetensors.index.json"));
  EXPECT_TRUE(FileExists(dir + "/ckpt-00000005-00000-of-00002.safetensors"));
  SafetensorsContents c = LoadLatestCheckpoint(dir);
  EXPECT_TRUE(at::equal(c.tensors.at("lm/emb/w/Adam/m"), at::full({4, 3}, 1.0)));
}

// A model-parallel checkpoint: 2 ranks each write their 2 experts (and the experts' Adam slot),
// the chief the rest with sharded_ranks = 2. It loads as the whole model, re-meshes onto 4 ranks
// or 1, and retention deletes its rank files with it. Missing, inconsistent or overlapping rank
// files are DataLoss naming the file.
TEST(Saver, RankShardedCheckpointsLoadWholeAndReMesh) {
  const std::string dir = NewDir("rank_sharded");
  const at::Tensor wi = at::arange(4 * 3, at::kFloat).view({4, 3});  // 4 experts
  const at::Tensor m = wi * 10;
  Saver saver({.dir = dir, .keep_latest_n = 1});
  const std::string prefix = Saver::CheckpointPrefix(dir, 7);
  for (int r = 0; r < 2; ++r) {
    SaveRankShard(prefix, r, 2,
                  {{"lm/moe/wi", wi.slice(0, 2 * r, 2 * r + 2)},
                   {"lm/moe/wi/Adam/m", m.slice(0, 2 * r, 2 * r + 2)}});
  }
  EXPECT_FALSE(Saver::LatestCheckpoint(dir));  // not visible before the chief's file
  saver.Save(7, {{"lm/gate", at::ones({3, 4})}}, {{kShardedRanksMetadata, "2"}});
  SafetensorsContents c = LoadCheckpoint(*Saver::LatestCheckpoint(dir));
  EXPECT_TRUE(at::equal(c.tensors.at("lm/moe/wi"), wi));
  EXPECT_TRUE(at::equal(c.tensors.at("lm/moe/wi/Adam/m"), m));
  EXPECT_TRUE(at::equal(c.tensors.at("lm/gate"), at::ones({3, 4})));
  // Onto 4 ranks: rank 3 holds expert 3 and its slot; the replicated gate stays whole.
  SafetensorsContents four = c;
  SlicePieces(four, {{"lm/moe/wi", ShardPiece{0, 3, 4}}});
  EXPECT_TRUE(at::equal(four.tensors.at("lm/moe/wi"), wi.slice(0, 3, 4)));
  EXPECT_TRUE(at::equal(four.tensors.at("lm/moe/wi/Adam/m"), m.slice(0, 3, 4)));
  EXPECT_TRUE(at::equal(four.tensors.at("lm/gate"), at::ones({3, 4})));
  SafetensorsContents three = c;
  EXPECT_THROW(SlicePieces(three, {{"lm/moe/wi", ShardPiece{0, 0, 3}}}), InvalidArgumentError);
  // Broken rank files.
  auto expect_data_loss = [&](const std::string& what, const std::string& needle) {
    try {
      LoadCheckpoint(prefix);
      ADD_FAILURE() << what << ": loaded";
    } catch (const DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  const std::string r1 = RankShardPath(prefix, 1, 2);
  fs::rename(r1, r1 + ".away");
  expect_data_loss("missing", "-rank-00001-of-00002.safetensors is missing");
  SaveSafetensors(r1, {{"lm/moe/wi", at::zeros({2, 5})}, {"lm/moe/wi/Adam/m", at::zeros({2, 3})}},
                  {{"rank", "1"}, {"ranks", "2"}});
  expect_data_loss("shape", "'lm/moe/wi' is [2, 5]");
  SaveSafetensors(r1, {{"lm/moe/wi", at::zeros({2, 3})}}, {{"rank", "1"}, {"ranks", "2"}});
  expect_data_loss("fewer tensors", "holds 1 tensors, not the 2");
  SaveSafetensors(r1, {{"lm/moe/wi", at::zeros({2, 3})}, {"lm/moe/wi/Adam/m", at::zeros({2, 3})}},
                  {{"rank", "0"}, {"ranks", "2"}});
  expect_data_loss("wrong rank", "says rank 0 of 2, not 1 of 2");
  SaveSafetensors(r1, {{"lm/moe/wi", at::zeros({2, 3})}, {"lm/moe/wi/Adam/m", at::zeros({2, 3})},
                       {"lm/gate", at::zeros({3, 4})}},
                  {{"rank", "1"}, {"ranks", "2"}});
  expect_data_loss("overlap", "'lm/gate' is also in the chief's file");
  fs::rename(r1 + ".away", r1);
  EXPECT_TRUE(at::equal(LoadCheckpoint(prefix).tensors.at("lm/moe/wi"), wi));
  // Retention (keep_latest_n = 1) deletes the rank files with their checkpoint.
  saver.Save(8, {{"lm/gate", at::ones({3, 4})}});
  EXPECT_FALSE(FileExists(RankShardPath(prefix, 0, 2)));
  EXPECT_FALSE(FileExists(r1));
  EXPECT_EQ(CheckpointFiles(dir), std::vector<std::string>{"ckpt-00000008.safetensors"});
}

// A pipeline's checkpoint: each stage's rank writes its layers whole (layout whole); the
// checkpoint loads as the whole model, and a file that repeats another's tensor, mixes layouts or
// names an unknown one is DataLoss naming it.
TEST(Saver, PipelineStageFilesLoadAsTheWholeModel) {
  const std::string dir = NewDir("pipeline_stages");
  Saver saver({.dir = dir, .keep_latest_n = 2});
  const std::string prefix = Saver::CheckpointPrefix(dir, 3);
  const at::Tensor w0 = at::full({2, 2}, 1.0), w1 = at::full({3}, 2.0);
  SaveRankShard(prefix, 0, 2, {{"lm/stack/x_layers_0/w", w0}, {"lm/stack/x_layers_0/w/m", w0 * 3}},
                /*whole=*/true);
  SaveRankShard(prefix, 1, 2, {{"lm/stack/x_layers_1/w", w1}}, /*whole=*/true);
  saver.Save(3, {{"lm/emb", at::ones({4})}}, {{kShardedRanksMetadata, "2"}});
  SafetensorsContents c = LoadCheckpoint(prefix);
  EXPECT_TRUE(at::equal(c.tensors.at("lm/stack/x_layers_0/w"), w0));
  EXPECT_TRUE(at::equal(c.tensors.at("lm/stack/x_layers_0/w/m"), w0 * 3));
  EXPECT_TRUE(at::equal(c.tensors.at("lm/stack/x_layers_1/w"), w1));
  EXPECT_TRUE(at::equal(c.tensors.at("lm/emb"), at::ones({4})));
  auto expect_data_loss = [&](const std::string& what, const std::string& needle) {
    try {
      LoadCheckpoint(prefix);
      ADD_FAILURE() << what << ": loaded";
    } catch (const DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  SaveRankShard(prefix, 1, 2, {{"lm/stack/x_layers_0/w", w0}}, /*whole=*/true);
  expect_data_loss("repeated", "'lm/stack/x_layers_0/w' is also in rank 0's file");
  SaveRankShard(prefix, 1, 2, {{"lm/emb", w1}}, /*whole=*/true);
  expect_data_loss("the chief's", "'lm/emb' is also in the chief's file");
  SaveRankShard(prefix, 1, 2, {{"lm/stack/x_layers_1/w", w1}}, /*whole=*/false);
  expect_data_loss("mixed layouts", "layout 'blocks', but rank 0's file has 'whole'");
  SaveSafetensors(RankShardPath(prefix, 1, 2), {{"lm/stack/x_layers_1/w", w1}},
                  {{"rank", "1"}, {"ranks", "2"}, {"layout", "diagonal"}});
  expect_data_loss("unknown layout", "unknown layout 'diagonal'");
}

// The layout every mesh writes now ("pieces"): each tensor of a rank file is block i of n of its
// variable along a dim, or the whole variable. A data x pipe x model checkpoint's files (2 stages x
// 2 model ranks): a stage's layer norm whole in its model-0 rank's file, a projection split along
// dim 1 over the model ranks (with its slot). It loads whole; SlicePieces cuts any rank's block
// (here a model axis of 4); a block missing or repeated, or pieces that disagree on their dim or
// do not join, are DataLoss naming the variable or file.
TEST(Saver, PiecesOfAnyMeshLoadAsTheWholeModel) {
  const std::string dir = NewDir("pieces");
  Saver saver({.dir = dir, .keep_latest_n = 2});
  const std::string prefix = Saver::CheckpointPrefix(dir, 4);
  const at::Tensor w = at::arange(3 * 8, at::kFloat).view({3, 8}), ln = at::full({3}, 2.0);
  const ShardLayout stage0_m0 = {{"lm/x_0/w", ShardPiece{1, 0, 2}}, {"lm/x_0/ln", ShardPiece{}}};
  const ShardLayout stage0_m1 = {{"lm/x_0/w", ShardPiece{1, 1, 2}}};
  SaveRankPieces(prefix, 0, 4, {{"lm/x_0/w", w.slice(1, 0, 4)}, {"lm/x_0/w/m", w.slice(1, 0, 4) * 2},
                                {"lm/x_0/ln", ln}}, stage0_m0);
  SaveRankPieces(prefix, 1, 4, {{"lm/x_0/w", w.slice(1, 4, 8)}, {"lm/x_0/w/m", w.slice(1, 4, 8) * 2}},
                 stage0_m1);
  SaveRankPieces(prefix, 2, 4, {{"lm/x_1/ln", ln * 3}}, {{"lm/x_1/ln", ShardPiece{}}});
  SaveRankPieces(prefix, 3, 4, {}, {});
  EXPECT_THROW(SaveRankPieces(prefix, 3, 4, {{"lm/y", ln}}, {}), InvalidArgumentError);
  saver.Save(4, {{"lm/emb", at::ones({4})}}, {{kShardedRanksMetadata, "4"}});
  SafetensorsContents c = LoadCheckpoint(prefix);
  EXPECT_TRUE(at::equal(c.tensors.at("lm/x_0/w"), w));
  EXPECT_TRUE(at::equal(c.tensors.at("lm/x_0/w/m"), w * 2));
  EXPECT_TRUE(at::equal(c.tensors.at("lm/x_0/ln"), ln));
  EXPECT_TRUE(at::equal(c.tensors.at("lm/x_1/ln"), ln * 3));
  EXPECT_TRUE(at::equal(c.tensors.at("lm/emb"), at::ones({4})));
  SafetensorsContents four = c;
  SlicePieces(four, {{"lm/x_0/w", ShardPiece{1, 2, 4}}, {"lm/x_0/ln", ShardPiece{}}});
  EXPECT_TRUE(at::equal(four.tensors.at("lm/x_0/w"), w.slice(1, 4, 6)));
  EXPECT_TRUE(at::equal(four.tensors.at("lm/x_0/w/m"), w.slice(1, 4, 6) * 2));
  EXPECT_TRUE(at::equal(four.tensors.at("lm/x_0/ln"), ln));
  std::string variable;
  ASSERT_NE(FindPiece(stage0_m0, "lm/x_0/w/m", &variable), nullptr);
  EXPECT_EQ(variable, "lm/x_0/w");
  EXPECT_EQ(FindPiece(stage0_m0, "lm/x_0/wx"), nullptr);
  auto expect_data_loss = [&](const std::string& what, const std::string& needle) {
    try {
      LoadCheckpoint(prefix);
      ADD_FAILURE() << what << ": loaded";
    } catch (const DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  SaveRankPieces(prefix, 1, 4, {{"lm/x_0/w", w.slice(1, 4, 8)}}, stage0_m0);
  expect_data_loss("a block twice", "block 0 of 'lm/x_0/w' is also in another rank's file");
  SaveRankPieces(prefix, 1, 4, {}, {});
  expect_data_loss("a block missing", "'lm/x_0/w' is split into 2 blocks along dim 1, but the rank "
                                      "files hold blocks 0");
  SaveRankPieces(prefix, 1, 4, {{"lm/x_0/w", w.slice(1, 4, 8)}, {"lm/x_0/w/m", w.slice(1, 4, 8)}},
                 {{"lm/x_0/w", ShardPiece{0, 1, 2}}});
  expect_data_loss("another dim", "but " + RankShardPath(prefix, 0, 4) + " has it as one of 2 "
                                  "along dim 1");
  SaveRankPieces(prefix, 1, 4, {{"lm/x_0/w", at::zeros({2, 4})}, {"lm/x_0/w/m", w.slice(1, 4, 8)}},
                 stage0_m1);
  expect_data_loss("not joining", "the blocks of 'lm/x_0/w'");
  SaveSafetensors(RankShardPath(prefix, 1, 4), {{"lm/x_0/w", w.slice(1, 4, 8)}},
                  {{"rank", "1"}, {"ranks", "4"}, {"layout", "pieces"}, {"pieces", "lm/x_0/w\t1\tx\t2"}});
  expect_data_loss("a bad line", "metadata pieces has a bad line");
}

// The retention rule, written out independently: keep the last n, and every checkpoint more than
// hours·3600 s after the last one kept by that rule (the first always).
std::vector<std::string> ExpectedKept(const std::vector<std::pair<double, std::string>>& all, int n,
                                      double hours) {
  std::vector<std::string> out;
  double last = -1e300;
  for (size_t i = 0; i < all.size(); ++i) {
    bool keep = n == 0 || i + n >= all.size();
    if (hours > 0 && (i == 0 || all[i].first > last + hours * 3600)) {
      keep = true;
      last = all[i].first;
    }
    if (keep) out.push_back(all[i].second);
  }
  return out;
}

TEST(Saver, RetentionKeepsLatestNAndEveryNHoursAcrossARestart) {
  const std::string dir = NewDir("retention");
  std::ofstream(dir + "/notes.txt") << "not a checkpoint";
  double now = 1000.0;
  std::vector<std::pair<double, std::string>> saved;
  auto options = SaverOptions{
      .dir = dir, .keep_latest_n = 2, .keep_every_n_hours = 2.0, .clock = [&] { return now; }};
  {
    auto saver = std::make_unique<Saver>(options);
    for (int i = 0; i < 20; ++i) {
      if (i == 11) saver = std::make_unique<Saver>(options);  // a restart part-way
      now += 1800;                                            // every half hour
      saver->Save(i * 100, Vars(i));
      saved.emplace_back(
          now, StrCat("ckpt-", std::string(8 - std::to_string(i * 100).size(), '0'), i * 100));
      const auto expected = ExpectedKept(saved, 2, 2.0);
      EXPECT_EQ(ReadCheckpointState(dir).all_model_checkpoint_paths, expected)
          << "after save " << i;
    }
  }
  const auto expected = ExpectedKept(saved, 2, 2.0);
  std::vector<std::string> files;
  for (const auto& p : expected) files.push_back(p + ".safetensors");
  EXPECT_EQ(CheckpointFiles(dir), files);
  EXPECT_TRUE(FileExists(dir + "/notes.txt"));  // anything else is left alone
  // keep_latest_n = 0 keeps all.
  const std::string all_dir = NewDir("keep_all");
  Saver keep_all({.dir = all_dir});
  for (int i = 0; i < 5; ++i) keep_all.Save(i, Vars(i));
  EXPECT_EQ(ReadCheckpointState(all_dir).all_model_checkpoint_paths.size(), 5u);
}

TEST(Saver, SanityChecksRefuseBadCheckpoints) {
  const std::string dir = NewDir("sanity");
  Saver saver({.dir = dir});
  saver.AddIsFiniteCheck(".*");
  saver.AddInRangeCheck("global_step", 0, 1000 + 100);
  saver.Save(10, Vars(1.0));
  const std::string state_before = ReadFileToString(dir + "/checkpoint");
  auto bad = Vars(1.0);
  bad["lm/emb/w"][0][0] = std::nan("");
  EXPECT_ERROR_CONTAINS(saver.Save(20, bad), AbortedError,
                        "variable 'lm/emb/w' has NaN or Inf values (IsFinite)");
  EXPECT_TRUE(FileExists(dir + "/ckpt-00000020.failed"));
  EXPECT_NE(ReadFileToString(dir + "/ckpt-00000020.failed").find("IsFinite"), std::string::npos);
  EXPECT_FALSE(FileExists(dir + "/ckpt-00000020.safetensors"));
  EXPECT_EQ(ReadFileToString(dir + "/checkpoint"), state_before);
  EXPECT_ERROR_CONTAINS(saver.Save(5000, Vars(1.0)), AbortedError,
                        "'global_step' is outside [0.0, 1100.0]");
}

TEST(Saver, AsyncSavesWriteInTheBackgroundAndSurfaceErrors) {
  const std::string dir = NewDir("async");
  Saver saver({.dir = dir, .async = true});
  at::Tensor w = at::full({1000}, 3.0);
  saver.Save(1, {{"w", w}});
  w.fill_(4.0);  // values were copied at Save time
  saver.Wait();
  EXPECT_TRUE(at::equal(LoadLatestCheckpoint(dir).tensors.at("w"), at::full({1000}, 3.0)));
  fs::remove_all(dir);  // the next write fails
  saver.Save(2, {{"w", w}});
  EXPECT_THROW(saver.Wait(), AbortedError);
}

TEST(Saver, RestoreReportsEveryMismatchAtOnce) {
  const std::string dir = NewDir("restore");
  Saver saver({.dir = dir});
  saver.Save(1, {{"a", at::ones({2})}, {"b", at::ones({3})}, {"c", at::ones({1}, at::kDouble)}});
  SafetensorsContents c = LoadLatestCheckpoint(dir);
  std::map<std::string, at::Tensor> vars = {{"a", at::zeros({2})}};
  RestoreVariables(c, vars);
  EXPECT_TRUE(at::equal(vars.at("a"), at::ones({2})));
  std::map<std::string, at::Tensor> wrong = {
      {"b", at::zeros({4})}, {"c", at::zeros({1})}, {"d", at::zeros({1})}};
  try {
    RestoreVariables(c, wrong);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("3 problem(s)"), std::string::npos) << m;
    EXPECT_NE(m.find("'b' has shape [3] in the checkpoint, [4] in the model"), std::string::npos)
        << m;
    EXPECT_NE(m.find("'c' is Double in the checkpoint, Float in the model"), std::string::npos)
        << m;
    EXPECT_NE(m.find("'d' is missing"), std::string::npos) << m;
  }
}

TEST(Saver, InitFromCheckpointRulesMapNamesWithFirstMatchingRule) {
  const std::string dir = NewDir("warm");
  Saver saver({.dir = dir});
  saver.Save(100, {{"old/enc/w", at::full({2}, 1.0)},
                   {"old/dec/w", at::full({2}, 2.0)},
                   {"old/softmax/w", at::full({3}, 3.0)}});
  std::map<std::string, at::Tensor> vars = {{"new/enc/w", at::zeros({2})},
                                            {"new/dec/w", at::zeros({2})},
                                            {"new/softmax/w", at::zeros({3})},
                                            {"new/extra", at::zeros({1})}};
  InitRules rules{{{"new/(enc|dec)/w", "old/%s/w"}, {"new/(.*)", "old/%s"}}, {"new/extra"}};
  auto done = InitFromCheckpointRules({{dir, rules}}, vars);
  EXPECT_EQ(done.size(), 3u);
  EXPECT_TRUE(at::equal(vars.at("new/dec/w"), at::full({2}, 2.0)));
  EXPECT_TRUE(at::equal(vars.at("new/softmax/w"), at::full({3}, 3.0)));
  EXPECT_TRUE(at::equal(vars.at("new/extra"), at::zeros({1})));
  InitRules nothing{{{"zzz/(.*)", "%s"}}, {}};
  EXPECT_ERROR_CONTAINS(InitFromCheckpointRules({{dir, nothing}}, vars), InvalidArgumentError,
                        "match no variable of the model");
  // Anchored: "enc/w" alone does not match "new/enc/w".
  InitRules partial{{{"enc/w", "old/enc/w"}}, {}};
  EXPECT_THROW(InitFromCheckpointRules({{dir, partial}}, vars), InvalidArgumentError);
}

TEST(Saver, MalformedStateFilesAreDataLoss) {
  const std::string dir = NewDir("bad_state");
  std::ofstream(dir + "/checkpoint")
      << "model_checkpoint_path: \"ckpt-1\"\nall_model_checkpoint_timestamps: abc\n";
  EXPECT_ERROR_CONTAINS(ReadCheckpointState(dir), DataLossError, "line 2: expected a number");
  std::ofstream(dir + "/checkpoint", std::ios::trunc) << "bogus_field: 1\n";
  EXPECT_ERROR_CONTAINS(ReadCheckpointState(dir), DataLossError, "unknown field 'bogus_field'");
  // An entry is a checkpoint's name in this directory: another run's ("../../other/train/..."),
  // an absolute path or an empty name would resume weights that are not this run's.
  for (const std::string entry : {"../../other/train/ckpt-00000005", "/abs/train/ckpt-1",
                                  "sub/ckpt-1", "..", "."}) {
    for (const std::string field : {"model_checkpoint_path", "all_model_checkpoint_paths"}) {
      std::ofstream(dir + "/checkpoint", std::ios::trunc)
          << "model_checkpoint_path: \"ckpt-1\"\n" << field << ": \"" << entry << "\"\n";
      EXPECT_ERROR_CONTAINS(ReadCheckpointState(dir), DataLossError,
                            StrCat("line 2: '", entry, "' is not a checkpoint name in ", dir));
    }
  }
}

// Run as a child process by the crash test: saves checkpoints of known values forever.
TEST(SaverCrash, ChildSavesForever) {
  const char* dir = std::getenv("GLOSSA_SAVER_CRASH_DIR");
  if (dir == nullptr) GTEST_SKIP() << "only run as the crash test's child";
  Saver saver({.dir = dir, .keep_latest_n = 3, .max_shard_bytes = 200000});
  for (int64_t step = 1;; ++step) {
    saver.Save(step, {{"w", at::full({100000}, static_cast<double>(step))},
                      {"v", at::full({30000}, static_cast<double>(-step))}});
  }
}

TEST(SaverCrash, KilledMidSaveLeavesOnlyCompleteCheckpoints) {
  // Kill points are random offsets after the child's first complete save, whatever the load:
  // waiting for that event (not a fixed delay) keeps the test honest on a busy machine.
  // The seed is printed; GLOSSA_TEST_SEED=<seed> replays a failing run's kill points.
  const char* given = std::getenv("GLOSSA_TEST_SEED");
  const uint32_t seed = given != nullptr ? static_cast<uint32_t>(std::strtoul(given, nullptr, 10))
                                         : std::random_device{}();
  std::printf("SaverCrash seed %u (replay: GLOSSA_TEST_SEED=%u)\n", seed, seed);
  SCOPED_TRACE(StrCat("GLOSSA_TEST_SEED=", seed));
  std::mt19937 rng(seed);
  for (int round = 0; round < 5; ++round) {
    const std::string dir = NewDir(StrCat("crash", round));
    std::string filter = "--gtest_filter=SaverCrash.ChildSavesForever";
    std::string env_dir = "GLOSSA_SAVER_CRASH_DIR=" + dir;
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e) envp.push_back(*e);
    envp.push_back(env_dir.data());
    envp.push_back(nullptr);
    std::string self = fs::read_symlink("/proc/self/exe").string();
    char* argv[] = {self.data(), filter.data(), nullptr};
    pid_t pid;
    ASSERT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    while (!FileExists(dir + "/checkpoint") && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // Somewhere within the next few saves (each writes ~1 MB in 2 shards, state file, deletes).
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution<int>(0, 200000)(rng)));
    ::kill(pid, SIGKILL);
    int status;
    ::waitpid(pid, &status, 0);
    const CheckpointState s = ReadCheckpointState(dir);
    ASSERT_FALSE(s.all_model_checkpoint_paths.empty()) << "the child saved nothing";
    for (const auto& path : s.all_model_checkpoint_paths) {
      SafetensorsContents c = LoadCheckpoint(dir + "/" + path);
      const int64_t step = c.tensors.at("global_step").item<int64_t>();
      EXPECT_EQ(path, Saver::CheckpointPrefix("x", step).substr(2));
      EXPECT_TRUE(at::equal(c.tensors.at("w"), at::full({100000}, static_cast<double>(step))));
      EXPECT_TRUE(at::equal(c.tensors.at("v"), at::full({30000}, static_cast<double>(-step))));
    }
    // Every complete checkpoint file set on disk loads too (a visible file is never half-written).
    for (const auto& f : ListDirectory(dir)) {
      if (f.size() > 28 && f.find(".safetensors") != std::string::npos &&
          f.find(".tmp.") == std::string::npos && f.find("-of-") != std::string::npos) {
        EXPECT_NO_THROW(LoadSafetensors(dir + "/" + f)) << f;
      }
    }
  }
}

}  // namespace
}  // namespace glossa
