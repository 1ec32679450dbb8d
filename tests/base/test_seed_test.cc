// Every unit test starts with ATen's global generator seeded from its own name, so the random
// inputs a test draws (at::randn and the rest) do not depend on which tests ran before it, in
// what order, or on what a thread left over from another test drew meanwhile. GLOSSA_TEST_SEED=N
// mixes N into every test's seed: sweeping N finds the tests that pass only for lucky inputs. A
// failing test says which seed it ran with.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

namespace {

uint64_t RunSeed() {
  const char* env = std::getenv("GLOSSA_TEST_SEED");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (end == env || *end != '\0') {
    std::cerr << "GLOSSA_TEST_SEED=" << env << " is not a non-negative integer\n";
    std::exit(2);
  }
  return v;
}

// FNV-1a of "Suite.Name", then mixed with the run's seed (splitmix64's finalizer).
uint64_t TestSeed(const std::string& name, uint64_t run_seed) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = h + run_seed * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) >> 1;  // non-negative as an int64 too
}

std::string FullName(const testing::TestInfo& info) {
  return std::string(info.test_suite_name()) + "." + info.name();
}

class SeedEachTest : public testing::EmptyTestEventListener {
 public:
  void OnTestStart(const testing::TestInfo& info) override {
    at::manual_seed(TestSeed(FullName(info), RunSeed()));
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result() != nullptr && info.result()->Failed()) {
      std::cout << "[  SEED    ] " << FullName(info) << " drew its random inputs from seed "
                << TestSeed(FullName(info), RunSeed()) << " (GLOSSA_TEST_SEED=" << RunSeed()
                << "; --gtest_filter=" << FullName(info) << " reruns it with the same inputs)\n";
    }
  }
};

const bool kRegistered = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new SeedEachTest);
  return true;
}();

TEST(TestSeed, EachTestStartsFromItsOwnSeedWhateverRanBefore) {
  ASSERT_TRUE(kRegistered);
  // This test's generator was seeded at its start: its first draw is the seed's first draw,
  // although the tests before it drew from the same generator.
  const at::Tensor first = at::randn({4}, at::kDouble);
  at::manual_seed(TestSeed("TestSeed.EachTestStartsFromItsOwnSeedWhateverRanBefore", RunSeed()));
  EXPECT_TRUE(at::equal(first, at::randn({4}, at::kDouble)));
  // Different tests, and different runs, get different seeds.
  EXPECT_NE(TestSeed("A.B", 0), TestSeed("A.C", 0));
  EXPECT_NE(TestSeed("A.B", 0), TestSeed("A.B", 1));
}

}  // namespace
