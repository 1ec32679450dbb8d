// What a task offers for inference (Lingvo's BaseTask.Inference()): named subgraphs, each with
// typed feeds and fetches. Values are a batch of strings (dtype "string", rank 1) or a tensor
// ("int64", "float32"; rank 0 for options, batch-major otherwise, batch and time dims dynamic).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace glossa {

struct TensorSpec {
  TensorSpec() = default;
  TensorSpec(std::string dtype, int64_t rank = 1, bool optional = false, std::string doc = "",
             bool bytes = false)
      : dtype(std::move(dtype)), rank(rank), optional(optional), doc(std::move(doc)),
        bytes(bytes) {}

  std::string dtype;  // "string", "int64" or "float32"
  int64_t rank = 1;
  bool optional = false;  // feeds only: may be left out (the task's default applies)
  std::string doc;
  // String feeds only: the strings are binary data (WAV files, images), not text: the Predictor
  // does not count their tokens against max_input_tokens.
  bool bytes = false;
  // Numeric feeds: the allowed range (every value; float feeds must also be finite). Outside it
  // the Predictor answers InvalidArgument naming the feed and the range.
  std::optional<double> min, max;
};

struct InferenceSubgraphSpec {
  std::map<std::string, TensorSpec> feeds, fetches;
  std::string doc;
};

// A fed or fetched value: a batch of strings, or a tensor.
struct InferenceValue {
  std::vector<std::string> strings;
  at::Tensor tensor;
  static InferenceValue Strings(std::vector<std::string> s) {
    InferenceValue v;
    v.strings = std::move(s);
    return v;
  }
  static InferenceValue Of(at::Tensor t) {
    InferenceValue v;
    v.tensor = std::move(t);
    return v;
  }
  bool is_strings() const { return !tensor.defined(); }
};
using InferenceMap = std::map<std::string, InferenceValue>;

}  // namespace glossa
