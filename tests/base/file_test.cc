#include "glossa/base/file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

std::string TempDir(const std::string& name) {
  const auto dir =
      ::glossa::testing::TestRoot() / "file" / name;
  std::filesystem::remove_all(dir);
  CreateDirectories(dir.string());
  return dir.string();
}

TEST(File, AtomicWriteReplacesWholeAndLeavesNoTemporaries) {
  const std::string dir = TempDir("atomic");
  const std::string path = JoinPath(dir, "f.bin");
  AtomicWriteFile(path, std::string("first\0with nul", 14));
  EXPECT_EQ(ReadFileToString(path), std::string("first\0with nul", 14));
  AtomicWriteFile(path, "second");
  EXPECT_EQ(ReadFileToString(path), "second");
  EXPECT_EQ(FileSize(path), 6u);
  // A writer that fails leaves the old contents and no temporary file behind.
  EXPECT_THROW(AtomicWriteFileWith(path, [](int) { throw std::runtime_error("boom"); }),
               std::runtime_error);
  EXPECT_EQ(ReadFileToString(path), "second");
  EXPECT_EQ(ListDirectory(dir), (std::vector<std::string>{"f.bin"}));
}

TEST(File, ReadErrorsNameTheFileAndTheLimit) {
  const std::string dir = TempDir("read");
  const std::string path = JoinPath(dir, "big");
  AtomicWriteFile(path, std::string(100, 'x'));
  EXPECT_EQ(ReadFileToString(path, 100).size(), 100u);
  try {
    ReadFileToString(path, 99);
    FAIL() << "no error over the limit";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ReadFileToString(JoinPath(dir, "missing")), NotFoundError);
  EXPECT_THROW(FileSize(JoinPath(dir, "missing")), NotFoundError);
  EXPECT_FALSE(FileExists(JoinPath(dir, "missing")));
  EXPECT_THROW(ListDirectory(JoinPath(dir, "missing")), NotFoundError);
}

TEST(File, ListCreateRemoveAndJoin) {
  const std::string dir = TempDir("list");
  CreateDirectories(JoinPath(dir, "a/b/c"));
  CreateDirectories(JoinPath(dir, "a/b/c"));  // idempotent
  AtomicWriteFile(JoinPath(dir, "z"), "");
  AtomicWriteFile(JoinPath(dir, "m"), "");
  EXPECT_EQ(ListDirectory(dir), (std::vector<std::string>{"a", "m", "z"}));  // sorted
  RemoveFileIfExists(JoinPath(dir, "m"));
  RemoveFileIfExists(JoinPath(dir, "m"));  // absent: no error
  EXPECT_EQ(ListDirectory(dir), (std::vector<std::string>{"a", "z"}));
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
}

TEST(File, TruncateTornLastLineKeepsCompleteLines) {
  const std::string dir = TempDir("torn");
  const std::string path = dir + "/m.jsonl";
  EXPECT_EQ(TruncateTornLastLine(path), 0u);  // absent
  AtomicWriteFile(path, "a\nbb\n");
  EXPECT_EQ(TruncateTornLastLine(path), 0u);
  EXPECT_EQ(ReadFileToString(path), "a\nbb\n");
  AtomicWriteFile(path, "a\nbb\nccc");
  EXPECT_EQ(TruncateTornLastLine(path), 3u);
  EXPECT_EQ(ReadFileToString(path), "a\nbb\n");
  // A torn line longer than the scan block, and a file with no newline at all.
  AtomicWriteFile(path, "x\n" + std::string(10000, 'y'));
  EXPECT_EQ(TruncateTornLastLine(path), 10000u);
  EXPECT_EQ(ReadFileToString(path), "x\n");
  AtomicWriteFile(path, "no newline");
  EXPECT_EQ(TruncateTornLastLine(path), 10u);
  EXPECT_EQ(ReadFileToString(path), "");
}

TEST(File, DirectoryLockIsExclusiveAndReleasedWithTheObject) {
  const std::string dir = TempDir("lock");
  {
    DirectoryLock first(dir, ".lock", "trainer");
    EXPECT_ERROR_CONTAINS(DirectoryLock(dir, ".lock", "trainer"), FailedPreconditionError,
                          StrCat("is in use by another trainer (pid ", ::getpid(), ")"));
  }
  EXPECT_NO_THROW(DirectoryLock(dir, ".lock", "trainer"));
}

TEST(File, OnlyRegularFilesAreRead) {
  const std::string dir = TempDir("regular");
  EXPECT_ERROR_CONTAINS(ReadFileToString(dir), InvalidArgumentError,
                        "file '" + dir + "' is a directory, not a regular file");
  EXPECT_ERROR_CONTAINS(ReadFileToString("/dev/zero"), InvalidArgumentError,
                        "'/dev/zero' is a character device");
  EXPECT_ERROR_CONTAINS(CheckRegularFile(dir + "/none", "record file"), NotFoundError,
                        "record file '" + dir + "/none' does not exist");
  AtomicWriteFile(dir + "/f", "x");
  EXPECT_NO_THROW(CheckRegularFile(dir + "/f", "record file"));
}

}  // namespace
}  // namespace glossa
