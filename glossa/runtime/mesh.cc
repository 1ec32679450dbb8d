// The device mesh over the ranks (glossa/runtime/mesh.h); the subgroups are Distributed::Subgroup.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <utility>
#include <chrono>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/runtime/mesh.h"
#include "glossa/runtime/distributed_impl.h"

namespace glossa {
MeshShape::Coordinates MeshShape::Of(int rank) const {
  Coordinates c;
  c.model = rank % model;
  c.expert = rank / model % expert;
  c.pipe = rank / model / expert % pipe;
  c.data = rank / model / expert / pipe;
  return c;
}

int MeshShape::RankAt(const Coordinates& c) const {
  return ((c.data * pipe + c.pipe) * expert + c.expert) * model + c.model;
}

std::string MeshShape::Describe() const {
  std::vector<std::string> axes;
  if (data > 1) axes.push_back(StrCat("data ", data));
  if (pipe > 1) axes.push_back(StrCat("pipe ", pipe));
  if (expert > 1) axes.push_back(StrCat("expert ", expert));
  if (model > 1) axes.push_back(StrCat("model ", model));
  return axes.empty() ? "data 1" : Join(axes, " x ");
}

MeshShape ParseMesh(const std::string& text, int world_size) {
  MeshShape m;
  if (text.empty()) {
    m.expert = world_size;
    return m;
  }
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(StrCat("--mesh='", text, "': ", why,
                                       " (the form is axis:size,... over the axes data, pipe, "
                                       "expert and model, the sizes' product the number of "
                                       "ranks; docs/distributed.md)"));
  };
  const std::vector<std::pair<const char*, int MeshShape::*>> axes = {
      {"data", &MeshShape::data}, {"pipe", &MeshShape::pipe}, {"expert", &MeshShape::expert},
      {"model", &MeshShape::model}};
  std::vector<std::string> seen;
  for (const std::string& part : Split(text, ',')) {
    const std::vector<std::string> kv = Split(part, ':');
    if (kv.size() != 2) throw bad(StrCat("'", part, "' is not axis:size"));
    int size = 0;
    try {
      size_t used = 0;
      size = std::stoi(kv[1], &used);
      if (used != kv[1].size()) throw std::invalid_argument(kv[1]);
    } catch (const std::exception&) {
      throw bad(StrCat("the size of '", kv[0], "' is not an integer: '", kv[1], "'"));
    }
    if (size < 1) throw bad(StrCat("the size of '", kv[0], "' must be >= 1, got ", size));
    auto axis = std::find_if(axes.begin(), axes.end(), [&](const auto& a) { return kv[0] == a.first; });
    if (axis == axes.end() || std::find(seen.begin(), seen.end(), kv[0]) != seen.end()) {
      throw bad(StrCat("unknown or repeated axis '", kv[0], "' (axes: data, pipe, expert, model)"));
    }
    seen.push_back(kv[0]);
    m.*(axis->second) = size;
  }
  if (m.world_size() != world_size) {
    throw bad(StrCat(m.Describe(), " = ", m.world_size(), " ranks, but the job has ", world_size));
  }
  return m;
}

Distributed* DistributedMesh::batch_group() {
  if (shape_.pipe == 1 && shape_.model == 1) return &world_;
  return shape_.expert > 1 ? batch_group_.get() : data_group();
}

std::unique_ptr<Distributed> DistributedMesh::FormAxis(const std::string& axis,
                                                       int MeshShape::Coordinates::*along,
                                                       int size) {
  if (size == 1 || size == world_.world_size()) return nullptr;
  std::vector<int> ranks;
  for (int i = 0; i < size; ++i) {
    MeshShape::Coordinates c = here_;
    c.*along = i;
    ranks.push_back(shape_.RankAt(c));
  }
  return world_.Subgroup(StrCat(axis, "/", ranks.front()), ranks);
}

DistributedMesh::DistributedMesh(Distributed& world, MeshShape shape)
    : world_(world), shape_(shape) {
  if (shape.world_size() != world.world_size()) {
    throw InvalidArgumentError(StrCat("mesh ", shape.Describe(), " does not cover the ",
                                      world.world_size(), " ranks"));
  }
  here_ = shape.Of(world.rank());
  // Every rank forms the groups in the same order: each group's ranks meet in its store.
  using C = MeshShape::Coordinates;
  data_group_ = FormAxis("data", &C::data, shape.data);
  if (shape.data > 1 && !data_group_) data_group_ = world.Subgroup("data/0", [&] {
    std::vector<int> all(world.world_size());
    for (int r = 0; r < world.world_size(); ++r) all[r] = r;
    return all;
  }());
  if (shape.expert > 1 && (shape.pipe > 1 || shape.model > 1)) {
    // The data and expert ranks of this stage and model shard: one per batch shard.
    std::vector<int> ranks;
    for (int r = 0; r < world.world_size(); ++r) {
      const MeshShape::Coordinates c = shape.Of(r);
      if (c.pipe == here_.pipe && c.model == here_.model) ranks.push_back(r);
    }
    batch_group_ = world.Subgroup(StrCat("batch/", ranks.front()), ranks);
  }
  pipe_group_ = FormAxis("pipe", &C::pipe, shape.pipe);
  expert_group_ = FormAxis("expert", &C::expert, shape.expert);
  model_group_ = FormAxis("model", &C::model, shape.model);
  if (shape.pipe > 1) pipe_axis_ = std::make_unique<DistributedMeshAxis>(pipe_group());
  if (shape.model > 1) model_axis_ = std::make_unique<DistributedMeshAxis>(model_group());
  if (shape.expert > 1) expert_axis_ = std::make_unique<DistributedMeshAxis>(expert_group());
}

}  // namespace glossa
