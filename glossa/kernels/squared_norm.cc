#include "glossa/kernels/squared_norm.h"

#include <ATen/ATen.h>

#include <cstdint>

#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
#include <immintrin.h>
#endif

namespace glossa {
namespace {

constexpr int64_t kChunk = int64_t{1} << 16;

double ChunkSquaresScalar(const float* x, int64_t n) {
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) s[j] += static_cast<double>(x[i + j]) * x[i + j];
  }
  for (; i < n; ++i) s[0] += static_cast<double>(x[i]) * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

#if GLOSSA_X86_SIMD
// GCC 12 reports the undefined vectors inside its conversion and reduction intrinsics as
// (maybe-)uninitialized; a known false positive (as in adam.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// Four double accumulators of 8 lanes; each float widened exactly before its square.
__attribute__((target("avx512f"))) double ChunkSquaresAvx512(const float* x, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd(), a2 = _mm512_setzero_pd(),
          a3 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512d u0 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    const __m512d u1 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    const __m512d v0 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16));
    const __m512d v1 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24));
    a0 = _mm512_fmadd_pd(u0, u0, a0);
    a1 = _mm512_fmadd_pd(u1, u1, a1);
    a2 = _mm512_fmadd_pd(v0, v0, a2);
    a3 = _mm512_fmadd_pd(v1, v1, a3);
  }
  double s = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}
#pragma GCC diagnostic pop
#else
double ChunkSquaresAvx512(const float*, int64_t) { NoSimdInThisBuild(); }
#endif  // GLOSSA_X86_SIMD

}  // namespace

double SumOfSquaresReference(const at::Tensor& t) {
  if (t.numel() == 0) return 0.0;
  return t.detach().to(at::kDouble).square().sum().item<double>();
}

std::vector<double> SumsOfSquares(const std::vector<at::Tensor>& tensors) {
  std::vector<double> out(tensors.size(), 0.0);
  // The chunks of the tensors the pass takes: (tensor, first element).
  struct Chunk {
    size_t tensor;
    int64_t begin;
  };
  std::vector<Chunk> chunks;
  std::vector<const float*> data(tensors.size(), nullptr);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || t.numel() == 0) continue;
    if (t.scalar_type() != at::kFloat || !t.device().is_cpu() || !t.is_contiguous()) {
      out[i] = SumOfSquaresReference(t);
      continue;
    }
    data[i] = t.data_ptr<float>();
    for (int64_t b = 0; b < t.numel(); b += kChunk) chunks.push_back({i, b});
  }
  if (chunks.empty()) return out;
  std::vector<double> partial(chunks.size());
  // GLOSSA_KERNELS=reference: the plain loop (the same chunks, so the same for any thread count).
  const bool avx512 = CpuHasAvx512F() && !KernelsForcedToReference();
  KernelParallelFor(0, static_cast<int64_t>(chunks.size()), ParallelGrain(kChunk),
                    [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const Chunk& k = chunks[c];
      const int64_t n = std::min(kChunk, tensors[k.tensor].numel() - k.begin);
      const float* x = data[k.tensor] + k.begin;
      partial[c] = avx512 ? ChunkSquaresAvx512(x, n) : ChunkSquaresScalar(x, n);
    }
  });
  for (size_t c = 0; c < chunks.size(); ++c) out[chunks[c].tensor] += partial[c];
  return out;
}

}  // namespace glossa
