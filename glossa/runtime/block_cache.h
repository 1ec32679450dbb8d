// The CPU allocator of Glossa's programs: glibc's malloc (as ATen's default allocator) for blocks
// under 32 MiB (glibc keeps those in its heap once ConfigureCpuRuntime has set its mmap threshold
// to that maximum), and a cache of freed blocks from 32 MiB up. glibc serves those with mmap and unmaps them when they
// are freed, so each training step faulted its largest tensors in again, page by page, zeroed by
// the kernel: the 512-wide LM's logits and their gradient ([2,048 rows, 8,000 classes] in float32,
// 65 MB each) cost more in page faults than in arithmetic (2026-12-05, AMD EPYC VM: 340 ms to
// fault in and fill 65 MB, 21 ms to fill it again). Steps repeat their shapes, so a freed block is
// kept and handed to the next request it fits (up to 1.25x its size), the oldest freed first out
// when the cache holds more than its limit.
//
//   InstallLargeBlockCache();                 // ConfigureCpuRuntime does this
//   LargeBlockCacheStats s = GetLargeBlockCacheStats();   // hits, misses, bytes held
#pragma once

#include <cstddef>
#include <cstdint>

namespace c10 {
struct Allocator;
}  // namespace c10

namespace glossa {

// Makes the cache ATen's CPU allocator (idempotent; the limit of the first call stays): freed
// large blocks are kept up to `max_cached_bytes` in all. GLOSSA_NO_LARGE_BLOCK_CACHE=1 in the
// environment leaves ATen's allocator in place (to compare, or to look for a leak).
void InstallLargeBlockCache(size_t max_cached_bytes = size_t{1} << 30);

struct LargeBlockCacheStats {
  int64_t hits = 0;          // large requests served from the cache
  int64_t misses = 0;        // large requests that allocated
  int64_t cached_bytes = 0;  // freed blocks held now
  int64_t live_blocks = 0;   // large blocks in use
};
LargeBlockCacheStats GetLargeBlockCacheStats();

// Frees every cached block (the blocks in use stay theirs).
void ReleaseLargeBlockCache();

// The allocator itself (for tests: it works whether or not it is installed).
c10::Allocator* LargeBlockCacheAllocator();

// The smallest request the cache serves.
constexpr size_t kLargeBlockBytes = size_t{32} << 20;

}  // namespace glossa
