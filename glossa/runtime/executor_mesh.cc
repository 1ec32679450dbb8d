// The executor's model-parallel parts (executor.h): the mesh and the model built inside its axes,
// joining the ranks' state, their checkpoint shards, and what the axes carried.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/checkpoint/saver.h"
#include "glossa/layers/process_seed.h"
#include "glossa/optim/learner.h"
#include "glossa/runtime/data_parallel.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/gradient_sync.h"
#include "glossa/runtime/mesh.h"
#include "glossa/runtime/executor.h"
#include "glossa/runtime/parallel_plan.h"

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
void RefuseUnmetMeshAxes(const BaseLayer& model, const MeshShape* mesh) {
  for (const auto& need : model.UnmetMeshAxes()) {
    const std::string n = std::to_string(need.size);
    throw FailedPreconditionError(StrCat(
        "variable '", need.variable, "' is sharded over the ranks of an '", need.axis,
        "' axis (its layer has num_devices = ", n, "), but ",
        mesh != nullptr ? StrCat("this run's mesh (", mesh->Describe(), ") has none")
                        : std::string("this run is one process"),
        ": it needs a mesh with an '", need.axis, "' axis of ", n, " ranks: train it with ",
        mesh != nullptr ? StrCat("--mesh=", need.axis, ":", n) : StrCat("--nproc_per_node=", n),
        " (or --mesh=data:D,", need.axis, ":", n, " over more; docs/distributed.md), or set the "
        "layer's num_devices to 1 (its checkpoints load whole either way)"));
  }
}

}  // namespace

// The plan over the ranks (when there are several), each rank's input shard, and the model
// built in the plan's context; where its rank-local variables sit, and what the axes refuse.
void Executor::BuildModel() {
  Distributed* dist = options_.distributed;
  if (dist != nullptr && dist->world_size() > 1) {
    CheckSameConfiguration(*dist, params_);
    plan_ = std::make_unique<ParallelPlan>(*dist, options_.mesh);
    // The ranks of a batch shard read the same rows (pipe and model ranks share them).
    for (const std::string& note :
         ShardParamsForReplicas(params_, plan_->batch_shards(), plan_->batch_shard())) {
      if (chief_) Log(note);
    }
    for (auto& [name, p] : options_.dataset_params) {
      ShardParamsForReplicas(p, plan_->batch_shards(), plan_->batch_shard());
    }
    if (chief_ && !plan_->Describe().empty()) Log(plan_->Describe());
  }
  const int64_t seed_uses = ProcessRandomSeedUses();
  model_ = InstantiateLayer<BaseModel>(params_, plan_ ? plan_->Context() : BuildContext());
  used_process_seed_ = ProcessRandomSeedUses() > seed_uses;
  RefuseUnmetMeshAxes(*model_, plan_ ? &plan_->shape() : nullptr);
  if (plan_) {
    plan_->CheckModel(*model_, options_.mesh, [this](const std::string& l) { Log(l); });
    plan_->PlaceVariables(*model_);
  }
}

// With several ranks: the chief's state on every rank (each rank's own pieces of rank-local
// variables), the gradient syncs, and the replicas of every piece made alike.
void Executor::JoinRanks(Distributed& dist) {
  auto log = [this](const std::string& l) { Log(l); };
  global_step_ = SyncStateFromChief(dist, *model_, ema_.get(), global_step_, log,
                                    plan_ ? plan_->layout() : ShardLayout(),
                                    chief_ ? checkpointer_->restored_prefix() : "");
  syncs_.clear();
  InstallGradientSyncs(dist, *model_, options_, syncs_);
  if (!plan_) return;
  // The replicas of a piece start alike, whatever each process's seed drew (restored
  // checkpoints agree already).
  // Group by group (the data group, a stage's data x expert ranks), in the order of their first
  // variable: the same on every rank of a group.
  std::vector<std::pair<Distributed*, std::vector<at::Tensor>>> groups;
  for (const auto& v : LearnerVariables(*model_)) {
    if (!v.rank_local()) continue;
    Distributed* group = plan_->RankLocal(v).group;
    if (group == nullptr || group->world_size() == 1) continue;
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const auto& e) { return e.first == group; });
    if (g == groups.end()) {
      groups.push_back({group, {v.value.detach()}});
    } else {
      g->second.push_back(v.value.detach());
    }
  }
  for (auto& [group, pieces] : groups) group->Broadcast(pieces, 0);
  for (auto& s : syncs_) plan_->Configure(*s);
}

// What each axis carried during the run, per step.
void Executor::LogModelParallelSummary(int64_t first_step) {
  if (!plan_ || global_step_ <= first_step) return;
  for (const auto& line : plan_->Summaries(static_cast<double>(global_step_ - first_step))) {
    Log(line);
  }
}

bool Executor::SaveCheckpoint(bool due, bool healthy) {
  Distributed* dist = options_.distributed;
  if (!plan_ || plan_->layout().empty() || dist == nullptr) {
    if (!chief_ || !due) return false;
    checkpointer_->Save(global_step_, healthy);
    return true;
  }
  if (!dist->AnyTrue(due)) return false;
  if (plan_->data_group() != nullptr) {
    // The replicas of a piece must hold the same values (FailedPrecondition naming the ranks).
    plan_->data_group()->CheckSame("the values of this rank's pieces on their replicas",
                                   PieceReplicaDigest(*model_));
  }
  // The ranks of data index 0 write a file each, with the pieces they are the writers of.
  if (plan_->checkpoint_file() >= 0) {
    std::map<std::string, at::Tensor> mine;
    for (auto& [name, t] : CheckpointTensors(*model_, ema_.get(), global_step_)) {
      std::string variable;
      if (FindPiece(plan_->layout(), name, &variable) != nullptr && plan_->Writes(variable)) {
        mine[name] = t;
      }
    }
    SaveRankPieces(Saver::CheckpointPrefix(train_dir_, global_step_), plan_->checkpoint_file(),
                   plan_->checkpoint_files(), mine, plan_->layout());
  }
  dist->Barrier();  // every rank's shard is complete before the checkpoint can become visible
  if (chief_) checkpointer_->Save(global_step_, healthy);
  return true;
}

}  // namespace glossa
