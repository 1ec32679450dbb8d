// Lingvo's best-step logic over a metric history file (the BestStep op's test cases).
#include "glossa/model/metric_history.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "glossa/base/file.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

std::string HistoryFile(const std::string& name) {
  const auto dir = ::glossa::testing::TestRoot() / "history";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  RemoveFileIfExists(path);
  return path;
}

TEST(MetricHistory, BestStepMinimizingWithTolerance) {
  const std::string path = HistoryFile("min.history.txt");
  EXPECT_EQ(ComputeBestStep(path, 1.0, true).best_step, 0);  // no file yet: [0, 0]
  AppendMetricHistory(path, 1, 10);
  AppendMetricHistory(path, 2, 5);
  AppendMetricHistory(path, 3, 4);  // better by 1, not by more than the tolerance
  EXPECT_EQ(ReadFileToString(path), "1 10.000000\n2 5.000000\n3 4.000000\n");
  BestStep b = ComputeBestStep(path, 1.0, true);
  EXPECT_EQ(b.best_step, 2);
  EXPECT_EQ(b.last_step, 3);
  EXPECT_FALSE(ShouldStopEarly(b, 2, 0));
  AppendMetricHistory(path, 5, 4);
  b = ComputeBestStep(path, 1.0, true);
  EXPECT_EQ(b.best_step, 2);
  EXPECT_EQ(b.last_step, 5);
  EXPECT_TRUE(ShouldStopEarly(b, 2, 0));
  EXPECT_FALSE(ShouldStopEarly(b, 2, 6));  // min_steps
  EXPECT_FALSE(ShouldStopEarly(b, 0, 0));  // window 0: never
}

TEST(MetricHistory, BestStepMaximizingAndDuplicateSteps) {
  const std::string path = HistoryFile("max.history.txt");
  AppendMetricHistory(path, 1, 0.0);
  AppendMetricHistory(path, 2, 1.0);
  EXPECT_EQ(ComputeBestStep(path, 1.0, false).best_step, 1);
  AppendMetricHistory(path, 3, 2.5);
  EXPECT_EQ(ComputeBestStep(path, 1.0, false).best_step, 3);
  AppendMetricHistory(path, 5, 2.0);
  EXPECT_FALSE(ShouldStopEarly(ComputeBestStep(path, 1.0, false), 2, 0));
  AppendMetricHistory(path, 6, 1.0);
  EXPECT_TRUE(ShouldStopEarly(ComputeBestStep(path, 1.0, false), 2, 0));
  // A re-evaluated step: the first record wins.
  AppendMetricHistory(path, 3, -100.0);
  EXPECT_EQ(ComputeBestStep(path, 1.0, false).best_step, 3);
  EXPECT_EQ(ComputeBestStep(path, 1.0, true).best_step, 1);  // minimizing the same history
}

TEST(MetricHistory, MalformedLinesNameTheFileAndLine) {
  const std::string path = HistoryFile("bad.history.txt");
  AtomicWriteFile(path, "1 2.0\n2 x\n");
  EXPECT_ERROR_CONTAINS(ComputeBestStep(path, 0.0, true), DataLossError,
                        "bad.history.txt' line 2: bad value");
  AtomicWriteFile(path, "1 2.0 3\n");
  EXPECT_ERROR_CONTAINS(ComputeBestStep(path, 0.0, true), DataLossError, "line 1: not two fields");
  EXPECT_ERROR_CONTAINS(ComputeBestStep(path, -1.0, true), InvalidArgumentError,
                        "tolerance must be >= 0");
}

}  // namespace
}  // namespace glossa
