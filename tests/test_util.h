// Helpers shared by the unit tests.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

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

// A fresh, empty directory for this test process: <tmp>/glossa_test_<pid>/<name>.
inline std::string TempDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("glossa_test_" + std::to_string(::getpid())) / name;
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
