// Where a pipeline's stages go (gpipe.h): stage ends from splits, which cells this process builds
// (all, or on a 'pipe' mesh axis its stage's), their whole-pipeline names, and unpipelined stacks
// for bundles.
#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/gpipe.h"
#include "glossa/layers/mesh.h"

namespace glossa {

std::vector<int64_t> EvenStageEnds(int64_t cells, int64_t stages) {
  std::vector<int64_t> ends;
  int64_t end = 0;
  for (int64_t s = 0; s < stages; ++s) {
    end += cells / stages + (s < cells % stages ? 1 : 0);
    ends.push_back(end);
  }
  return ends;
}

std::vector<int64_t> StageEndsFromSplits(const std::string& where, const ParamValue& splits,
                                         int64_t n) {
  std::vector<int64_t> ends;
  if (splits.is_list()) {
    if (splits.AsList().empty()) throw InvalidArgumentError(StrCat(where, ": splits is empty"));
    int64_t prev = 0;
    for (const auto& e : splits.AsList()) {
      const int64_t end = e.AsInt();
      if (end <= prev) {
        throw InvalidArgumentError(
            StrCat(where, ": splits must be increasing and > 0, got ", end, " after ", prev));
      }
      prev = end;
      ends.push_back(end);
    }
    if (prev != n) {
      throw InvalidArgumentError(
          StrCat(where, ": the last split must equal num_layers ", n, ", got ", prev));
    }
    return ends;
  }
  const int64_t stages = splits.AsInt();
  if (stages <= 0 || stages > n) {
    throw InvalidArgumentError(
        StrCat(where, ": splits must be in [1, num_layers ", n, "], got ", stages));
  }
  return EvenStageEnds(n, stages);
}

StagePlacement PlaceStages(const std::string& where, const std::vector<int64_t>& ends,
                           const BuildContext& context) {
  StagePlacement p;
  p.end = ends.back();
  MeshAxis* axis = context.axis("pipe");
  for (const char* name : {"model", "expert"}) {
    if (axis != nullptr || ends.size() == 1 || context.axis(name) == nullptr) continue;
    throw FailedPreconditionError(StrCat(
        where, " runs its ", ends.size(), " pipeline stages on threads of this process, whose '",
        name, "' axis exchanges would interleave in a different order on each rank: put the "
        "stages on ranks (--mesh=pipe:", ends.size(), ",", name, ":",
        context.axis(name)->size(), ") or set its splits to 1"));
  }
  if (axis == nullptr || axis->size() == 1) return p;
  const int64_t stages = static_cast<int64_t>(ends.size());
  if (axis->size() != stages) {
    throw FailedPreconditionError(
        StrCat(where, " has ", stages, " pipeline stage(s), but the mesh's 'pipe' axis has ",
               axis->size(), " ranks: a pipeline over ranks puts one stage on each (train it with "
               "--mesh=pipe:", stages, " on ", stages, " ranks, or set its splits to ",
               axis->size(), ")"));
  }
  p.axis = axis;
  p.stage = axis->index();
  p.first = p.stage == 0 ? 0 : ends[p.stage - 1];
  p.end = ends[p.stage];
  return p;
}

ParamValue::List NameCells(const ParamValue::List& cells, const std::string& prefix) {
  ParamValue::List out;
  int uid = 0;
  for (const auto& c : cells) {
    if (!c.is_params()) {
      out.push_back(c);
      continue;
    }
    glossa::Params p = c.AsParams().Copy();
    if (p.Contains("name") && p.GetString("name").empty()) p.Set("name", StrCat(prefix, "_", uid++));
    out.push_back(ParamValue(std::move(p)));
  }
  return out;
}


}  // namespace glossa
