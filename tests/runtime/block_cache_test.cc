#include "glossa/runtime/block_cache.h"

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

namespace glossa {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// A freed large block is handed to the next request it fits (up to 1.25x its size); small
// requests and larger ones are not served from it.
TEST(LargeBlockCache, AFreedLargeBlockServesTheNextRequestItFits) {
  ReleaseLargeBlockCache();  // what earlier tests freed
  c10::Allocator* a = LargeBlockCacheAllocator();
  void* first = nullptr;
  {
    c10::DataPtr p = a->allocate(40 * kMiB);
    first = p.get();
    static_cast<char*>(first)[40 * kMiB - 1] = 7;  // the whole block is usable
  }
  const LargeBlockCacheStats before = GetLargeBlockCacheStats();
  EXPECT_EQ(before.cached_bytes, static_cast<int64_t>(40 * kMiB));
  {
    c10::DataPtr small = a->allocate(1 * kMiB);  // glibc's
    EXPECT_NE(small.get(), first);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(small.get()) % 64, 0u);
    c10::DataPtr big = a->allocate(60 * kMiB);  // 40 MiB is too small for it
    EXPECT_NE(big.get(), first);
    c10::DataPtr fits = a->allocate(36 * kMiB);  // 40 <= 1.25 x 36
    EXPECT_EQ(fits.get(), first);
    const LargeBlockCacheStats during = GetLargeBlockCacheStats();
    EXPECT_EQ(during.hits, before.hits + 1);
    EXPECT_EQ(during.misses, before.misses + 1);
    EXPECT_EQ(during.live_blocks, before.live_blocks + 2);
  }
  EXPECT_EQ(GetLargeBlockCacheStats().live_blocks, before.live_blocks);
}

// oneDNN allocates through the raw interface: one deleter for every block, the data pointer as
// the context.
TEST(LargeBlockCache, TheRawInterfaceFreesSmallAndLargeBlocks) {
  c10::Allocator* a = LargeBlockCacheAllocator();
  ASSERT_NE(a->raw_deleter(), nullptr);
  const int64_t live = GetLargeBlockCacheStats().live_blocks;
  for (size_t n : {size_t{0}, size_t{100}, 50 * kMiB}) {
    void* p = a->raw_allocate(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    if (n > 0) static_cast<char*>(p)[n - 1] = 1;
    a->raw_deallocate(p);
  }
  EXPECT_EQ(GetLargeBlockCacheStats().live_blocks, live);
}

// The cache holds at most its limit (1 GiB): the oldest freed blocks are released first.
TEST(LargeBlockCache, HoldsNoMoreThanItsLimit) {
  ReleaseLargeBlockCache();
  c10::Allocator* a = LargeBlockCacheAllocator();
  {
    std::vector<c10::DataPtr> blocks;
    // Sizes no cached block fits (each over 1.25x the last), so every one is new.
    for (size_t mib : {300, 380, 480, 600}) blocks.push_back(a->allocate(mib * kMiB));
    for (auto& b : blocks) b.clear();  // freed in this order
  }
  const LargeBlockCacheStats s = GetLargeBlockCacheStats();
  // 300 went out when 480 came back (1,160 MiB held); 380 and 480 when 600 came back.
  EXPECT_EQ(s.cached_bytes, static_cast<int64_t>(600 * kMiB));
  ReleaseLargeBlockCache();
  EXPECT_EQ(GetLargeBlockCacheStats().cached_bytes, 0);
}

// Installed, it is ATen's CPU allocator: a step's repeated large tensor reuses its block, its
// values are what was written, and threads allocating and freeing together lose nothing.
TEST(LargeBlockCache, InstalledTensorsReuseTheirBlocksAcrossSteps) {
  InstallLargeBlockCache();
  const int64_t n = 12 * 1000 * 1000;  // 48 MB of float32
  const void* first = nullptr;
  for (int step = 0; step < 3; ++step) {
    at::Tensor t = at::full({n}, static_cast<float>(step), at::kFloat);
    if (step == 0) first = t.data_ptr();
    EXPECT_EQ(t.data_ptr(), first) << "step " << step;
    EXPECT_EQ(t.sum().item<double>(), static_cast<double>(step) * n);
  }
  const int64_t live = GetLargeBlockCacheStats().live_blocks;
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([i] {
      for (int k = 0; k < 20; ++k) {
        at::Tensor t = at::empty({(10 + i) * 1000 * 1000}, at::kFloat);
        t.fill_(1.0f);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(GetLargeBlockCacheStats().live_blocks, live);
}

}  // namespace
}  // namespace glossa
