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

const ShardPiece* FindPiece(const ShardLayout& layout, const std::string& name,
                            std::string* variable) {
  // The variable itself, or the longest variable name `name` is a slot of ("<variable>/...").
  std::string at = name;
  while (true) {
    auto it = layout.find(at);
    if (it != layout.end()) {
      if (variable != nullptr) *variable = at;
      return &it->second;
    }
    const size_t slash = at.rfind('/');
    if (slash == std::string::npos) return nullptr;
    at.resize(slash);
  }
}

void SaveRankPieces(const std::string& prefix, int rank, int ranks,
                    const std::map<std::string, at::Tensor>& tensors, const ShardLayout& layout) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    throw InvalidArgumentError(StrCat("SaveRankPieces: rank ", rank, " of ", ranks));
  }
  std::string pieces;
  for (const auto& [name, t] : tensors) {
    const ShardPiece* p = FindPiece(layout, name);
    if (p == nullptr) {
      throw InvalidArgumentError(StrCat("SaveRankPieces: no piece for '", name, "'"));
    }
    pieces += StrCat(name, "\t", p->dim, "\t", p->index, "\t", p->count, "\n");
  }
  SaveSafetensors(RankShardPath(prefix, rank, ranks), tensors,
                  {{"format_version", kCheckpointFormatVersion},
                   {"rank", StrCat(rank)},
                   {"ranks", StrCat(ranks)},
                   {"layout", "pieces"},
                   {"pieces", pieces}});
}

void SlicePieces(SafetensorsContents& contents, const ShardLayout& layout) {
  for (auto& [name, t] : contents.tensors) {
    const ShardPiece* p = FindPiece(layout, name);
    if (p == nullptr || p->count == 1) continue;
    if (p->dim < 0 || p->dim >= t.dim() || t.size(p->dim) % p->count != 0 || p->index < 0 ||
        p->index >= p->count) {
      throw InvalidArgumentError(StrCat("the checkpoint's '", name, "' ", t.sizes(),
                                        " does not split into ", p->count,
                                        " equal blocks along dim ", p->dim));
    }
    const int64_t n = t.size(p->dim) / p->count;
    t = t.slice(p->dim, p->index * n, (p->index + 1) * n).contiguous();
  }
}

namespace {

// A "pieces" rank file's pieces: name -> (dim, index, count), DataLoss naming `path` for a line
// that is not one.
std::map<std::string, ShardPiece> ReadPieces(const std::string& path, const std::string& text) {
  std::map<std::string, ShardPiece> out;
  for (const std::string& line : Split(text, '\n')) {
    if (line.empty()) continue;
    const std::vector<std::string> f = Split(line, '\t');
    ShardPiece p;
    bool ok = f.size() == 4;
    try {
      if (ok) {
        p.dim = std::stoll(f[1]);
        p.index = std::stoi(f[2]);
        p.count = std::stoi(f[3]);
      }
    } catch (const std::exception&) {
      ok = false;
    }
    if (!ok || p.dim < 0 || p.count < 1 || p.index < 0 || p.index >= p.count) {
      throw DataLossError(StrCat(path, ": metadata pieces has a bad line '", line, "'"));
    }
    out[f[0]] = p;
  }
  return out;
}

// Every variable's pieces from the rank files, joined into `c` (DataLoss naming the file).
struct PieceSet {
  ShardPiece piece;
  std::map<int, at::Tensor> blocks;  // index -> block
  std::string first_path;
};

void JoinPieces(const std::string& prefix, std::map<std::string, PieceSet>& sets,
                SafetensorsContents& c) {
  for (auto& [name, set] : sets) {
    const ShardPiece& p = set.piece;
    if (static_cast<int>(set.blocks.size()) != p.count) {
      std::vector<std::string> have;
      for (const auto& [i, t] : set.blocks) have.push_back(StrCat(i));
      throw DataLossError(StrCat("checkpoint ", prefix, ": '", name, "' is split into ", p.count,
                                 " blocks along dim ", p.dim, ", but the rank files hold blocks ",
                                 Join(have, ", ")));
    }
    std::vector<at::Tensor> list;
    for (const auto& [i, t] : set.blocks) list.push_back(t);
    for (const at::Tensor& t : list) {
      auto a = t.sizes().vec(), b = list[0].sizes().vec();
      if (t.dim() > p.dim) a[p.dim] = b[p.dim] = 0;
      if (t.dim() <= p.dim || a != b || t.scalar_type() != list[0].scalar_type()) {
        throw DataLossError(StrCat("checkpoint ", prefix, ": the blocks of '", name, "' (",
                                   set.first_path, " and others) do not join along dim ", p.dim,
                                   ": ", list[0].sizes(), " and ", t.sizes()));
      }
    }
    c.tensors[name] = list.size() == 1 ? list[0] : at::cat(list, p.dim);
  }
}

// A "pieces" rank file's tensors into `sets` (DataLoss naming `path` for a tensor also in the
// chief's file, without a piece, or a block another file has too or places differently).
void AddPieces(const std::string& prefix, const std::string& path,
               const std::map<std::string, ShardPiece>& placed, SafetensorsContents& s,
               const SafetensorsContents& c, std::map<std::string, PieceSet>& piece_sets) {
  for (auto& [name, t] : s.tensors) {
    if (c.tensors.count(name)) {
      throw DataLossError(StrCat(path, ": '", name, "' is also in the chief's file of ", prefix));
    }
    auto it = placed.find(name);
    if (it == placed.end()) {
      throw DataLossError(StrCat(path, ": '", name, "' has no line in its metadata pieces"));
    }
    PieceSet& set = piece_sets[name];
    if (set.blocks.empty()) {
      set.piece = it->second;
      set.first_path = path;
    } else if (set.piece.dim != it->second.dim || set.piece.count != it->second.count) {
      throw DataLossError(StrCat(path, ": '", name, "' is block ", it->second.index, " of ",
                                 it->second.count, " along dim ", it->second.dim, ", but ",
                                 set.first_path, " has it as one of ", set.piece.count,
                                 " along dim ", set.piece.dim));
    }
    if (!set.blocks.emplace(it->second.index, t).second) {
      throw DataLossError(StrCat(path, ": block ", it->second.index, " of '", name,
                                 "' is also in another rank's file"));
    }
  }
}

}  // namespace

void MergeRankShards(const std::string& prefix, int ranks, SafetensorsContents& c) {
  std::map<std::string, std::vector<at::Tensor>> pieces;
  std::map<std::string, int> owner;  // whole tensors: the rank whose file holds them
  std::vector<std::string> names;  // rank 0's, in order
  std::map<std::string, PieceSet> piece_sets;  // "pieces" files
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
    if (layout != "blocks" && layout != "whole" && layout != "pieces") {
      throw DataLossError(StrCat(path, ": unknown layout '", layout, "'"));
    }
    if (r == 0) layout0 = layout;
    if (layout != layout0) {
      throw DataLossError(StrCat(path, ": layout '", layout, "', but rank 0's file has '",
                                 layout0, "'"));
    }
    if (layout == "pieces") {
      AddPieces(prefix, path, ReadPieces(path, meta("pieces")), s, c, piece_sets);
      continue;
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
  JoinPieces(prefix, piece_sets, c);
}

}  // namespace glossa
