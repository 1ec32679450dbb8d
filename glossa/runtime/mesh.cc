// Process subgroups and GShard's data × expert mesh (glossa/runtime/distributed.h).
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/distributed_impl.h"

namespace glossa {
namespace {

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

std::unique_ptr<Distributed> Distributed::Subgroup(const std::string& name,
                                                   const std::vector<int>& ranks) {
  const auto me = std::find(ranks.begin(), ranks.end(), options_.rank);
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (me == ranks.end() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      sorted.front() < 0 || sorted.back() >= options_.world_size) {
    throw InvalidArgumentError(StrCat("process group '", name, "': its ranks must be distinct "
                                      "ranks of the world of ", options_.world_size,
                                      " and include this rank (", options_.rank, ")"));
  }
  DistributedOptions o = options_;
  o.rank = static_cast<int>(me - ranks.begin());
  o.world_size = static_cast<int>(ranks.size());
  o.group = name;
  for (int r : ranks) o.world_ranks.push_back(options_.world_ranks.empty() ? r : options_.world_ranks[r]);
  auto sub = std::unique_ptr<Distributed>(new Distributed(o, NoRendezvous{}));
  try {
    sub->impl_->store = c10::make_intrusive<c10d::PrefixStore>(StrCat("glossa/group/", name, "/"),
                                                               impl_->store);
    auto pg_options = c10d::ProcessGroupGloo::Options::create(Millis(o.timeout_seconds));
    pg_options->devices.push_back(impl_->device);
    sub->impl_->device = impl_->device;
    sub->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(sub->impl_->store, o.rank,
                                                                 o.world_size, pg_options);
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) why = c10->what_without_backtrace();
    std::vector<std::string> listed;
    for (int r : o.world_ranks) listed.push_back(StrCat(r));
    throw AbortedError(StrCat("process group '", name, "' (world ranks ", Join(listed, ", "),
                              ") failed to form within ", o.timeout_seconds, " s: ", why));
  }
  return sub;
}

MeshShape::Coordinates MeshShape::Of(int rank) const {
  Coordinates c;
  c.expert = rank % expert;
  c.pipe = rank / expert % pipe;
  c.data = rank / expert / pipe;
  return c;
}

int MeshShape::RankAt(const Coordinates& c) const {
  return (c.data * pipe + c.pipe) * expert + c.expert;
}

std::string MeshShape::Describe() const {
  std::vector<std::string> axes;
  if (data > 1) axes.push_back(StrCat("data ", data));
  if (pipe > 1) axes.push_back(StrCat("pipe ", pipe));
  if (expert > 1) axes.push_back(StrCat("expert ", expert));
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
                                       " (the form is data:D,expert:E or data:D,pipe:S, the "
                                       "sizes' product the number of ranks)"));
  };
  bool seen_data = false, seen_expert = false, seen_pipe = false;
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
    if (kv[0] == "data" && !seen_data) {
      m.data = size;
      seen_data = true;
    } else if (kv[0] == "expert" && !seen_expert) {
      m.expert = size;
      seen_expert = true;
    } else if (kv[0] == "pipe" && !seen_pipe) {
      m.pipe = size;
      seen_pipe = true;
    } else {
      throw bad(StrCat("unknown or repeated axis '", kv[0], "' (axes: data, expert, pipe)"));
    }
  }
  if (seen_pipe) {
    if (seen_expert) throw bad("a pipe axis does not combine with an expert axis yet");
    if (static_cast<int64_t>(m.data) * m.pipe != world_size) {
      throw bad(StrCat("data ", m.data, " x pipe ", m.pipe, " = ",
                       static_cast<int64_t>(m.data) * m.pipe, " ranks, but the job has ",
                       world_size));
    }
    return m;
  }
  if (static_cast<int64_t>(m.data) * m.expert != world_size) {
    throw bad(StrCat("data ", m.data, " x expert ", m.expert, " = ",
                     static_cast<int64_t>(m.data) * m.expert, " ranks, but the job has ",
                     world_size));
  }
  return m;
}

void DistributedMesh::FormGrid(const std::string& axis, int MeshShape::Coordinates::*along,
                               std::unique_ptr<Distributed>& row_group) {
  if (shape_.data == 1) return;  // the axis is the world; no data axis
  const int size = axis == "pipe" ? shape_.pipe : shape_.expert;
  std::vector<int> row, column;
  for (int i = 0; i < size; ++i) {
    MeshShape::Coordinates c = here_;
    c.*along = i;
    row.push_back(shape_.RankAt(c));
  }
  for (int d = 0; d < shape_.data; ++d) {
    MeshShape::Coordinates c = here_;
    c.data = d;
    column.push_back(shape_.RankAt(c));
  }
  row_group = world_.Subgroup(StrCat(axis, "/", here_.data), row);
  data_group_ = world_.Subgroup(StrCat("data/", here_.*along), column);
}

DistributedMesh::DistributedMesh(Distributed& world, MeshShape shape)
    : world_(world), shape_(shape) {
  if (shape.world_size() != world.world_size() || (shape.pipe > 1 && shape.expert > 1)) {
    throw InvalidArgumentError(StrCat("mesh ", shape.Describe(), " does not cover the ",
                                      world.world_size(), " ranks"));
  }
  here_ = shape.Of(world.rank());
  data_index_ = here_.data;
  pipe_index_ = here_.pipe;
  expert_index_ = here_.expert;
  if (shape.pipe > 1) {
    // The S ranks sharing d are one pipeline, the D sharing s one stage's replicas.
    FormGrid("pipe", &MeshShape::Coordinates::pipe, pipe_group_);
    pipe_axis_ = std::make_unique<DistributedMeshAxis>(pipe_group());
    return;
  }
  FormGrid("expert", &MeshShape::Coordinates::expert, expert_group_);
  expert_axis_ = std::make_unique<DistributedMeshAxis>(expert_group());
}

}  // namespace glossa
