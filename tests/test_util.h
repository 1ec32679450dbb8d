// Helpers shared by the unit tests.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "glossa/base/errors.h"
#include "glossa/core/params.h"
#include "glossa/layers/base_layer.h"

namespace glossa::testing {

inline std::string SourcePath(const std::string& relative) {
  return std::string(GLOSSA_SOURCE_DIR) + "/" + relative;
}

inline std::string ReadSourceFile(const std::string& relative) {
  std::ifstream in(SourcePath(relative), std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + SourcePath(relative));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// This test process's own directory, <tmp>/glossa_tests_XXXXXX, made by mkdtemp: never one that
// an earlier process left behind (pids repeat: a directory named by the pid could hold another
// run's files), and removed when the process exits (not by its forked children).
inline const std::filesystem::path& TestRoot() {
  static const pid_t owner = ::getpid();
  static const std::filesystem::path root = [] {
    std::string dir = (std::filesystem::temp_directory_path() / "glossa_tests_XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + dir + ": " + std::strerror(errno));
    }
    return std::filesystem::path(dir);
  }();
  // Registered once root is made, so that it runs before root is destroyed.
  static const bool removed_at_exit = std::atexit([] {
    if (::getpid() != owner) return;
    std::error_code ignored;
    std::filesystem::remove_all(root, ignored);
  }) == 0;
  (void)removed_at_exit;
  return root;
}

// A fresh, empty directory for this test process: <TestRoot()>/<name>.
inline std::string TempDir(const std::string& name) {
  const std::filesystem::path dir = TestRoot() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace glossa::testing

// Expects `stmt` to throw exactly ErrorType and the message (without the code prefix) to equal
// `expected_message`.
#define EXPECT_ERROR_MESSAGE(stmt, ErrorType, expected_message)           \
  do {                                                                    \
    try {                                                                 \
      stmt;                                                               \
      ADD_FAILURE() << "expected " #ErrorType " from: " #stmt;            \
    } catch (const ErrorType& e) {                                        \
      EXPECT_EQ(std::string(e.message()), std::string(expected_message)); \
    }                                                                     \
  } while (0)

// Expects `stmt` to throw ErrorType with a message containing `substring`.
#define EXPECT_ERROR_CONTAINS(stmt, ErrorType, substring)                          \
  do {                                                                             \
    try {                                                                          \
      stmt;                                                                        \
      ADD_FAILURE() << "expected " #ErrorType " from: " #stmt;                     \
    } catch (const ErrorType& e) {                                                 \
      EXPECT_NE(std::string(e.message()).find(substring), std::string::npos)       \
          << "message: " << e.message() << "\nexpected to contain: " << substring; \
    }                                                                              \
  } while (0)

namespace glossa {

// Whether two float32 tensors hold the same shape and the same bits.
inline bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return x.sizes() == y.sizes() &&
         std::memcmp(x.data_ptr<float>(), y.data_ptr<float>(), x.numel() * sizeof(float)) == 0;
}

// The layer `p` describes, named "layer" with random_seed 17, after `text` (params text) is
// applied: the layer tests' one way to build what they test.
template <typename T>
std::unique_ptr<T> Make(Params p, const std::string& text = "") {
  p.Set("name", "layer").Set("random_seed", 17);
  if (!text.empty()) p.FromText(text);
  return InstantiateLayer<T>(p);
}

}  // namespace glossa
