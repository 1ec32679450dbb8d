// Deterministic randomness and the global step, with Lingvo's semantics.
//
// A per-thread step seed counter is reset at the start of each step; every random op draws a seed
// pair (global_step, step_seed++) offset by the layer's random_seed and an op seed, so replaying a
// step (RevNet recomputation, pipeline micro-batches) replays every mask.
//
//   ResetStepSeed();
//   GlobalStepContext step(1200);
//   auto [s0, s1] = GenerateStepSeedPair(/*random_seed=*/1234);  // (1200 + 1234, 0 + 1234)
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace glossa {

// md5(name) as a hex integer, mod 2^31 - 1 (Lingvo's GenerateSeedFromName): "test" -> 552009270.
int64_t GenerateSeedFromName(std::string_view name);

// The calling thread's step seed (0 until reset).
int64_t GetStepSeed();
void ResetStepSeed(int64_t seed = 0);
// Returns the step seed, then advances it by the product of the active StepSeedIncrementContexts
// (1 when none).
int64_t GetIncStepSeed();

// Within this scope GetIncStepSeed advances by `step` times any enclosing increments (Lingvo's
// StepSeedIncrementContext, used where one call stands for `step` ops). `step` must be > 0.
class StepSeedIncrementContext {
 public:
  explicit StepSeedIncrementContext(int64_t step);
  ~StepSeedIncrementContext();
  StepSeedIncrementContext(const StepSeedIncrementContext&) = delete;
  StepSeedIncrementContext& operator=(const StepSeedIncrementContext&) = delete;
};

// The global step. Inside a GlobalStepContext (innermost wins, per thread) its value; otherwise
// the process-wide step set by SetGlobalStep (the trainer's), 0 at start.
int64_t GetGlobalStep();
void SetGlobalStep(int64_t step);

class GlobalStepContext {
 public:
  explicit GlobalStepContext(int64_t step);
  ~GlobalStepContext();
  GlobalStepContext(const GlobalStepContext&) = delete;
  GlobalStepContext& operator=(const GlobalStepContext&) = delete;
};

// A per-thread substitute for the global step used by seed generation (a pipeline sets the
// micro-batch step here). GetOverWriteGlobalStep returns it when set, else GetGlobalStep().
void SetOverWriteGlobalStep(int64_t step);
void ClearOverWriteGlobalStep();
int64_t GetOverWriteGlobalStep();

// Sets the overwrite global step for this scope on this thread and restores the previous state
// (set or not) on exit.
class OverWriteGlobalStepContext {
 public:
  explicit OverWriteGlobalStepContext(int64_t step);
  ~OverWriteGlobalStepContext();
  OverWriteGlobalStepContext(const OverWriteGlobalStepContext&) = delete;
  OverWriteGlobalStepContext& operator=(const OverWriteGlobalStepContext&) = delete;

 private:
  std::optional<int64_t> previous_;
};

// The block of the batch this thread computes when a batch is split over ranks: dim-0 block
// `index` of `count` equal blocks (a data-parallel or expert-parallel rank's rows, a pipeline's
// micro-batch). Seeded per-row draws (DeterministicDropoutLayer) draw this block of the whole
// batch's counter-based values (StatelessUniform), so a rank's masks are its rows of the masks one
// process draws for the whole batch: the ranks train like one process with dropout on.
// count 1 (the default): the thread's tensors are the whole batch.
// A second, dim-1 block (index1 of count1) serves tensors split along two dims: the experts of a
// data × expert mesh, [experts, groups, ...], are this rank's experts (dim 0) of its data
// replica's groups (dim 1).
// A pipeline's micro-batch t of m within a rank's rows is block index = outer·m + t of count
// outer_count·m, and says so (micro, micro_count): what a layer whose tensors gather the
// micro-batch's rows from every rank of an axis (the experts') needs to find their blocks.
struct BatchShard {
  int64_t index = 0, count = 1;
  int64_t index1 = 0, count1 = 1;
  int64_t micro = 0, micro_count = 1;
};
BatchShard CurrentBatchShard();
class BatchShardScope {
 public:
  BatchShardScope(int64_t index, int64_t count, int64_t index1 = 0, int64_t count1 = 1,
                  int64_t micro = 0, int64_t micro_count = 1);
  ~BatchShardScope();
  BatchShardScope(const BatchShardScope&) = delete;
  BatchShardScope& operator=(const BatchShardScope&) = delete;

 private:
  BatchShard previous_;
};

// (global step, GetIncStepSeed()), each element plus `random_seed` and plus `op_seed` when set.
// The global step is GetOverWriteGlobalStep(). When `is_inference` and no random_seed is set, the
// step seed still advances (so other ops' seeds don't shift) and a fresh random pair is returned,
// as in Lingvo.
std::array<int64_t, 2> GenerateStepSeedPair(std::optional<int64_t> random_seed,
                                            std::optional<int64_t> op_seed = std::nullopt,
                                            bool is_inference = false);

}  // namespace glossa
