// tf.train.Example parsing into a NestedMap of tensors from a feature spec (the analog of
// tf.io.parse_single_example with FixedLenFeature and VarLenFeature).
//
//   FeatureSpecs spec = {{"ids", FeatureSpec::VarLen(FeatureType::kInt64)},
//                        {"label", FeatureSpec::Fixed(FeatureType::kInt64, {}, {0})}};
//   NestedMap features = ParseExample(record, spec);   // ids: int64 [n], label: int64 []
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "glossa/core/nested_map.h"

namespace glossa {

namespace proto {
class Example;
}  // namespace proto

enum class FeatureType { kInt64, kFloat, kBytes };

struct FeatureSpec {
  FeatureType type = FeatureType::kInt64;
  bool var_len = false;
  std::vector<int64_t> shape;  // fixed-length features: the value's shape ([] = scalar)
  // Defaults for a missing fixed-length feature (numbers, or strings for bytes); one value is
  // broadcast. Without a default a missing fixed feature is InvalidArgument.
  std::optional<std::vector<double>> default_numbers;
  std::optional<std::vector<std::string>> default_bytes;

  static FeatureSpec Fixed(FeatureType type, std::vector<int64_t> shape = {},
                           std::optional<std::vector<double>> default_value = std::nullopt);
  static FeatureSpec VarLen(FeatureType type);
};
using FeatureSpecs = std::map<std::string, FeatureSpec>;

// Parses a serialized tf.train.Example. int64 features become int64 tensors, float features
// float32 tensors; bytes features become strings (a scalar) or lists of strings. Variable-length
// features are 1-D (empty when missing). Errors (InvalidArgument, DataLoss for unparsable bytes)
// name the feature and `where` (e.g. file and record number).
NestedMap ParseExample(std::string_view serialized, const FeatureSpecs& spec,
                       std::string_view where = "");

// Builds a serialized Example from int64, float and bytes features (for writers and tests).
struct ExampleBuilder {
  ExampleBuilder& Int64(const std::string& name, const std::vector<int64_t>& values);
  ExampleBuilder& Float(const std::string& name, const std::vector<float>& values);
  ExampleBuilder& Bytes(const std::string& name, const std::vector<std::string>& values);
  std::string Serialize() const;
  std::map<std::string, std::vector<int64_t>> int64s;
  std::map<std::string, std::vector<float>> floats;
  std::map<std::string, std::vector<std::string>> bytes;
};

}  // namespace glossa
