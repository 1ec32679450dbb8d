// The native attention core's softmax rows (declared in attention_core.h): softmax(x + bias) and
// its backward over each row's computed keys, in one AVX-512 pass a row.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "glossa/kernels/attention_core.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
#include "glossa/kernels/simd_math.h"
#endif

namespace glossa {
namespace {

// The keys [start, end) computed for row r of x [B, N, T, S]: all S; with causal blocks of c
// queries, [first key of the block, end of the block), where the first key (block_starts, per
// batch row and block; none: 0) is the first any query of the block may see.
struct RowRanges {
  int64_t N = 1, T = 1, S = 0, c = 0, blocks = 1;
  const std::vector<int64_t>* starts = nullptr;
  std::pair<int64_t, int64_t> operator()(int64_t r) const {
    if (c <= 0) return {0, S};
    const int64_t t = r % T, j = t / c;
    const int64_t start =
        starts == nullptr || starts->empty() ? 0 : (*starts)[r / (N * T) * blocks + j];
    return {start, std::min(S, (j + 1) * c)};
  }
};

RowRanges MakeRowRanges(at::IntArrayRef sizes, int64_t causal_block,
                        const std::vector<int64_t>& block_starts) {
  RowRanges r;
  r.S = sizes.back();
  if (causal_block <= 0) return r;
  r.N = sizes[1];
  r.T = sizes[2];
  r.c = causal_block;
  r.blocks = (r.T + causal_block - 1) / causal_block;
  r.starts = &block_starts;
  TORCH_CHECK(block_starts.empty() ||
                  static_cast<int64_t>(block_starts.size()) == sizes[0] * r.blocks,
              "attention softmax: ", block_starts.size(), " block starts for ", sizes[0],
              " rows of ", r.blocks, " blocks");
  return r;
}

#if GLOSSA_X86_SIMD

using simd_math::Exp16;
using simd_math::TailMask;

// Row r of x [rows, S] in place: softmax(x_r + bias_r) over its entries [start, end) (the rest
// is masked: it becomes 0 and is not read).
__attribute__((target("avx512f"))) void SoftmaxRows(float* x, int64_t S, int64_t lo, int64_t hi,
                                                    const std::function<const float*(int64_t)>& bias_row,
                                                    const RowRanges& range_of) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = lo; r < hi; ++r) {
    const auto [start, end] = range_of(r);
    if (start > 0) std::fill(x + r * S, x + r * S + start, 0.0f);
    float* row = x + r * S + start;
    const int64_t L = end - start;
    if (end < S) std::fill(x + r * S + end, x + (r + 1) * S, 0.0f);
    const int64_t full = L / 16 * 16;
    const __mmask16 tail = TailMask(L - full);
    const float* b = bias_row(r);
    if (b) b += start;
    __m512 vmax = neg_inf;
    for (int64_t c = 0; c < full; c += 16) {
      __m512 z = _mm512_loadu_ps(row + c);
      if (b) z = _mm512_add_ps(z, _mm512_loadu_ps(b + c));
      _mm512_storeu_ps(row + c, z);
      vmax = _mm512_max_ps(vmax, z);
    }
    if (tail) {
      __m512 z = _mm512_mask_loadu_ps(neg_inf, tail, row + full);
      if (b) z = _mm512_mask_add_ps(neg_inf, tail, z, _mm512_maskz_loadu_ps(tail, b + full));
      _mm512_mask_storeu_ps(row + full, tail, z);
      vmax = _mm512_max_ps(vmax, z);
    }
    const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(row + c), vm));
      _mm512_storeu_ps(row + c, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (tail) {
      const __m512 e = _mm512_maskz_mov_ps(
          tail, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + full), vm)));
      _mm512_mask_storeu_ps(row + full, tail, e);
      sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t c = 0; c < full; c += 16) {
      _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_loadu_ps(row + c), inv));
    }
    if (tail) {
      _mm512_mask_storeu_ps(row + full, tail,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, row + full), inv));
    }
  }
}

// Row r in place over its entries [start, end): dy_r = y_r ∘ (dy_r − Σ dy_r∘y_r); [0, start)
// becomes 0 (the key gradients' GEMMs read it), [end, S) is not read or written. dy holds rows
// from dy_r0 on (a head's rows in a buffer of their own), y all rows.
__attribute__((target("avx512f"))) void SoftmaxBackwardRows(float* dy, int64_t dy_r0,
                                                            const float* y, int64_t S, int64_t lo,
                                                            int64_t hi, const RowRanges& range_of) {
  for (int64_t r = lo; r < hi; ++r) {
    const auto [start, end] = range_of(r);
    float* dy_row = dy + (r - dy_r0) * S;
    if (start > 0) std::fill(dy_row, dy_row + start, 0.0f);
    float* d = dy_row + start;
    const float* p = y + r * S + start;
    const int64_t L = end - start;
    const int64_t full = L / 16 * 16;
    const __mmask16 tail = TailMask(L - full);
    __m512 dot = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) {
      dot = _mm512_fmadd_ps(_mm512_loadu_ps(d + c), _mm512_loadu_ps(p + c), dot);
    }
    if (tail) {
      dot = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, d + full),
                            _mm512_maskz_loadu_ps(tail, p + full), dot);
    }
    const __m512 vd = _mm512_set1_ps(_mm512_reduce_add_ps(dot));
    for (int64_t c = 0; c < full; c += 16) {
      _mm512_storeu_ps(d + c, _mm512_mul_ps(_mm512_loadu_ps(p + c),
                                            _mm512_sub_ps(_mm512_loadu_ps(d + c), vd)));
    }
    if (tail) {
      _mm512_mask_storeu_ps(d + full, tail,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, p + full),
                                          _mm512_sub_ps(_mm512_maskz_loadu_ps(tail, d + full), vd)));
    }
  }
}

#else  // no x86 SIMD in this build: CpuHasAvx512F() is false and these are never called

void SoftmaxRows(float*, int64_t, int64_t, int64_t, const std::function<const float*(int64_t)>&,
                 const RowRanges&) {
  NoSimdInThisBuild();
}
void SoftmaxBackwardRows(float*, int64_t, const float*, int64_t, int64_t, int64_t,
                         const RowRanges&) {
  NoSimdInThisBuild();
}

#endif  // GLOSSA_X86_SIMD


}  // namespace

namespace {

// Row r of [B, N, T, S] logits: its row of bias [B or 1, 1, T or 1, S] (checked), or null.
std::function<const float*(int64_t)> BiasRows(const at::Tensor& bias, at::IntArrayRef x_sizes) {
  const int64_t B = x_sizes[0], N = x_sizes[1], T = x_sizes[2], S = x_sizes[3];
  if (!bias.defined() || bias.numel() == 0) return [](int64_t) -> const float* { return nullptr; };
  TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.dim() == 4 &&
                  (bias.size(0) == B || bias.size(0) == 1) && bias.size(1) == 1 &&
                  (bias.size(2) == T || bias.size(2) == 1) && bias.size(3) == S,
              "SoftmaxWithBiasInPlace: bias ", bias.sizes(), " does not broadcast to ", x_sizes);
  const float* bp = bias.data_ptr<float>();
  const int64_t bb = bias.size(0) > 1 ? bias.size(2) * S : 0;
  const int64_t bt = bias.size(2) > 1 ? S : 0;
  return [bp, bb, bt, N, T](int64_t r) -> const float* {
    const int64_t b = r / (N * T), t = r % T;
    return bp + b * bb + t * bt;
  };
}

}  // namespace

void SoftmaxWithBiasInPlace(at::Tensor& x, const at::Tensor& bias, int64_t causal_block,
                            const std::vector<int64_t>& block_starts) {
  TORCH_CHECK(CpuHasAvx512F() && x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.dim() == 4,
              "SoftmaxWithBiasInPlace: float32 contiguous [B, N, T, S] on an AVX-512 CPU");
  const int64_t B = x.size(0), N = x.size(1), T = x.size(2), S = x.size(3);
  const std::function<const float*(int64_t)> bias_row = BiasRows(bias, x.sizes());
  float* xp = x.data_ptr<float>();
  const RowRanges range_of = MakeRowRanges(x.sizes(), causal_block, block_starts);
  KernelParallelFor(0, B * N * T, ParallelGrain(8 * S), [&](int64_t lo, int64_t hi) {
    SoftmaxRows(xp, S, lo, hi, bias_row, range_of);
  });
}

void SoftmaxWithBiasOnRows(float* x, at::IntArrayRef sizes, const at::Tensor& bias,
                           int64_t causal_block, const std::vector<int64_t>& block_starts,
                           int64_t lo, int64_t hi) {
  TORCH_CHECK(CpuHasAvx512F() && sizes.size() == 4 && lo >= 0 && lo <= hi &&
                  hi <= sizes[0] * sizes[1] * sizes[2],
              "SoftmaxWithBiasOnRows: rows [", lo, ", ", hi, ") of ", sizes, " on an AVX-512 CPU");
  const RowRanges range_of = MakeRowRanges(sizes, causal_block, block_starts);
  SoftmaxRows(x, sizes[3], lo, hi, BiasRows(bias, sizes), range_of);
}

void SoftmaxBackwardOnRows(float* dy, int64_t dy_first_row, const float* y, at::IntArrayRef sizes,
                           int64_t causal_block, const std::vector<int64_t>& block_starts,
                           int64_t lo, int64_t hi) {
  TORCH_CHECK(CpuHasAvx512F() && sizes.size() == 4 && lo >= dy_first_row && lo <= hi &&
                  hi <= sizes[0] * sizes[1] * sizes[2],
              "SoftmaxBackwardOnRows: rows [", lo, ", ", hi, ") of ", sizes, " from row ",
              dy_first_row, " on an AVX-512 CPU");
  const RowRanges range_of = MakeRowRanges(sizes, causal_block, block_starts);
  SoftmaxBackwardRows(dy, dy_first_row, y, sizes[3], lo, hi, range_of);
}

void SoftmaxBackwardInPlace(at::Tensor& dy, const at::Tensor& y, int64_t causal_block,
                            const std::vector<int64_t>& block_starts) {
  TORCH_CHECK(CpuHasAvx512F() && dy.device().is_cpu() && dy.scalar_type() == at::kFloat &&
                  y.scalar_type() == at::kFloat && dy.is_contiguous() && y.is_contiguous() &&
                  dy.sizes() == y.sizes() && dy.dim() >= 1,
              "SoftmaxBackwardInPlace: float32 contiguous tensors of one shape on an AVX-512 CPU");
  const int64_t S = dy.size(-1), rows = S > 0 ? dy.numel() / S : 0;
  float* d = dy.data_ptr<float>();
  const float* p = y.data_ptr<float>();
  TORCH_CHECK(causal_block <= 0 || dy.dim() == 4, "SoftmaxBackwardInPlace: a causal block needs [B, N, T, S]");
  const RowRanges range_of = MakeRowRanges(dy.sizes(), causal_block, block_starts);
  KernelParallelFor(0, rows, ParallelGrain(4 * S), [&](int64_t lo, int64_t hi) {
    SoftmaxBackwardRows(d, 0, p, S, lo, hi, range_of);
  });
}

}  // namespace glossa
