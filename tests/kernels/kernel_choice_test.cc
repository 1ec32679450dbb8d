// Kernel choices by measurement (glossa/kernels/kernel_choice.h): the faster path is kept, each
// shape is measured once, a pinned mode decides without measuring, bad modes are refused.
#include "glossa/kernels/kernel_choice.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// Work that takes time in proportion to `n` (not a sleep: a busy machine slows both paths alike).
double Busy(int64_t n) {
  volatile double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc = acc + std::sqrt(static_cast<double>(i));
  return acc;
}

TEST(KernelChoice, KeepsTheFasterPathAndMeasuresEachShapeOnce) {
  SetKernelMode(KernelChoice::kBf16, KernelMode::kMeasure);
  SetKernelChoiceCache("");  // measure here, whatever earlier runs of this machine found
  for (const bool native_is_faster : {true, false}) {
    int calls = 0;
    auto run = [&](bool native) {
      ++calls;
      // The slow path does 100 times the work of the fast one.
      Busy(native == native_is_faster ? 20000 : 2000000);
    };
    const std::string shape = native_is_faster ? "a" : "b";
    EXPECT_EQ(ChooseNative(KernelChoice::kBf16, "test_op", shape, run), native_is_faster);
    // A warm-up and five timed calls per path; a BLAS win is measured again (two wins settle it).
    const int want = native_is_faster ? 12 : 24;
    EXPECT_EQ(calls, want);
    EXPECT_EQ(ChooseNative(KernelChoice::kBf16, "test_op", shape, run), native_is_faster);
    EXPECT_EQ(calls, want) << "a second call measured again";
  }
  bool found = false;
  for (const KernelDecision& d : KernelDecisions()) {
    if (d.op != "test_op" || d.shape != "a") continue;
    found = true;
    EXPECT_TRUE(d.measured);
    EXPECT_TRUE(d.native);
    EXPECT_LT(d.native_seconds, d.aten_seconds);
    EXPECT_NE(d.Describe().find("test_op a: native (float32 sgemm of widened bf16) (measured: aten"),
              std::string::npos)
        << d.Describe();
  }
  EXPECT_TRUE(found);
}

// A measured decision is appended to the cache file (under a lock), for the next runs of this
// machine; the cross-process reuse is checked end to end by trainer_e2e_test.sh.
TEST(KernelChoice, AMeasuredDecisionIsWrittenToTheCacheFile) {
  const std::string cache = testing::TempDir("kernel_choice") + "/sub/k.tsv";
  SetKernelMode(KernelChoice::kBf16, KernelMode::kMeasure);
  SetKernelChoiceCache(cache);
  EXPECT_TRUE(ChooseNative(KernelChoice::kBf16, "cache_op", "x1", [](bool native) { Busy(native ? 20000 : 2000000); }));
  SetKernelChoiceCache("");
  const std::string text = ReadFileToString(cache);
  EXPECT_NE(text.find(" | cache_op x1\tnative\t"), std::string::npos) << text;
  EXPECT_NE(text.find(" | aten threads "), std::string::npos) << text;
  EXPECT_NE(text.find(" family "), std::string::npos) << text;  // the CPU, not only its name
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
}

// ATen's (BLAS) path is taken only after winning two of three measurements: a first BLAS win is
// measured again (once more after a second win, twice after a loss), in the same process, and
// each measurement is a line of the cache file.
TEST(KernelChoice, ABlasWinIsMeasuredTwiceMoreAndNeedsTwoOfThree) {
  EXPECT_TRUE(SettleMeasurements(1, 0).native);
  EXPECT_FALSE(SettleMeasurements(1, 0).measure_again);
  EXPECT_TRUE(SettleMeasurements(1, 1).native);
  EXPECT_TRUE(SettleMeasurements(1, 1).measure_again);
  EXPECT_TRUE(SettleMeasurements(2, 1).measure_again);
  EXPECT_TRUE(SettleMeasurements(3, 1).native);
  EXPECT_FALSE(SettleMeasurements(3, 1).measure_again);
  EXPECT_FALSE(SettleMeasurements(2, 2).native);
  EXPECT_FALSE(SettleMeasurements(2, 2).measure_again);
  EXPECT_FALSE(SettleMeasurements(3, 2).native);

  const std::string cache = testing::TempDir("kernel_choice_settle") + "/k.tsv";
  SetKernelMode(KernelChoice::kBf16, KernelMode::kMeasure);
  SetKernelChoiceCache(cache);
  // BLAS faster in the first measurement only (12 calls), the native path after.
  int calls = 0;
  auto fluke = [&](bool native) {
    const bool blas_fast = calls++ < 12;
    Busy(native == blas_fast ? 2000000 : 20000);
  };
  EXPECT_TRUE(ChooseNative(KernelChoice::kBf16, "settle_op", "fluke", fluke));
  EXPECT_EQ(calls, 36);
  // BLAS faster every time: taken after two measurements (the third could not change it).
  calls = 0;
  auto blas = [&](bool native) {
    ++calls;
    Busy(native ? 2000000 : 20000);
  };
  EXPECT_FALSE(ChooseNative(KernelChoice::kBf16, "settle_op", "blas", blas));
  EXPECT_EQ(calls, 24);
  std::string text = ReadFileToString(cache);
  auto lines = [&](const std::string& what) {
    int64_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(lines(" | settle_op fluke\taten\t"), 1) << text;
  EXPECT_EQ(lines(" | settle_op fluke\tnative\t"), 2) << text;
  EXPECT_EQ(lines(" | settle_op blas\taten\t"), 2) << text;
  bool described = false;
  for (const KernelDecision& d : KernelDecisions()) {
    if (d.op == "settle_op" && d.shape == "fluke") {
      described = true;
      EXPECT_NE(d.Describe().find("; ATen's path faster in 1 of 3 measurements"), std::string::npos)
          << d.Describe();
    }
  }
  EXPECT_TRUE(described);
  // A cache that holds a single BLAS win (written before this rule) is measured again.
  const std::string one = text.substr(0, text.find('\n') + 1);  // the fluke's BLAS win
  ASSERT_NE(one.find(" | settle_op fluke\taten\t"), std::string::npos) << one;
  std::string old = one;
  old.replace(old.find("settle_op fluke"), 15, "settle_op older");
  AtomicWriteFile(cache, old);
  calls = 0;
  EXPECT_FALSE(ChooseNative(KernelChoice::kBf16, "settle_op", "older", blas));
  EXPECT_EQ(calls, 12);  // one more measurement, a second BLAS win
  text = ReadFileToString(cache);
  EXPECT_EQ(lines(" | settle_op older\taten\t"), 2) << text;
  // A settled decision (two BLAS wins) is read, not measured.
  std::string settled;
  for (const std::string& line : Split(text, '\n')) {
    if (line.find(" | settle_op older\t") == std::string::npos) continue;
    std::string l = line;
    l.replace(l.find("settle_op older"), 15, "settle_op after");
    settled += l + "\n";
  }
  AtomicWriteFile(cache, settled);
  calls = 0;
  EXPECT_FALSE(ChooseNative(KernelChoice::kBf16, "settle_op", "after", blas));
  EXPECT_EQ(calls, 0);
  SetKernelChoiceCache("");
}

// The cache's key tells two CPUs of one model name apart: VMs of Zen 4 and Zen 5 both say
// "AMD EPYC", and a decision measured on one was taken on the other.
TEST(KernelChoice, TheMachineKeyTellsCpusOfOneNameApart) {
  const std::string zen4 =
      "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
      "model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n"
      "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n";
  const std::string zen5 =
      "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
      "model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu avx2 avx512f avx512_bf16\n";
  const std::string zen4_fewer_flags =
      "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
      "model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu avx2 avx512f\n";
  const std::string a = CpuIdentity(zen4);
  EXPECT_EQ(a.rfind("AMD EPYC (AuthenticAMD family 25 model 17 stepping 1, flags ", 0), 0u) << a;
  EXPECT_NE(a, CpuIdentity(zen5));
  EXPECT_NE(a, CpuIdentity(zen4_fewer_flags));
  EXPECT_EQ(a, CpuIdentity(zen4));  // the second processor's block is not read
  EXPECT_EQ(CpuIdentity("").rfind("unknown cpu (? family ?", 0), 0u) << CpuIdentity("");
}

// A choice among named candidates timed outside the process (OpenBLAS's kernel sets): the
// fastest, unless what runs now (the first) is within 10%; cached, with lines of other keys,
// candidates or shapes in the file ignored; a candidate that could not be timed (+inf) loses.
TEST(KernelChoice, AChoiceAmongCandidatesKeepsTheFastestAndIsCached) {
  const std::string dir = testing::TempDir("kernel_choice_among");
  const std::string previous = KernelChoiceCachePath();
  SetKernelChoiceCache(dir + "/k.tsv");
  AtomicWriteFile(dir + "/k.tsv", "garbage\nkey1\tnot_a_candidate\tx=1\nkey1\ta\n");
  int calls = 0;
  std::map<std::string, double> t = {{"a", 0.010}, {"b", 0.002}, {"c", 0.005}};
  auto seconds = [&](const std::string& c) {
    ++calls;
    return t.at(c);
  };
  std::string d;
  EXPECT_EQ(ChooseAmongCached("key1", {"a", "b", "c"}, seconds, &d), "b");
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(d, "b (measured: a 10 ms, b 2 ms, c 5 ms)");
  EXPECT_EQ(ChooseAmongCached("key1", {"a", "b", "c"}, seconds, &d), "b");
  EXPECT_EQ(calls, 3) << "a cached decision was measured again";
  EXPECT_EQ(d, "b (measured: a 10 ms, b 2 ms, c 5 ms; as cached in " + dir + "/k.tsv)");
  t = {{"a", 0.010}, {"b", 0.0095}};  // a near tie keeps what runs now
  EXPECT_EQ(ChooseAmongCached("key2", {"a", "b"}, seconds, nullptr), "a");
  t = {{"a", std::numeric_limits<double>::infinity()}, {"b", 0.5}};
  EXPECT_EQ(ChooseAmongCached("key3", {"a", "b"}, seconds, nullptr), "b");
  t = {{"a", std::numeric_limits<double>::infinity()}, {"b", t["a"]}};
  EXPECT_EQ(ChooseAmongCached("key4", {"a", "b"}, seconds, nullptr), "a");
  EXPECT_THROW(ChooseAmongCached("key5", {}, seconds, nullptr), InvalidArgumentError);
  // A file cut off mid-line (a writer killed): the next decision goes on a line of its own and
  // is read back.
  SetKernelChoiceCache(dir + "/cut.tsv");
  AtomicWriteFile(dir + "/cut.tsv", "key6\tb\tb=0.00");
  t = {{"a", 0.010}, {"b", 0.002}};
  calls = 0;
  EXPECT_EQ(ChooseAmongCached("key7", {"a", "b"}, seconds, nullptr), "b");
  EXPECT_EQ(ChooseAmongCached("key7", {"a", "b"}, seconds, nullptr), "b");
  EXPECT_EQ(calls, 2) << "the decision appended after a cut line was not read back";
  SetKernelChoiceCache(previous);
}

// A probe that throws leaves the cache file unlocked (the next probe of the process, or of any
// run of this machine, would otherwise wait for it forever), and decides nothing.
TEST(KernelChoice, AProbeThatThrowsReleasesTheCacheFile) {
  const std::string dir = testing::TempDir("kernel_choice_throw");
  const std::string previous = KernelChoiceCachePath();
  SetKernelChoiceCache(dir + "/k.tsv");
  auto unlocked = [&] {
    const int fd = ::open((dir + "/k.tsv").c_str(), O_RDWR | O_CLOEXEC);
    const bool free = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (fd >= 0) ::close(fd);
    return free;
  };
  EXPECT_THROW(ChooseNative(KernelChoice::kGemmSplit, "throwing_op", "s",
                            [](bool) { throw InvalidArgumentError("probe failed"); }),
               InvalidArgumentError);
  EXPECT_TRUE(unlocked()) << "ChooseNative left the cache file locked";
  EXPECT_THROW(ChooseAmongCached("throwing_key", {"a", "b"},
                                 [](const std::string&) -> double {
                                   throw InvalidArgumentError("probe failed");
                                 },
                                 nullptr),
               InvalidArgumentError);
  EXPECT_TRUE(unlocked()) << "ChooseAmongCached left the cache file locked";
  int calls = 0;  // measured now: the throw decided nothing
  ChooseNative(KernelChoice::kGemmSplit, "throwing_op", "s", [&](bool) { ++calls; });
  EXPECT_GT(calls, 0);
  SetKernelChoiceCache(previous);
}

TEST(KernelChoice, APinnedModeDecidesWithoutMeasuring) {
  int calls = 0;
  auto run = [&](bool) { ++calls; };
  SetKernelMode(KernelChoice::kBf16, KernelMode::kNative);
  EXPECT_TRUE(ChooseNative(KernelChoice::kBf16, "pinned_op", "s", run));
  SetKernelMode(KernelChoice::kBf16, KernelMode::kAten);
  EXPECT_FALSE(ChooseNative(KernelChoice::kBf16, "pinned_op", "s", run));
  SetKernelMode(KernelChoice::kBf16, KernelMode::kMeasure);
  EXPECT_EQ(calls, 0);
}

// Each choice has its own mode and flag, and a decision names its paths.
TEST(KernelChoice, EachChoiceIsPinnedByItsOwnFlag) {
  auto run = [](bool) {};
  SetKernelMode(KernelChoice::kGemmSplit, KernelMode::kNative);
  SetKernelMode(KernelChoice::kRowKernel, KernelMode::kAten);
  EXPECT_TRUE(ChooseNative(KernelChoice::kGemmSplit, "split_op", "s", run));
  EXPECT_FALSE(ChooseNative(KernelChoice::kRowKernel, "row_op", "s", run));
  EXPECT_EQ(GetKernelMode(KernelChoice::kBf16), KernelMode::kMeasure);
  SetKernelMode(KernelChoice::kGemmSplit, KernelMode::kMeasure);
  SetKernelMode(KernelChoice::kRowKernel, KernelMode::kMeasure);
  std::string said;
  for (const KernelDecision& d : KernelDecisions()) {
    if (d.op == "split_op" || d.op == "row_op") said += d.Describe() + "\n";
  }
  EXPECT_EQ(said,
            "split_op s: native (row parts, a single-threaded GEMM per kernel thread), as "
            "--gemm_split says\n"
            "row_op s: aten (BLAS sgemm), as --row_kernels says\n");
  EXPECT_STREQ(KernelChoiceFlag(KernelChoice::kBf16), "--bf16_kernels");
}

TEST(KernelChoice, ModesParseAndBadOnesAreRefused) {
  EXPECT_EQ(ParseKernelMode("measure", "--bf16_kernels"), KernelMode::kMeasure);
  EXPECT_EQ(ParseKernelMode("aten", "--bf16_kernels"), KernelMode::kAten);
  EXPECT_EQ(ParseKernelMode("native", "--bf16_kernels"), KernelMode::kNative);
  EXPECT_ERROR_CONTAINS(ParseKernelMode("onednn", "--bf16_kernels"), InvalidArgumentError,
                        "--bf16_kernels must be measure, aten or native, got 'onednn'");
}

}  // namespace
}  // namespace glossa
