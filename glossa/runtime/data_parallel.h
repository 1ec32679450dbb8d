// Data parallelism over Distributed workers (glossa/runtime/distributed.h) at the model level:
// what the executor and the eval/decode jobs do with several ranks (docs/distributed.md).
//
//   Params p = ...;  CheckSameConfiguration(dist, p);   // every rank runs the same experiment
//   ShardParamsForReplicas(p, dist.world_size(), dist.rank());   // model/params_passes.h
//   ... build the model; rank 0 restores its checkpoint ...
//   step = SyncStateFromChief(dist, model, ema, step, log);      // rank 0's state everywhere
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "glossa/checkpoint/saver.h"
#include "glossa/core/nested_map.h"
#include "glossa/core/params.h"
#include "glossa/model/base_model.h"
#include "glossa/model/params_passes.h"
#include "glossa/optim/ema.h"
#include "glossa/runtime/distributed.h"

namespace glossa {

// FailedPrecondition, naming the ranks and what differs, unless every rank has the same model
// Params text, the same contents in the files the Params name (vocabularies, SentencePiece
// models) and the same world size.
void CheckSameConfiguration(Distributed& dist, const Params& model_params);

// Rank 0's variables, learner slots, EMA shadows, global step and input position on every rank
// (one broadcast per dtype); the other ranks restore them as from a checkpoint and skip their
// input shards to the position. Returns the global step.
// A sharded model's variables this rank holds a piece of (`shards`: their slots and averages
// alike; saver.h's ShardLayout) are not broadcast: each rank cuts its pieces from the checkpoint
// the chief restored (`restored_prefix`, the chief's; "" when it restored none) or keeps its own
// initialization.
int64_t SyncStateFromChief(Distributed& dist, BaseModel& model, ExponentialMovingAverage* ema,
                           int64_t global_step, const std::function<void(const std::string&)>& log,
                           const ShardLayout& shards = {},
                           const std::string& restored_prefix = "");

// On the 'pipe' mesh axis `pipe` (a pipeline's ranks, which must compute on the same batches; the
// model's build context's): the batch of the axis's rank 0, and whether it had one (its input had not ended), on
// every rank of the axis. Each rank still reads its own input (so that its input position goes on
// as the others'), but parallel readers and shuffling need not give every process the same
// order. Without such an axis (null, or of size 1): `have`, and the batch as it is.
bool ShareBatchOverPipe(MeshAxis* pipe, bool have, NestedMap& batch);
// The CRC32C of every rank-local variable (LearnerVariable::rank_local), by name: what the
// replicas of a piece (a rank's data group) compare before a checkpoint (they must hold the same
// values).
std::string PieceReplicaDigest(const BaseLayer& model);

// Decode outputs (NestedMaps of tensors) to bytes and back, to gather them across ranks.
std::string SerializeNestedMaps(const std::vector<NestedMap>& maps);
std::vector<NestedMap> DeserializeNestedMaps(const std::string& bytes);

}  // namespace glossa
