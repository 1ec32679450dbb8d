// The executor's model-parallel parts (executor.h): the mesh and the model built inside its axes,
// joining the ranks' state, their checkpoint shards, and what the axes carried.
#include <ATen/ATen.h>

#include <cstdio>
#include <algorithm>
#include <set>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/checkpoint/saver.h"
#include "glossa/layers/process_seed.h"
#include "glossa/optim/learner.h"
#include "glossa/runtime/data_parallel.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/executor.h"

namespace glossa {
namespace {

// With several ranks: a gradient sync per task, installed in its learner and kept in `syncs`.
void InstallGradientSyncs(Distributed& dist, BaseModel& model, const ExecutorOptions& options,
                          std::vector<std::shared_ptr<DataParallelGradientSync>>& syncs) {
  for (const auto& name : model.task_names()) {
    auto sync = std::make_shared<DataParallelGradientSync>(dist, options.grad_bucket_bytes,
                                                           options.overlap_grad_reduce);
    model.GetTask(name).learner().SetGradientSync(sync);
    syncs.push_back(std::move(sync));
  }
}

// A layer whose Params shard it over a mesh axis this run lacks is built whole (as eval and export
// build it); training it so would write checkpoints its Params' mesh does not resume. Say what it
// needs.
void RefuseUnmetMeshAxes(const BaseLayer& model, const DistributedMesh* mesh) {
  for (const auto& need : model.UnmetMeshAxes()) {
    const std::string n = std::to_string(need.size);
    throw FailedPreconditionError(StrCat(
        "variable '", need.variable, "' is sharded over the ranks of an '", need.axis,
        "' axis (its layer has num_devices = ", n, "), but ",
        mesh != nullptr ? StrCat("this run's mesh (", mesh->shape().Describe(), ") has none")
                        : std::string("this run is one process"),
        ": it needs a mesh with an '", need.axis, "' axis of ", n, " ranks: train it with ",
        mesh != nullptr ? StrCat("--mesh=", need.axis, ":", n) : StrCat("--nproc_per_node=", n),
        " (or --mesh=data:D,", need.axis, ":", n, " over more; docs/distributed.md), or set the "
        "layer's num_devices to 1 (its checkpoints load whole either way)"));
  }
}

}  // namespace

// The mesh over the ranks (when there are several), each rank's input shard, and the model
// built inside the mesh's axes; the variables this rank alone holds.
void Executor::BuildModel() {
  Distributed* dist = options_.distributed;
  if (dist != nullptr && dist->world_size() > 1) {
    CheckSameConfiguration(*dist, params_);
    mesh_ = std::make_unique<DistributedMesh>(*dist, ParseMesh(options_.mesh, dist->world_size()));
    // The ranks of a pipe axis read the same batches; data and expert ranks their own rows.
    for (const std::string& note :
         ShardParamsForReplicas(params_, mesh_->batch_shards(), mesh_->batch_shard())) {
      if (chief_) Log(note);
    }
    for (auto& [name, p] : options_.dataset_params) {
      ShardParamsForReplicas(p, mesh_->batch_shards(), mesh_->batch_shard());
    }
  }
  const int64_t seed_uses = ProcessRandomSeedUses();
  {
    BuildContext context;
    if (mesh_) {
      expert_axis_ = mesh_->expert_axis();
      pipe_axis_ = mesh_->pipe_axis();
      model_axis_ = mesh_->model_axis();
      context.WithAxis("expert", expert_axis_).WithAxis("pipe", pipe_axis_)
          .WithAxis("model", model_axis_);
      const MeshShape& shape = mesh_->shape();
      if (chief_ && shape.data > 1) {
        const int64_t group = shape.world_size() / shape.data;
        Log(StrCat("mesh: ", shape.Describe(), " (", pipe_axis_ ? "pipelines" : model_axis_ ?
                   "model groups" : "expert groups", " of ", group, " ranks, each replicated ",
                   shape.data, " times)"));
      } else if (chief_ && model_axis_) {
        Log(StrCat("mesh: ", shape.Describe()));
      }
    }
    model_ = InstantiateLayer<BaseModel>(params_, context);
  }
  used_process_seed_ = ProcessRandomSeedUses() > seed_uses;
  RefuseUnmetMeshAxes(*model_, mesh_.get());
  int64_t stage_bytes = 0, stage_vars = 0;
  if (mesh_) PlacePieces();
  for (const auto& v : LearnerVariables(*model_)) {
    if (v.pipeline_stage) {
      ++stage_vars;
      stage_bytes += v.value.numel() * static_cast<int64_t>(v.value.element_size());
    }
  }
  if (pipe_axis_) {
    if (stage_vars == 0) {
      throw InvalidArgumentError(StrCat(
          "--mesh=", options_.mesh, ": the model has no pipelined layer to place on the ",
          pipe_axis_->size(), " ranks (set splits: ", pipe_axis_->size(), " on its "
          "TransformerStack, or use a PipeliningLayer / GPipeTransformerStack)"));
    }
    Log(StrCat("pipeline stage ", pipe_axis_->index(), " of ", pipe_axis_->size(), ": ", stage_vars,
               " variables (", stage_bytes, " bytes) on this rank"));
    // Every stage's backward must run on every step (its ranks wait for each other's
    // gradients): a learner that leaves some stage variables out could skip a rank's.
    const std::vector<LearnerVariable> all = LearnerVariables(*model_);
    for (const auto& name : model_->task_names()) {
      std::set<std::string> selected;
      for (const auto& v : model_->GetTask(name).learner().SelectVariables(all)) {
        selected.insert(v.name);
      }
      for (const auto& v : all) {
        if (v.pipeline_stage && !selected.count(v.name)) {
          throw InvalidArgumentError(StrCat(
              "--mesh=", options_.mesh, ": task '", name, "' does not train '", v.name,
              "' (non-trainable, or left out by its learner's variable filter), but on a pipe "
              "mesh every stage variable must train: the stages' backward passes wait on each "
              "other. Train this model in one process, or train every layer of the pipeline"));
        }
      }
    }
  }
}

// With several ranks: the chief's state on every rank (each rank's own share of rank-local
// variables), the gradient syncs, and a pipe mesh's stage replicas made alike.
void Executor::JoinRanks(Distributed& dist) {
  auto log = [this](const std::string& l) { Log(l); };
  global_step_ = SyncStateFromChief(dist, *model_, ema_.get(), global_step_, log, shard_layout_,
                                    chief_ ? checkpointer_->restored_prefix() : "");
  syncs_.clear();
  InstallGradientSyncs(dist, *model_, options_, syncs_);
  if (!mesh_) return;
  // The replicas of a piece start alike, whatever each process's seed drew (restored
  // checkpoints agree already).
  if (mesh_->data_group() != nullptr) {
    std::vector<at::Tensor> pieces;
    for (const auto& v : LearnerVariables(*model_)) {
      if (v.rank_local()) pieces.push_back(v.value.detach());
    }
    if (!pieces.empty()) mesh_->data_group()->Broadcast(pieces, 0);
  }
  for (auto& s : syncs_) s->SetMesh(mesh_->shape(), mesh_->data_group());
}

// Where this rank's values of every rank-local variable sit in the whole variable, and which of
// them it writes: one rank per distinct piece, the one at index 0 on every axis that does not
// split the variable.
void Executor::PlacePieces() {
  const MeshShape::Coordinates& at = mesh_->here();
  const MeshShape& shape = mesh_->shape();
  for (const auto& [info, value] : model_->AllVariables()) {
    const auto& c = info.params.collections;
    auto in = [&](const char* name) { return std::find(c.begin(), c.end(), name) != c.end(); };
    const bool expert = in(kExpertShardedCollection), stage = in(kPipelineStageCollection),
               model = in(kModelShardedCollection);
    if (!expert && !stage && !model) continue;
    ShardPiece piece;  // a stage's variable: whole
    if (expert) piece = {0, at.expert, shape.expert};
    if (model) piece = {info.params.shard_dim, at.model, shape.model};
    shard_layout_[info.full_name] = piece;
    if (at.data == 0 && (expert || at.expert == 0) && (stage || at.pipe == 0) &&
        (model || at.model == 0)) {
      writes_pieces_.insert(info.full_name);
    }
  }
}

// What the expert axis exchanged and the pipe axis sent during the run, per step.
void Executor::LogModelParallelSummary(int64_t first_step) {
  if (expert_axis_ && expert_axis_->exchanges() > 0 && global_step_ > first_step) {
    // Every exchange of the run (the capacity agreements' few bytes included), per step.
    const double steps = static_cast<double>(global_step_ - first_step);
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "expert all-to-all over %d ranks: %.1f exchanges per step, %.2f MB per step "
                  "(this rank's inputs), the largest %.0f bytes",
                  expert_axis_->size(), expert_axis_->exchanges() / steps,
                  expert_axis_->bytes() / 1e6 / steps,
                  static_cast<double>(expert_axis_->max_bytes()));
    Log(buf);
  }
  if (model_axis_ && model_axis_->reductions() > 0 && global_step_ > first_step) {
    // The blocks' forward sums and the replicated inputs' backward sums.
    const double steps = static_cast<double>(global_step_ - first_step);
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "model all-reduce over %d ranks: %.1f per step, %.2f MB per step (this rank's)",
                  model_axis_->size(), model_axis_->reductions() / steps,
                  model_axis_->reduce_bytes() / 1e6 / steps);
    Log(buf);
  }
  if (pipe_axis_ && pipe_axis_->sends() > 0 && global_step_ > first_step) {
    // Rank 0 (stage 0) sends its micro-batches' activations on; the gradients come back to it.
    const double steps = static_cast<double>(global_step_ - first_step);
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "pipeline over %d ranks: stage 0 sent %.1f micro-batches per step, %.2f MB per "
                  "step",
                  pipe_axis_->size(), pipe_axis_->sends() / steps,
                  pipe_axis_->send_bytes() / 1e6 / steps);
    Log(buf);
  }
}

bool Executor::SaveCheckpoint(bool due, bool healthy) {
  Distributed* dist = options_.distributed;
  if (shard_layout_.empty() || dist == nullptr) {
    if (!chief_ || !due) return false;
    checkpointer_->Save(global_step_, healthy);
    return true;
  }
  if (!dist->AnyTrue(due)) return false;
  if (mesh_->data_group() != nullptr) {
    // The replicas of a piece must hold the same values (FailedPrecondition naming the ranks).
    mesh_->data_group()->CheckSame("the values of this rank's pieces on their replicas",
                                   PieceReplicaDigest(*model_));
  }
  // Every rank of data index 0 writes a file (rank r of the W / D ranks of data index 0: r is
  // its world rank, data being the outermost axis), with the pieces it is the writer of.
  if (mesh_->data_index() == 0) {
    std::map<std::string, at::Tensor> mine;
    for (auto& [name, t] : CheckpointTensors(*model_, ema_.get(), global_step_)) {
      std::string variable;
      if (FindPiece(shard_layout_, name, &variable) != nullptr &&
          writes_pieces_.count(variable) > 0) {
        mine[name] = t;
      }
    }
    const MeshShape& shape = mesh_->shape();
    SaveRankPieces(Saver::CheckpointPrefix(train_dir_, global_step_), dist->rank(),
                   static_cast<int>(shape.world_size() / shape.data), mine, shard_layout_);
  }
  dist->Barrier();  // every rank's shard is complete before the checkpoint can become visible
  if (chief_) checkpointer_->Save(global_step_, healthy);
  return true;
}

}  // namespace glossa
