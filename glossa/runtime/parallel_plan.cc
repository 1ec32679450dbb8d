// The parallel plan (parallel_plan.h): the mesh's axes as the trainer sees them.
#include "glossa/runtime/parallel_plan.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/weight_init.h"
#include "glossa/optim/learner.h"

namespace glossa {
namespace {

template <typename... Args>
std::string Line(const char* format, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), format, args...);
  return buf;
}

// GShard's experts: a block of them along dim 0 of the expert variables; tokens exchanged by
// all-to-all; its ranks read their own rows of the batch.
class ExpertAxis : public PlanAxis {
 public:
  ExpertAxis(int size, int index, DistributedMeshAxis* axis)
      : PlanAxis("expert", kExpertShardedCollection, size, index, axis) {}
  ShardPiece Piece(const WeightParams&) const override { return {0, index(), size()}; }
  double GradScale() const override { return 1.0 / size(); }
  bool SplitsBatch() const override { return true; }
  std::string Summary(double steps) const override {
    if (axis()->exchanges() == 0) return "";
    // Every exchange of the run (the capacity agreements' few bytes included), per step.
    return Line("expert all-to-all over %d ranks: %.1f exchanges per step, %.2f MB per step "
                "(this rank's inputs), the largest %.0f bytes",
                size(), axis()->exchanges() / steps, axis()->bytes() / 1e6 / steps,
                static_cast<double>(axis()->max_bytes()));
  }
};

// GPipe's stages: rank s holds stage s's layers whole; the pipeline's ranks share its batch.
class PipeAxis : public PlanAxis {
 public:
  PipeAxis(int size, int index, DistributedMeshAxis* axis)
      : PlanAxis("pipe", kPipelineStageCollection, size, index, axis) {}
  ShardPiece Piece(const WeightParams&) const override { return {}; }
  void Check(const BaseModel& model, const std::string& mesh_flag,
             const std::function<void(const std::string&)>& log) const override;
  std::string Summary(double steps) const override {
    if (axis()->sends() == 0) return "";
    // Rank 0 (stage 0) sends its micro-batches' activations on; the gradients come back to it.
    return Line("pipeline over %d ranks: stage 0 sent %.1f micro-batches per step, %.2f MB per "
                "step",
                size(), axis()->sends() / steps, axis()->send_bytes() / 1e6 / steps);
  }
};

void PipeAxis::Check(const BaseModel& model, const std::string& mesh_flag,
                     const std::function<void(const std::string&)>& log) const {
  int64_t stage_bytes = 0, stage_vars = 0;
  const std::vector<LearnerVariable> all = LearnerVariables(model);
  for (const auto& v : all) {
    if (!v.pipeline_stage) continue;
    ++stage_vars;
    stage_bytes += v.value.numel() * static_cast<int64_t>(v.value.element_size());
  }
  if (stage_vars == 0) {
    throw InvalidArgumentError(StrCat(
        "--mesh=", mesh_flag, ": the model has no pipelined layer to place on the ", size(),
        " ranks (set splits: ", size(), " on its TransformerStack, or use a PipeliningLayer / "
        "GPipeTransformerStack)"));
  }
  log(StrCat("pipeline stage ", index(), " of ", size(), ": ", stage_vars, " variables (",
             stage_bytes, " bytes) on this rank"));
  // Every stage's backward must run on every step (its ranks wait for each other's gradients):
  // a learner that leaves some stage variables out could skip a rank's.
  for (const auto& name : model.task_names()) {
    std::set<std::string> selected;
    for (const auto& v : model.GetTask(name).learner().SelectVariables(all)) {
      selected.insert(v.name);
    }
    for (const auto& v : all) {
      if (v.pipeline_stage && !selected.count(v.name)) {
        throw InvalidArgumentError(StrCat(
            "--mesh=", mesh_flag, ": task '", name, "' does not train '", v.name,
            "' (non-trainable, or left out by its learner's variable filter), but on a pipe mesh "
            "every stage variable must train: the stages' backward passes wait on each other. "
            "Train this model in one process, or train every layer of the pipeline"));
      }
    }
  }
}

// Tensor parallelism: a block of heads, hidden units or vocabulary along the dim each variable's
// WeightParams name; its ranks share the batch.
class ModelAxis : public PlanAxis {
 public:
  // `whole_model`: every rank builds the whole model (no pipe axis), so each can tell alone
  // whether the model splits anything.
  ModelAxis(int size, int index, DistributedMeshAxis* axis, bool whole_model)
      : PlanAxis("model", kModelShardedCollection, size, index, axis), whole_model_(whole_model) {}
  ShardPiece Piece(const WeightParams& params) const override {
    return {params.shard_dim, index(), size()};
  }
  // A model axis over a model that splits nothing would have its ranks compute the same thing.
  void Check(const BaseModel& model, const std::string& mesh_flag,
             const std::function<void(const std::string&)>&) const override {
    if (!whole_model_) return;
    for (const auto& v : LearnerVariables(model)) {
      if (v.model_sharded) return;
    }
    throw InvalidArgumentError(StrCat(
        "--mesh=", mesh_flag, ": the model splits no variable over the 'model' axis, so its ",
        size(), " ranks would compute the same thing: give its layers weight_split_dims_mapping "
        "over 'model' (TransformerLayer::SetTensorParallel; docs/distributed.md, \"Tensor "
        "parallelism\"), or leave 'model' out of the mesh"));
  }

 private:
  bool whole_model_;
  std::string Summary(double steps) const override {
    if (axis()->reductions() == 0) return "";
    // The blocks' forward sums and the replicated inputs' backward sums.
    return Line("model all-reduce over %d ranks: %.1f per step, %.2f MB per step (this rank's)",
                size(), axis()->reductions() / steps, axis()->reduce_bytes() / 1e6 / steps);
  }
};

}  // namespace

bool PlanAxis::Holds(const std::vector<std::string>& collections) const {
  return !collection_.empty() &&
         std::find(collections.begin(), collections.end(), collection_) != collections.end();
}

void PlanAxis::Check(const BaseModel&, const std::string&,
                     const std::function<void(const std::string&)>&) const {}

ParallelPlan::ParallelPlan(Distributed& world, const std::string& mesh_flag)
    : mesh_(world, ParseMesh(mesh_flag, world.world_size())) {
  const MeshShape& s = mesh_.shape();
  const MeshShape::Coordinates& at = mesh_.here();
  if (s.pipe > 1) axes_.push_back(std::make_unique<PipeAxis>(s.pipe, at.pipe, mesh_.pipe_axis()));
  if (s.expert > 1) {
    axes_.push_back(std::make_unique<ExpertAxis>(s.expert, at.expert, mesh_.expert_axis()));
  }
  if (s.model > 1) {
    axes_.push_back(
        std::make_unique<ModelAxis>(s.model, at.model, mesh_.model_axis(), s.pipe == 1));
  }
}

BuildContext ParallelPlan::Context() const {
  BuildContext context;
  for (const auto& a : axes_) context.WithAxis(a->name(), a->axis());
  return context;
}

std::string ParallelPlan::Describe() const {
  const MeshShape& s = shape();
  if (axes_.empty()) return "";
  if (s.data == 1) return StrCat("mesh: ", s.Describe());
  const char* groups = s.pipe > 1 ? "pipelines" : s.expert > 1 ? "expert groups" : "model groups";
  return StrCat("mesh: ", s.Describe(), " (", groups, " of ", s.world_size() / s.data,
                " ranks, each replicated ", s.data, " times)");
}

void ParallelPlan::CheckModel(const BaseModel& model, const std::string& mesh_flag,
                              const std::function<void(const std::string&)>& log) const {
  for (const auto& a : axes_) a->Check(model, mesh_flag, log);
}

void ParallelPlan::PlaceVariables(const BaseLayer& model) {
  layout_.clear();
  writes_.clear();
  const MeshShape::Coordinates& at = mesh_.here();
  for (const auto& [info, value] : model.AllVariables()) {
    const auto& c = info.params.collections;
    bool held = false, writer = at.data == 0;
    ShardPiece piece;  // whole, unless an axis splits it
    for (const auto& a : axes_) {
      if (a->Holds(c)) {
        held = true;
        if (a->Piece(info.params).count > 1) piece = a->Piece(info.params);
      } else if (a->index() != 0) {
        writer = false;  // the values are the same on this axis: index 0 writes them
      }
    }
    if (!held) continue;
    layout_[info.full_name] = piece;
    if (writer) writes_.insert(info.full_name);
  }
}

int ParallelPlan::checkpoint_files() const {
  return static_cast<int>(shape().world_size() / shape().data);
}

int ParallelPlan::checkpoint_file() const {
  // Data is the outermost axis: the ranks of data index 0 are the first W / D.
  if (here().data != 0) return -1;
  MeshShape::Coordinates c = here();
  return shape().RankAt(c);
}

DataParallelGradientSync::RankLocalSync ParallelPlan::RankLocal(const LearnerVariable& v) {
  const MeshShape& s = shape();
  DataParallelGradientSync::RankLocalSync r;
  r.scale = 1.0 / s.data;
  double copies = static_cast<double>(s.world_size());
  r.group = mesh_.data_group();
  for (const auto& a : axes_) {
    if (a->Holds(v.collections)) {
      r.scale *= a->GradScale();
      copies /= a->size();
    } else if (a->SplitsBatch()) {
      // Replicated over an axis whose ranks read other rows (a pipeline stage's dense layers on
      // an expert axis): averaged over them too, with the data ranks (this stage's batch group).
      r.scale /= a->size();
      r.group = mesh_.batch_group();
    }
  }
  r.norm_weight = 1.0 / copies;
  return r;
}

void ParallelPlan::Configure(DataParallelGradientSync& sync) {
  sync.SetRankLocalRule([this](const LearnerVariable& v) { return RankLocal(v); });
}

std::vector<std::string> ParallelPlan::Summaries(double steps) const {
  std::vector<std::string> out;
  for (const auto& a : axes_) {
    std::string line = steps > 0 ? a->Summary(steps) : "";
    if (!line.empty()) out.push_back(std::move(line));
  }
  return out;
}

}  // namespace glossa
