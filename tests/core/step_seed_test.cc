#include "glossa/core/step_seed.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(StepSeed, GenerateSeedFromNameMatchesPythonHashlib) {
  EXPECT_EQ(GenerateSeedFromName("test"), 552009270);
  auto ref = nlohmann::json::parse(testing::ReadSourceFile("tests/reference/python_repr.json"));
  ASSERT_GE(ref["seeds"].size(), 5u);
  for (const auto& item : ref["seeds"]) {
    EXPECT_EQ(GenerateSeedFromName(item[0].get<std::string>()), item[1].get<int64_t>()) << item[0];
  }
}

TEST(StepSeed, GetIncStepSeedCountsFromTheResetValue) {
  ResetStepSeed();
  EXPECT_EQ(GetIncStepSeed(), 0);
  EXPECT_EQ(GetIncStepSeed(), 1);
  EXPECT_EQ(GetStepSeed(), 2);
  ResetStepSeed(100);
  EXPECT_EQ(GetIncStepSeed(), 100);
  EXPECT_EQ(GetIncStepSeed(), 101);
}

TEST(StepSeed, IncrementContextsMultiply) {
  ResetStepSeed(0);
  {
    StepSeedIncrementContext a(3);
    EXPECT_EQ(GetIncStepSeed(), 0);
    {
      StepSeedIncrementContext b(2);
      EXPECT_EQ(GetIncStepSeed(), 3);
    }
    EXPECT_EQ(GetIncStepSeed(), 9);
  }
  EXPECT_EQ(GetIncStepSeed(), 12);
  EXPECT_EQ(GetIncStepSeed(), 13);
  EXPECT_THROW(StepSeedIncrementContext(0), InvalidArgumentError);
}

TEST(StepSeed, StepSeedIsPerThread) {
  ResetStepSeed(5);
  int64_t other = -1;
  std::thread t([&] { other = GetIncStepSeed(); });
  t.join();
  EXPECT_EQ(other, 0);
  EXPECT_EQ(GetIncStepSeed(), 5);
}

TEST(GlobalStep, InnermostContextWinsThenTheProcessStep) {
  SetGlobalStep(7);
  EXPECT_EQ(GetGlobalStep(), 7);
  {
    GlobalStepContext outer(100);
    EXPECT_EQ(GetGlobalStep(), 100);
    {
      GlobalStepContext inner(200);
      EXPECT_EQ(GetGlobalStep(), 200);
    }
    EXPECT_EQ(GetGlobalStep(), 100);
  }
  EXPECT_EQ(GetGlobalStep(), 7);
  SetGlobalStep(0);
}

TEST(GlobalStep, OverWriteGlobalStepSubstitutesForSeeds) {
  GlobalStepContext step(10);
  EXPECT_EQ(GetOverWriteGlobalStep(), 10);
  SetOverWriteGlobalStep(3);
  EXPECT_EQ(GetOverWriteGlobalStep(), 3);
  EXPECT_EQ(GetGlobalStep(), 10);
  ResetStepSeed();
  EXPECT_EQ(GenerateStepSeedPair(std::nullopt), (std::array<int64_t, 2>{3, 0}));
  ClearOverWriteGlobalStep();
  EXPECT_EQ(GetOverWriteGlobalStep(), 10);
}

TEST(StepSeed, GenerateStepSeedPairAddsRandomSeedAndOpSeed) {
  GlobalStepContext step(1200);
  ResetStepSeed();
  EXPECT_EQ(GenerateStepSeedPair(std::nullopt), (std::array<int64_t, 2>{1200, 0}));
  EXPECT_EQ(GenerateStepSeedPair(1234), (std::array<int64_t, 2>{2434, 1235}));
  EXPECT_EQ(GenerateStepSeedPair(1234, 7), (std::array<int64_t, 2>{2441, 1243}));
  EXPECT_EQ(GenerateStepSeedPair(std::nullopt, 7), (std::array<int64_t, 2>{1207, 10}));
  // Replaying the step replays the seeds.
  ResetStepSeed();
  EXPECT_EQ(GenerateStepSeedPair(std::nullopt), (std::array<int64_t, 2>{1200, 0}));
}

TEST(StepSeed, SeedArithmeticWrapsAround) {
  GlobalStepContext step(1);
  ResetStepSeed(INT64_MAX);
  EXPECT_EQ(GenerateStepSeedPair(INT64_MAX), (std::array<int64_t, 2>{INT64_MIN, -2}));
  EXPECT_EQ(GetStepSeed(), INT64_MIN);
}

TEST(StepSeed, InferenceWithoutRandomSeedStillAdvancesTheStepSeed) {
  ResetStepSeed();
  GenerateStepSeedPair(std::nullopt, std::nullopt, /*is_inference=*/true);
  EXPECT_EQ(GetStepSeed(), 1);
  // With a random seed, inference is deterministic.
  GlobalStepContext step(0);
  ResetStepSeed();
  EXPECT_EQ(GenerateStepSeedPair(5, std::nullopt, true), (std::array<int64_t, 2>{5, 5}));
}

}  // namespace
}  // namespace glossa
