#include "glossa/base/file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "glossa/base/errors.h"

namespace glossa {
namespace {

std::string TempDir(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("glossa_file_" + std::to_string(::getpid())) / name;
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

}  // namespace
}  // namespace glossa
