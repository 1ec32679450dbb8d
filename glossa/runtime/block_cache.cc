#include "glossa/runtime/block_cache.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdlib>
#include <list>
#include <mutex>

namespace glossa {
namespace {

// Every block carries a header of one alignment unit before the data: its size and whether it is
// large, so that the one deleter (oneDNN frees through raw_deallocate, which needs the same
// deleter for every block and the data pointer as the context) knows where a block goes back to
// without a lookup.
struct alignas(64) Header {
  size_t size;  // of the data, for a large block the size it was made with
  bool large;
};
static_assert(sizeof(Header) == 64, "the header keeps the data 64-byte aligned");

class LargeBlockCache final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    void* data = nullptr;
    if (n >= kLargeBlockBytes) data = Take(n);
    if (data == nullptr) {
      auto* h = static_cast<Header*>(c10::alloc_cpu(n + sizeof(Header)));
      h->size = n;
      h->large = n >= kLargeBlockBytes;
      data = h + 1;
      if (h->large) {
        std::lock_guard<std::mutex> lock(mu_);
        ++live_;
      }
    }
    return {data, data, &Free, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Free; }

  // The deleter: a small block to glibc; a large one to the cache, the oldest blocks out beyond
  // the limit.
  static void Free(void* data) {
    if (data == nullptr) return;
    Header* h = static_cast<Header*>(data) - 1;
    if (!h->large) {
      c10::free_cpu(h);
      return;
    }
    LargeBlockCache& c = Instance();
    std::list<Header*> evicted;
    {
      std::lock_guard<std::mutex> lock(c.mu_);
      --c.live_;
      c.free_.push_back(h);
      c.cached_ += h->size;
      while (c.cached_ > c.max_cached_ && !c.free_.empty()) {
        c.cached_ -= c.free_.front()->size;
        evicted.splice(evicted.end(), c.free_, c.free_.begin());
      }
    }
    for (Header* b : evicted) c10::free_cpu(b);
  }

  static LargeBlockCache& Instance() {
    static auto* cache = new LargeBlockCache;  // never destroyed: blocks may be freed at exit
    return *cache;
  }

  void SetLimit(size_t max_cached_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    max_cached_ = max_cached_bytes;
  }

  void Release() {
    std::list<Header*> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all.swap(free_);
      cached_ = 0;
    }
    for (Header* b : all) c10::free_cpu(b);
  }

  LargeBlockCacheStats Stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {hits_, misses_, static_cast<int64_t>(cached_), live_};
  }

 private:
  LargeBlockCache() = default;

  // The data of the smallest cached block of n to 1.25n bytes, taken out of the cache, or null.
  void* Take(size_t n) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const size_t size = (*it)->size;
      if (size >= n && size <= n + n / 4 && (best == free_.end() || size < (*best)->size)) {
        best = it;
      }
    }
    if (best == free_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    ++live_;
    Header* h = *best;
    cached_ -= h->size;
    free_.erase(best);
    return h + 1;
  }

  mutable std::mutex mu_;
  mutable std::list<Header*> free_;  // oldest first
  mutable int64_t live_ = 0;
  mutable size_t cached_ = 0;
  size_t max_cached_ = size_t{1} << 30;
  mutable int64_t hits_ = 0, misses_ = 0;
};

}  // namespace

void InstallLargeBlockCache(size_t max_cached_bytes) {
  static std::once_flag once;
  std::call_once(once, [max_cached_bytes] {
    // PYTORCH_NO_CUDA_MEMORY_CACHING's counterpart, to compare or to debug memory: off.
    if (const char* off = std::getenv("GLOSSA_NO_LARGE_BLOCK_CACHE"); off && *off && *off != '0') {
      return;
    }
    LargeBlockCache::Instance().SetLimit(max_cached_bytes);
    // Above the default allocator's priority (0), so that nothing set later at 0 replaces it.
    c10::SetCPUAllocator(&LargeBlockCache::Instance(), /*priority=*/1);
  });
}

LargeBlockCacheStats GetLargeBlockCacheStats() { return LargeBlockCache::Instance().Stats(); }

void ReleaseLargeBlockCache() { LargeBlockCache::Instance().Release(); }

c10::Allocator* LargeBlockCacheAllocator() { return &LargeBlockCache::Instance(); }

}  // namespace glossa
