// Model-parallel checkpoints (saver.h): each rank's file of the variables split over the ranks,
// their whole form on load, and any mesh's block of it on restore.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/checkpoint/saver.h"

namespace glossa {

std::string RankShardPath(const std::string& prefix, int rank, int ranks) {
  char tail[64];
  std::snprintf(tail, sizeof(tail), "-rank-%05d-of-%05d.safetensors", rank, ranks);
  return prefix + tail;
}

void SaveRankShard(const std::string& prefix, int rank, int ranks,
                   const std::map<std::string, at::Tensor>& tensors, bool whole) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    throw InvalidArgumentError(StrCat("SaveRankShard: rank ", rank, " of ", ranks));
  }
  SaveSafetensors(RankShardPath(prefix, rank, ranks), tensors,
                  {{"format_version", kCheckpointFormatVersion},
                   {"rank", StrCat(rank)},
                   {"ranks", StrCat(ranks)},
                   {"layout", whole ? "whole" : "blocks"}});
}

bool IsShardTensor(const std::string& name, const std::vector<std::string>& sharded) {
  return std::any_of(sharded.begin(), sharded.end(), [&](const std::string& s) {
    return name == s || name.rfind(s + "/", 0) == 0;
  });
}

void SliceShards(SafetensorsContents& contents, const std::vector<std::string>& sharded, int index,
                 int count) {
  if (count < 1 || index < 0 || index >= count) {
    throw InvalidArgumentError(StrCat("SliceShards: block ", index, " of ", count));
  }
  for (auto& [name, t] : contents.tensors) {
    if (!IsShardTensor(name, sharded)) continue;
    if (t.dim() == 0 || t.size(0) % count != 0) {
      throw InvalidArgumentError(StrCat("the checkpoint's '", name, "' ", t.sizes(),
                                        " does not split into ", count, " equal blocks along dim 0"));
    }
    const int64_t n = t.size(0) / count;
    t = t.slice(0, index * n, (index + 1) * n).contiguous();
  }
}

void MergeRankShards(const std::string& prefix, int ranks, SafetensorsContents& c) {
  std::map<std::string, std::vector<at::Tensor>> pieces;
  std::map<std::string, int> owner;  // whole tensors: the rank whose file holds them
  std::vector<std::string> names;  // rank 0's, in order
  std::string layout0;
  for (int r = 0; r < ranks; ++r) {
    const std::string path = RankShardPath(prefix, r, ranks);
    if (!FileExists(path)) {
      throw DataLossError(StrCat("checkpoint ", prefix, " is sharded over ", ranks,
                                 " ranks, but ", path, " is missing"));
    }
    SafetensorsContents s = LoadSafetensors(path);
    auto meta = [&](const char* k) {
      auto it = s.metadata.find(k);
      return it == s.metadata.end() ? std::string("(none)") : it->second;
    };
    if (meta("rank") != StrCat(r) || meta("ranks") != StrCat(ranks)) {
      throw DataLossError(StrCat(path, ": its metadata says rank ", meta("rank"), " of ",
                                 meta("ranks"), ", not ", r, " of ", ranks));
    }
    // Files before the layout key hold blocks.
    const std::string layout = meta("layout") == "(none)" ? "blocks" : meta("layout");
    if (layout != "blocks" && layout != "whole") {
      throw DataLossError(StrCat(path, ": unknown layout '", layout, "'"));
    }
    if (r == 0) layout0 = layout;
    if (layout != layout0) {
      throw DataLossError(StrCat(path, ": layout '", layout, "', but rank 0's file has '",
                                 layout0, "'"));
    }
    if (layout == "whole") {
      for (auto& [name, t] : s.tensors) {
        if (c.tensors.count(name)) {
          throw DataLossError(StrCat(path, ": '", name, "' is also in the chief's file of ", prefix));
        }
        if (auto it = owner.find(name); it != owner.end()) {
          throw DataLossError(StrCat(path, ": '", name, "' is also in rank ", it->second,
                                     "'s file"));
        }
        owner[name] = r;
        pieces[name].push_back(t);
      }
      continue;
    }
    std::vector<std::string> mine;
    for (auto& [name, t] : s.tensors) {
      mine.push_back(name);
      if (c.tensors.count(name)) {
        throw DataLossError(StrCat(path, ": '", name, "' is also in the chief's file of ", prefix));
      }
      if (r > 0 && pieces.count(name) &&
          (t.sizes().slice(1) != pieces[name][0].sizes().slice(1) ||
           t.scalar_type() != pieces[name][0].scalar_type() || t.dim() == 0)) {
        throw DataLossError(StrCat(path, ": '", name, "' is ", t.sizes(), " ",
                                   c10::toString(t.scalar_type()), ", rank 0 has ",
                                   pieces[name][0].sizes(), " ",
                                   c10::toString(pieces[name][0].scalar_type())));
      }
      pieces[name].push_back(t);
    }
    if (r == 0) names = mine;
    if (mine != names) {
      throw DataLossError(StrCat(path, " holds ", mine.size(), " tensors, not the ", names.size(),
                                 " of rank 0's file"));
    }
  }
  for (auto& [name, list] : pieces) c.tensors[name] = list.size() == 1 ? list[0] : at::cat(list, 0);
}

}  // namespace glossa
