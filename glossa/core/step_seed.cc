#include "glossa/core/step_seed.h"

#include <openssl/evp.h>

#include <atomic>
#include <random>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/thread_state.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

thread_local int64_t t_step_seed = 0;                          // ThreadState: "step_seed"
thread_local std::vector<int64_t> t_seed_increments;             // ThreadState: "step_seed_increments"
thread_local std::vector<int64_t> t_global_steps;                // ThreadState: "global_step"
thread_local std::optional<int64_t> t_overwrite_global_step;     // ThreadState: "overwrite_global_step"
GLOSSA_THREAD_STATE_SLOT("step_seed", t_step_seed);
GLOSSA_THREAD_STATE_SLOT("step_seed_increments", t_seed_increments);
GLOSSA_THREAD_STATE_SLOT("global_step", t_global_steps);
GLOSSA_THREAD_STATE_SLOT("overwrite_global_step", t_overwrite_global_step);
std::atomic<int64_t> g_global_step{0};

}  // namespace

int64_t GenerateSeedFromName(std::string_view name) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(name.data(), name.size(), digest, &len, EVP_md5(), nullptr) != 1 || len != 16) {
    throw InternalError("md5 digest failed");
  }
  // The 128-bit big-endian integer mod 2^31 - 1, by Horner's rule over bytes.
  constexpr uint64_t kMod = (uint64_t{1} << 31) - 1;
  uint64_t r = 0;
  for (unsigned int i = 0; i < len; ++i) r = ((r << 8) | digest[i]) % kMod;
  return static_cast<int64_t>(r);
}

int64_t GetStepSeed() { return t_step_seed; }
void ResetStepSeed(int64_t seed) { t_step_seed = seed; }

// Seed arithmetic wraps around in 64 bits (as TensorFlow's int64 ops do) instead of overflowing.
static int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

int64_t GetIncStepSeed() {
  uint64_t inc = 1;
  for (int64_t s : t_seed_increments) inc *= static_cast<uint64_t>(s);
  const int64_t seed = t_step_seed;
  t_step_seed = WrapAdd(seed, static_cast<int64_t>(inc));
  return seed;
}

StepSeedIncrementContext::StepSeedIncrementContext(int64_t step) {
  if (step <= 0) {
    throw InvalidArgumentError(StrCat("StepSeedIncrementContext step must be > 0, got ", step));
  }
  t_seed_increments.push_back(step);
}
StepSeedIncrementContext::~StepSeedIncrementContext() { t_seed_increments.pop_back(); }

int64_t GetGlobalStep() {
  if (!t_global_steps.empty()) return t_global_steps.back();
  return g_global_step.load(std::memory_order_relaxed);
}
void SetGlobalStep(int64_t step) { g_global_step.store(step, std::memory_order_relaxed); }

GlobalStepContext::GlobalStepContext(int64_t step) { t_global_steps.push_back(step); }
GlobalStepContext::~GlobalStepContext() { t_global_steps.pop_back(); }

void SetOverWriteGlobalStep(int64_t step) { t_overwrite_global_step = step; }
void ClearOverWriteGlobalStep() { t_overwrite_global_step.reset(); }
int64_t GetOverWriteGlobalStep() {
  return t_overwrite_global_step ? *t_overwrite_global_step : GetGlobalStep();
}

OverWriteGlobalStepContext::OverWriteGlobalStepContext(int64_t step)
    : previous_(t_overwrite_global_step) {
  t_overwrite_global_step = step;
}

OverWriteGlobalStepContext::~OverWriteGlobalStepContext() { t_overwrite_global_step = previous_; }

std::array<int64_t, 2> GenerateStepSeedPair(std::optional<int64_t> random_seed,
                                            std::optional<int64_t> op_seed, bool is_inference) {
  if (is_inference && !random_seed) {
    GetIncStepSeed();
    // per-thread cache: each thread's own generator of inference seeds.
    static thread_local std::mt19937_64 rng(std::random_device{}());
    std::uniform_int_distribution<int64_t> dist(0, INT64_MAX);
    return {dist(rng), dist(rng)};
  }
  const int64_t global_step = GetOverWriteGlobalStep();
  const int64_t step_seed = GetIncStepSeed();
  std::array<int64_t, 2> seeds = {global_step, step_seed};
  for (auto& s : seeds) {
    if (random_seed) s = WrapAdd(s, *random_seed);
    if (op_seed) s = WrapAdd(s, *op_seed);
  }
  return seeds;
}

namespace {
thread_local BatchShard t_batch_shard;  // ThreadState: "batch_shard"
GLOSSA_THREAD_STATE_SLOT("batch_shard", t_batch_shard);
}  // namespace

BatchShard CurrentBatchShard() { return t_batch_shard; }

BatchShardScope::BatchShardScope(int64_t index, int64_t count, int64_t index1, int64_t count1,
                                 int64_t micro, int64_t micro_count)
    : previous_(t_batch_shard) {
  if (count < 1 || index < 0 || index >= count || count1 < 1 || index1 < 0 || index1 >= count1 ||
      micro_count < 1 || micro < 0 || micro >= micro_count || count % micro_count != 0 ||
      index % micro_count != micro) {
    throw InvalidArgumentError(StrCat("BatchShardScope: block (", index, ", ", index1, ") of (",
                                      count, ", ", count1, "), micro-batch ", micro, " of ",
                                      micro_count, ", is out of range"));
  }
  t_batch_shard = {index, count, index1, count1, micro, micro_count};
}

BatchShardScope::~BatchShardScope() { t_batch_shard = previous_; }

}  // namespace glossa
