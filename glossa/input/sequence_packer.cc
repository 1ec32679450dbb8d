#include "glossa/input/sequence_packer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/input/record_batcher.h"

namespace glossa {

SequencePacker::SequencePacker(PackingOptions options, std::map<std::string, double> pad_values)
    : options_(std::move(options)), pad_values_(std::move(pad_values)) {
  if (options_.rows <= 0) {
    throw InvalidArgumentError(StrCat("SequencePacker: rows must be > 0, got ", options_.rows));
  }
  if (options_.open_rows == 0) options_.open_rows = 4 * options_.rows;
  if (options_.open_rows < options_.rows) {
    throw InvalidArgumentError(StrCat("SequencePacker: open_rows (", options_.open_rows,
                                      ") must be at least rows (", options_.rows, ")"));
  }
  if (options_.row_length.empty()) {
    throw InvalidArgumentError("SequencePacker: no row length given");
  }
  for (const auto& [group, length] : options_.row_length) {
    if (length <= 0) {
      throw InvalidArgumentError(StrCat("SequencePacker: the row length of group '", group,
                                        "' must be > 0, got ", length));
    }
  }
}

std::string SequencePacker::GroupOf(const std::string& key) const {
  const size_t dot = key.find('.');
  std::string group = dot == std::string::npos ? "" : key.substr(0, dot);
  if (!options_.row_length.count(group)) {
    throw InvalidArgumentError(StrCat("SequencePacker: key '", key, "' is in group '", group,
                                      "', which has no row length"));
  }
  return group;
}

std::map<std::string, int64_t> SequencePacker::GroupLengths(const NestedMap& example) const {
  std::map<std::string, int64_t> lengths;
  for (const auto& [key, v] : example.FlattenItems()) {
    if (!v.is_tensor() || v.AsTensor().dim() != 1) {
      throw InvalidArgumentError(StrCat("SequencePacker: cannot pack '", key,
                                        "': only 1-D tensors can be laid end to end, got ",
                                        v.is_tensor() ? StrCat("shape ", v.AsTensor().sizes())
                                                      : std::string(v.KindName())));
    }
    const std::string group = GroupOf(key);
    const int64_t n = v.AsTensor().size(0);
    auto [it, inserted] = lengths.emplace(group, n);
    if (!inserted && it->second != n) {
      throw InvalidArgumentError(StrCat("SequencePacker: '", key, "' has length ", n,
                                        " but another tensor of group '", group, "' has ",
                                        it->second));
    }
  }
  return lengths;
}

bool SequencePacker::Fits(const NestedMap& example) const {
  for (const auto& [group, n] : GroupLengths(example)) {
    if (n > options_.row_length.at(group)) return false;
  }
  return true;
}

std::optional<NestedMap> SequencePacker::Add(NestedMap example) {
  const std::map<std::string, int64_t> lengths = GroupLengths(example);
  auto room = [&](const Row& row) {
    for (const auto& [group, n] : lengths) {
      auto it = row.used.find(group);
      if ((it == row.used.end() ? 0 : it->second) + n > options_.row_length.at(group)) {
        return false;
      }
    }
    return true;
  };
  // Best fit: the fullest row with room (the first of equals, so the packing is deterministic).
  Row* target = nullptr;
  for (Row& row : rows_) {
    if (room(row) && (target == nullptr || row.total > target->total)) target = &row;
  }
  std::optional<NestedMap> finished;
  if (!target) {
    if (static_cast<int64_t>(rows_.size()) >= options_.open_rows) finished = Flush();
    target = &rows_.emplace_back();
  }
  for (const auto& [group, n] : lengths) {
    target->used[group] += n;
    target->total += n;
  }
  target->examples.push_back(std::move(example));
  return finished;
}

NestedMap SequencePacker::PackRow(const Row& row) const {
  NestedMap out;
  const std::vector<std::string> keys = row.examples.front().Keys();
  for (const std::string& key : keys) {
    std::vector<at::Tensor> parts;
    for (const NestedMap& ex : row.examples) {
      if (!ex.Has(key)) {
        throw InvalidArgumentError(StrCat("SequencePacker: an example lacks '", key,
                                          "', which the first example of its row has"));
      }
      parts.push_back(ex.GetTensor(key));
    }
    out.Set(key, at::cat(parts));
  }
  // segment_ids and segment_pos of each group.
  for (const auto& [group, unused] : options_.row_length) {
    std::vector<int64_t> ids, pos;
    int64_t segment = 0;
    for (const NestedMap& ex : row.examples) {
      ++segment;
      int64_t n = 0;
      for (const auto& [key, v] : ex.FlattenItems()) {
        if (GroupOf(key) == group) n = v.AsTensor().size(0);
      }
      for (int64_t i = 0; i < n; ++i) {
        ids.push_back(segment);
        pos.push_back(i);
      }
    }
    const std::string prefix = group.empty() ? "" : group + ".";
    out.Set(prefix + "segment_ids", at::tensor(ids, at::kLong));
    out.Set(prefix + "segment_pos", at::tensor(pos, at::kLong));
  }
  return out;
}

std::optional<NestedMap> SequencePacker::Flush() {
  if (rows_.empty()) return std::nullopt;
  // The fullest rows (a stable sort: equals keep their order).
  std::stable_sort(rows_.begin(), rows_.end(),
                   [](const Row& a, const Row& b) { return a.total > b.total; });
  const size_t n = std::min<size_t>(rows_.size(), static_cast<size_t>(options_.rows));
  std::vector<NestedMap> packed;
  for (size_t i = 0; i < n; ++i) packed.push_back(PackRow(rows_[i]));
  rows_.erase(rows_.begin(), rows_.begin() + static_cast<std::ptrdiff_t>(n));
  std::map<std::string, double> pads = pad_values_;
  for (const auto& [group, unused] : options_.row_length) {
    const std::string prefix = group.empty() ? "" : group + ".";
    pads[prefix + "segment_ids"] = 0;
    pads[prefix + "segment_pos"] = 0;
  }
  return PadAndStack(packed, pads);
}

}  // namespace glossa
