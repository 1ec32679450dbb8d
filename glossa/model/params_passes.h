// The whole-model Params passes, in one place: how a model's Params tree is read from outside
// (its tasks and its main task) and the rewrites a job applies to it before building (each rank's
// input shard; float32 activations around an int8 bundle's projections). A pass is a list of
// per-class hooks: it rewrites the nodes whose class (their `cls`) derives from a hook's class,
// never a node because of the names of its fields.
//
//   for (const std::string& task : TaskPaths(p)) p.Set(task + ".train.max_steps", 100);
//   p.Set(MainTaskPath(p) + ".eval.load_checkpoint_from", prefix);
//   ShardParamsForReplicas(p, /*world=*/4, /*rank=*/1);
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "glossa/core/params.h"
#include "glossa/core/registry.h"

namespace glossa {

// "task" for a SingleTaskModel's Params, "task_params.<name>" for each task of a MultiTaskModel's
// (in their order); InvalidArgument when `model` is neither (a task's or a layer's Params).
std::vector<std::string> TaskPaths(const Params& model);
// The main task's path: "task", or "task_params.<main_task>" (the first task when main_task is
// empty); NotFound naming the tasks when main_task is none of them.
std::string MainTaskPath(const Params& model);

// A per-class hook of a pass: `apply` runs on every node of the tree whose class derives from
// the hook's class, with the node's dotted path ("task.input").
struct ParamsHook {
  std::string base_class;  // for messages
  std::function<bool(const ClassRegistry::Entry&)> applies;
  std::function<void(Params& node, const std::string& path)> apply;
};
template <typename Base>
ParamsHook HookFor(std::function<void(Params& node, const std::string& path)> apply) {
  return {Demangle(typeid(Base).name()),
          [](const ClassRegistry::Entry& e) { return ClassRegistry::DerivesFrom<Base>(e); },
          std::move(apply)};
}
// Runs `hooks` on `root` and on every Params below it, in nested Params and in lists, whose `cls`
// is a registered class: parents before children, a node's hooks in their order.
void RunParamsPass(Params& root, const std::vector<ParamsHook>& hooks);

// ---- The passes ----

// Data parallelism: the global batch stays as configured and each of `world` ranks reads a share
// of it. Every input generator (BaseInputGenerator) gets num_input_replicas = world and
// input_replica_id = rank (the record yielder gives replica r the records whose index ≡ r mod
// world), its batch_size and, for sequence inputs, each bucket_batch_limit divided by world,
// rounded up (returned: one line for each that does not divide, saying what the global batch
// becomes). Every task's (BaseTask) num_splits towers are spread over the ranks: num_splits /
// world per rank (a multiple of world, or 1: one tower per rank; InvalidArgument naming the key
// otherwise). InvalidArgument for a rank outside [0, world).
std::vector<std::string> ShardParamsForReplicas(Params& model, int world, int rank);

// int8 bundles compute in float32 around the int8 projections (CTranslate2's int8_float32):
// every layer's (BaseLayer) fprop_dtype goes back to None.
void FloatActivations(Params& model);

}  // namespace glossa
