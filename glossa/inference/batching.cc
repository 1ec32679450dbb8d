#include "glossa/inference/batching.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "glossa/base/strings.h"
#include "glossa/inference/json_io.h"

namespace glossa {

int64_t BatchSize(const InferenceMap& feeds) {
  for (const auto& [name, v] : feeds) {
    if (v.is_strings()) return static_cast<int64_t>(v.strings.size());
    if (v.tensor.dim() > 0) return v.tensor.size(0);
  }
  return 1;
}

std::string MergeKey(const std::string& subgraph, const InferenceMap& feeds) {
  std::string key = subgraph;
  for (const auto& [name, v] : feeds) {
    key += "|" + name + ":";
    if (v.is_strings()) {
      size_t longest = 0;
      for (const auto& s : v.strings) longest = std::max(longest, s.size());
      int bucket = 0;
      while (longest > 0) {
        ++bucket;
        longest >>= 1;
      }
      key += StrCat("s", bucket);
    } else if (v.tensor.dim() == 0) {
      key += TensorToJson(v.tensor).dump() + c10::toString(v.tensor.scalar_type());
    } else {
      key += StrCat(c10::toString(v.tensor.scalar_type()), v.tensor.sizes().slice(1));
    }
  }
  return key;
}

InferenceMap MergeFeeds(const std::vector<const InferenceMap*>& batch) {
  InferenceMap out;
  for (const auto& [name, first] : *batch[0]) {
    if (first.is_strings()) {
      std::vector<std::string> all;
      for (const auto& p : batch) {
        const auto& s = p->at(name).strings;
        all.insert(all.end(), s.begin(), s.end());
      }
      out[name] = InferenceValue::Strings(std::move(all));
    } else if (first.tensor.dim() == 0) {
      out[name] = first;
    } else {
      std::vector<at::Tensor> parts;
      for (const auto& p : batch) parts.push_back(p->at(name).tensor);
      out[name] = InferenceValue::Of(at::cat(parts, 0));
    }
  }
  return out;
}

InferenceMap SliceFetches(const InferenceMap& all, int64_t offset, int64_t n, int64_t total) {
  InferenceMap out;
  for (const auto& [name, v] : all) {
    if (v.is_strings()) {
      if (static_cast<int64_t>(v.strings.size()) == total) {
        out[name] = InferenceValue::Strings(std::vector<std::string>(
            v.strings.begin() + offset, v.strings.begin() + offset + n));
      } else {
        out[name] = v;
      }
    } else if (v.tensor.dim() > 0 && v.tensor.size(0) == total) {
      out[name] = InferenceValue::Of(v.tensor.narrow(0, offset, n));
    } else {
      out[name] = v;
    }
  }
  return out;
}

}  // namespace glossa
