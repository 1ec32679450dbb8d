// The parallel plan a trainer runs under (issue 49): the device mesh the --mesh flag names, made
// once over the ranks, as one object per axis behind one interface. The executor asks the plan,
// never an axis by name: the build context the model is built with, which rows of the batch this
// rank reads and which ranks average metrics, where each rank-local variable's values sit in the
// whole variable and which rank writes them into checkpoints, the gradient sync's rule for them,
// the refusals of models an axis cannot train, and the summary line of each axis's traffic.
// Only MeshShape (runtime/mesh.h) knows the rank layout.
//
//   ParallelPlan plan(world, "data:2,model:2");
//   auto model = InstantiateLayer<BaseModel>(params, plan.Context());
//   plan.CheckModel(*model, flag, log);       // refusals
//   plan.PlaceVariables(*model);              // pieces, writers
//   plan.Configure(*gradient_sync);           // scale and norm weight of rank-local variables
//   for (const auto& line : plan.Summaries(steps)) log(line);
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "glossa/checkpoint/saver.h"
#include "glossa/layers/base_layer.h"
#include "glossa/model/base_model.h"
#include "glossa/runtime/gradient_sync.h"
#include "glossa/runtime/mesh.h"

namespace glossa {

// One axis of the mesh as the trainer sees it.
class PlanAxis {
 public:
  // `collection`: the variable collection this axis splits or places ("" for none: data).
  PlanAxis(std::string name, std::string collection, int size, int index,
           DistributedMeshAxis* axis)
      : name_(std::move(name)), collection_(std::move(collection)), size_(size), index_(index),
        axis_(axis) {}
  virtual ~PlanAxis() = default;
  const std::string& name() const { return name_; }
  int size() const { return size_; }
  int index() const { return index_; }
  // The exchanges among the axis's ranks; null for data (whose sums the gradient sync does).
  DistributedMeshAxis* axis() const { return axis_; }
  // Whether the axis splits (expert, model) or places (pipe) a variable of these collections.
  bool Holds(const std::vector<std::string>& collections) const;
  // Where this rank's values of a variable it holds sit in the whole one (a placed one: whole).
  virtual ShardPiece Piece(const WeightParams& params) const = 0;
  // What such a variable's gradient is multiplied by beyond 1 / data (experts: 1 / size, as
  // each expert's gradient already sums its axis's tokens).
  virtual double GradScale() const { return 1.0; }
  // Whether the axis's ranks read different rows of the batch (expert) or the same (pipe, model).
  virtual bool SplitsBatch() const { return false; }
  // Refuses (naming `mesh_flag` and what to do) a model the axis cannot train; may log.
  virtual void Check(const BaseModel& model, const std::string& mesh_flag,
                     const std::function<void(const std::string&)>& log) const;
  // The run's traffic on the axis over `steps` steps, one line ("" when there was none).
  virtual std::string Summary(double steps) const = 0;

 private:
  std::string name_, collection_;
  int size_, index_;
  DistributedMeshAxis* axis_;
};

class ParallelPlan {
 public:
  // Parses `mesh_flag` (ParseMesh: InvalidArgument naming --mesh) and forms the mesh's process
  // groups; every rank of `world` constructs it with the same flag.
  ParallelPlan(Distributed& world, const std::string& mesh_flag);
  const MeshShape& shape() const { return mesh_.shape(); }
  DistributedMesh& mesh() { return mesh_; }
  const MeshShape::Coordinates& here() const { return mesh_.here(); }
  // The axes of size > 1 other than data, in rank-layout order (pipe, expert, model).
  const std::vector<std::unique_ptr<PlanAxis>>& axes() const { return axes_; }
  // What the model is built with: every axis's exchanges under its name.
  BuildContext Context() const;
  // "mesh: data 2 x model 2 (groups of 2 ranks, each replicated 2 times)"; "" for a data-only
  // mesh.
  std::string Describe() const;
  // The batch: how many rank groups read different rows of it, and which this rank's is; the
  // ranks that average metrics (one per batch shard; null when every rank reads the same rows).
  int batch_shards() const { return mesh_.batch_shards(); }
  int batch_shard() const { return mesh_.batch_shard(); }
  Distributed* batch_group() { return mesh_.batch_group(); }
  // The replicas of this rank's values (the ranks differing in the data index); null: data 1.
  Distributed* data_group() { return mesh_.data_group(); }

  // After the model is built: each axis's refusals of a model it cannot train (naming
  // `mesh_flag`; an axis may log what it holds).
  void CheckModel(const BaseModel& model, const std::string& mesh_flag,
                  const std::function<void(const std::string&)>& log) const;
  // Every rank-local variable's piece (ShardLayout, what checkpoints and restores cut) and which
  // of them this rank writes.
  void PlaceVariables(const BaseLayer& model);
  const ShardLayout& layout() const { return layout_; }
  bool Writes(const std::string& variable) const { return writes_.count(variable) > 0; }
  // Checkpoint rank files: the ranks of data index 0 write them, file `checkpoint_file()` of
  // `checkpoint_files()` (-1 on the other ranks).
  int checkpoint_files() const;
  int checkpoint_file() const;

  // The gradient sync's rule for rank-local variables: summed over the ranks holding the same
  // values and scaled by 1 / data, each holding axis's GradScale and 1 / each batch-splitting
  // axis that does not hold it; in the norm, weighted by 1 / the ranks holding the same values.
  void Configure(DataParallelGradientSync& sync);
  // That rule for one rank-local variable: its scale, norm weight and the ranks that sum its
  // gradient (those holding the same values but reading other rows: the data group, or on a pipe
  // x expert mesh this stage's data x expert ranks for a stage's dense layers).
  DataParallelGradientSync::RankLocalSync RankLocal(const LearnerVariable& v);
  // Each axis's summary line over `steps` steps (those with traffic).
  std::vector<std::string> Summaries(double steps) const;

 private:
  DistributedMesh mesh_;
  std::vector<std::unique_ptr<PlanAxis>> axes_;
  ShardLayout layout_;
  std::set<std::string> writes_;
};

}  // namespace glossa
