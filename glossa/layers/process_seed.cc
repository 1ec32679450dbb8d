#include "glossa/layers/process_seed.h"

#include <atomic>
#include <mutex>
#include <random>

namespace glossa {
namespace {

// Variables initialized from the process seed so far.
std::atomic<int64_t> g_process_seed_uses{0};

}  // namespace

int64_t ProcessRandomSeed() {
  static std::once_flag once;
  static int64_t seed = 0;
  std::call_once(once, [] {
    std::random_device rd;
    seed = static_cast<int64_t>(rd() % 2147483647u);
  });
  return seed;
}

int64_t ProcessRandomSeedUses() { return g_process_seed_uses.load(); }

int64_t UseProcessRandomSeed() {
  ++g_process_seed_uses;
  return ProcessRandomSeed();
}

}  // namespace glossa
