#include "glossa/kernels/attention_core.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "glossa/base/strings.h"
#include "glossa/kernels/batch_invariant.h"
#include "glossa/kernels/bf16_dot_attention.h"
#include "glossa/kernels/bf16_softmax.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/kernel_choice.h"
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

RowRanges MakeRowRanges(const at::Tensor& x, int64_t causal_block,
                        const std::vector<int64_t>& block_starts) {
  RowRanges r;
  r.S = x.size(-1);
  if (causal_block <= 0) return r;
  r.N = x.size(1);
  r.T = x.size(2);
  r.c = causal_block;
  r.blocks = (r.T + causal_block - 1) / causal_block;
  r.starts = &block_starts;
  TORCH_CHECK(block_starts.empty() ||
                  static_cast<int64_t>(block_starts.size()) == x.size(0) * r.blocks,
              "attention softmax: ", block_starts.size(), " block starts for ", x.size(0),
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
// becomes 0 (the key gradients' GEMMs read it), [end, S) is not read or written.
__attribute__((target("avx512f"))) void SoftmaxBackwardRows(float* dy, const float* y, int64_t S,
                                                            int64_t lo, int64_t hi,
                                                            const RowRanges& range_of) {
  for (int64_t r = lo; r < hi; ++r) {
    const auto [start, end] = range_of(r);
    if (start > 0) std::fill(dy + r * S, dy + r * S + start, 0.0f);
    float* d = dy + r * S + start;
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
void SoftmaxBackwardRows(float*, const float*, int64_t, int64_t, int64_t, const RowRanges&) {
  NoSimdInThisBuild();
}

#endif  // GLOSSA_X86_SIMD


}  // namespace

void SoftmaxWithBiasInPlace(at::Tensor& x, const at::Tensor& bias, int64_t causal_block,
                            const std::vector<int64_t>& block_starts) {
  TORCH_CHECK(CpuHasAvx512F() && x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.dim() == 4,
              "SoftmaxWithBiasInPlace: float32 contiguous [B, N, T, S] on an AVX-512 CPU");
  const int64_t B = x.size(0), N = x.size(1), T = x.size(2), S = x.size(3);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  if (has_bias) {
    TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.dim() == 4 &&
                    (bias.size(0) == B || bias.size(0) == 1) && bias.size(1) == 1 &&
                    (bias.size(2) == T || bias.size(2) == 1) && bias.size(3) == S,
                "SoftmaxWithBiasInPlace: bias ", bias.sizes(), " does not broadcast to ", x.sizes());
  }
  const float* bp = has_bias ? bias.data_ptr<float>() : nullptr;
  const int64_t bb = has_bias && bias.size(0) > 1 ? bias.size(2) * S : 0;
  const int64_t bt = has_bias && bias.size(2) > 1 ? S : 0;
  const std::function<const float*(int64_t)> bias_row = [&](int64_t r) -> const float* {
    if (!bp) return nullptr;
    const int64_t b = r / (N * T), t = r % T;
    return bp + b * bb + t * bt;
  };
  float* xp = x.data_ptr<float>();
  const RowRanges range_of = MakeRowRanges(x, causal_block, block_starts);
  KernelParallelFor(0, B * N * T, ParallelGrain(8 * S), [&](int64_t lo, int64_t hi) {
    SoftmaxRows(xp, S, lo, hi, bias_row, range_of);
  });
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
  const RowRanges range_of = MakeRowRanges(dy, causal_block, block_starts);
  KernelParallelFor(0, rows, ParallelGrain(4 * S), [&](int64_t lo, int64_t hi) {
    SoftmaxBackwardRows(d, p, S, lo, hi, range_of);
  });
}

namespace {

// ---- The attention core on strided heads ----
//
// softmax(q·kᵀ + bias)·v for float32 q [B, T, N, H] and k, v [B, S, N, H] in whatever layout the
// projections left them (the fused QKV projection's views), one BLAS sgemm per batch row and
// head, reading each head in place through its row stride. ATen's einsum instead copies q, k
// and v into [B·N, T, H] and its bmm runs per batch slice through the dispatcher (a select, a
// resize and checks each; 768 slices per tiny-LM step), and the output needs a copy back to
// [B, T, N·H] for the output projection. Here the output is written as [B, T, N, H] directly,
// and the backward (dP = dO·vᵀ, dS = softmax'(dP), dq = dS·k, dk = dSᵀ·q, dv = Pᵀ·dO) reads and
// writes the same layouts.

// Whether the strided core can run attention on these operands.
// float32 heads, or bf16 ones where the measured choice says native: the core runs AVX-512 BF16
// dot products on them (kernels/bf16_dot_attention.h), or widens them to float32, runs its
// sgemms on them, and rounds its outputs and gradients back to bf16. Not for bf16 one-step
// decoding (T = 1), where the cached keys would be repacked or widened every step.
bool Bf16AttentionRunsNative(const at::Tensor& q, const at::Tensor& k, bool training);

bool StridedCoreAppliesImpl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (!HasSgemm()) return false;
  const at::ScalarType dtype = q.scalar_type();
  if (dtype == at::kBFloat16 && (q.dim() != 4 || q.size(1) <= 1)) return false;
  for (const at::Tensor* t : {&q, &k, &v}) {
    if ((dtype != at::kFloat && dtype != at::kBFloat16) || t->scalar_type() != dtype ||
        !t->device().is_cpu() || t->dim() != 4 || t->stride(3) != 1 || t->numel() == 0 ||
        t->stride(1) > (int64_t{1} << 30)) {
      return false;
    }
  }
  if (dtype == at::kBFloat16) {
    const bool training = at::GradMode::is_enabled() &&
                          (q.requires_grad() || k.requires_grad() || v.requires_grad());
    return Bf16AttentionRunsNative(q, k, training);
  }
  return true;
}

// A head's [rows, H] matrix of x [B, rows, N, H]: its start and row stride.
struct Heads {
  const float* data;
  int64_t sb, sn, row;
  explicit Heads(const at::Tensor& x)
      : data(x.data_ptr<float>()), sb(x.stride(0)), sn(x.stride(2)), row(x.stride(1)) {}
  const float* at(int64_t b, int64_t n) const { return data + b * sb + n * sn; }
};

// f(b, n) for every head, split over the kernel threads (glossa/kernels/parallel.h): ATen's
// in the bf16 layout, Glossa's own in the fp32 layout, each running single-threaded sgemms (one
// head's GEMMs are too small to split across cores).
template <typename F>
void ForEachHead(int64_t batch, int64_t heads, int64_t work_per_head, const F& f) {
  KernelParallelFor(0, batch * heads, ParallelGrain(work_per_head), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) f(i / heads, i % heads);
  });
}

// Causal attention (T = S, key s masked for query t < s) in blocks of this many queries: block j's
// queries see keys [0, (j + 1)·c) only, so the GEMMs skip the masked blocks above the diagonal
// (with 4 blocks, 37.5% of the work). A skipped product would only have added exact zeros (its
// probabilities are 0), but BLAS groups its partial sums by the inner dimension's length, so the
// outputs and gradients round differently in the last bits (the probabilities do not change);
// `causal_blocks: false` keeps the full computation.
int64_t CausalBlock(bool causal, int64_t T, int64_t S) {
  if (!causal || T != S || T < 64) return 0;
  return (T / 4 + 15) / 16 * 16;
}

// [1 or B, 1, T, S]: true where causal blocks of c queries skip the key (s ≥ (t / c + 1)·c, or
// before the first key of its block: block_starts, [B, blocks], or empty).
at::Tensor SkippedByCausalBlocks(int64_t T, int64_t S, int64_t c,
                                 const std::vector<int64_t>& block_starts) {
  const at::Tensor t = at::arange(T, at::kLong).view({T, 1}), s = at::arange(S, at::kLong);
  const at::Tensor block = t.div(c, "floor");
  at::Tensor skipped = (s >= (block + 1) * c).view({1, 1, T, S});
  if (block_starts.empty()) return skipped;
  const int64_t blocks = (T + c - 1) / c, B = static_cast<int64_t>(block_starts.size()) / blocks;
  const at::Tensor starts =
      at::tensor(block_starts, at::kLong).view({B, blocks}).index_select(1, block.view({T}));
  return skipped | (s.view({1, 1, S}) < starts.view({B, T, 1})).view({B, 1, T, S});
}

// Below this a bias entry masks its key: its probability is exactly 0 (Glossa's masks add the
// lowest float, or -inf).
constexpr float kMaskedBias = -1e30f;

// For causal blocks of c queries under a per-query bias [B, 1, T, S] (padding and segment masks:
// packed rows), the first key each block of each batch row must compute: the first key any of
// its queries may see. Keys before it have probability 0 for every query of the block, so the
// GEMMs skip them as they skip the keys after the block (a packed row's blocks compute their own
// segments, not every segment before them). A query that may see no key up to its block's end
// gets 0 (its softmax spreads over every key). Empty when every block starts at 0, or the bias
// is not per query.
std::vector<int64_t> BlockKeyStarts(const at::Tensor& bias, int64_t B, int64_t T, int64_t S,
                                    int64_t c) {
  if (c <= 0 || !bias.defined() || bias.dim() != 4 || bias.size(0) != B || bias.size(1) != 1 ||
      bias.size(2) != T || bias.size(3) != S || bias.scalar_type() != at::kFloat ||
      !bias.is_contiguous()) {
    return {};
  }
  const int64_t blocks = (T + c - 1) / c;
  std::vector<int64_t> starts(B * blocks, 0);
  const float* bp = bias.data_ptr<float>();
  bool any = false;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < blocks; ++j) {
      const int64_t t0 = j * c, t1 = std::min(T, t0 + c);
      int64_t first = t1;
      for (int64_t t = t0; t < t1 && first > 0; ++t) {
        const float* row = bp + (b * T + t) * S;
        int64_t s = 0;
        while (s < t1 && row[s] < kMaskedBias) ++s;
        first = s == t1 ? 0 : std::min(first, s);
      }
      starts[b * blocks + j] = first;
      any = any || first > 0;
    }
  }
  return any ? starts : std::vector<int64_t>();
}

// The first key block [t0, t0 + blk) of batch row b computes: block_starts' entry, or 0.
auto BlockFirstKey(const std::vector<int64_t>& block_starts, int64_t T, int64_t blk) {
  return [&block_starts, blocks = (T + blk - 1) / blk, blk](int64_t b, int64_t t0) -> int64_t {
    return block_starts.empty() ? 0 : block_starts[b * blocks + t0 / blk];
  };
}

class StridedAttentionCore : public torch::autograd::Function<StridedAttentionCore> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q_in, const at::Tensor& k_in,
                                                const at::Tensor& v_in, const at::Tensor& bias,
                                                bool causal) {
    RECORD_USER_SCOPE("fwd:StridedAttentionCore");  // seen by --profile_ops
    const bool bf16 = q_in.scalar_type() == at::kBFloat16;
    if (bf16 && Bf16DotAttentionApplies(q_in)) {  // AVX-512 BF16 products, no widened copies
      const int64_t B = q_in.size(0), T = q_in.size(1), S = k_in.size(1);
      const int64_t cb = CausalBlock(causal, T, S);
      const std::vector<int64_t> starts = BlockKeyStarts(bias, B, T, S, cb);
      Bf16DotAttention a = Bf16DotAttentionForward(q_in, k_in, v_in, bias, cb, starts);
      ctx->save_for_backward({q_in, k_in, v_in, bias});
      ctx->saved_data["dot"] = true;
      ctx->saved_data["bf16"] = true;
      ctx->saved_data["causal_block"] = cb;
      ctx->saved_data["block_starts"] = starts;
      ctx->set_materialize_grads(false);
      return {a.out, a.probs_bf16};
    }
    const at::Tensor q = bf16 ? Widen(q_in) : q_in, k = bf16 ? Widen(k_in) : k_in,
                     v = bf16 ? Widen(v_in) : v_in;
    const int64_t B = q.size(0), T = q.size(1), N = q.size(2), H = q.size(3), S = k.size(1);
    const int64_t cb = CausalBlock(causal, T, S), blk = cb > 0 ? cb : T;
    const std::vector<int64_t> starts = BlockKeyStarts(bias, B, T, S, cb);
    // Block [t0, t1)'s keys: [first(b, t0), t1) when causal, else all.
    const auto first = BlockFirstKey(starts, T, blk);
    auto keys = [&](int64_t t1) { return cb > 0 ? t1 : S; };
    at::Tensor logits = at::empty({B, N, T, S}, q.options());
    const Heads hq(q), hk(k), hv(v);
    float* lp = logits.data_ptr<float>();
    ForEachHead(B, N, 2 * T * S * H, [&](int64_t b, int64_t n) {
      for (int64_t t0 = 0; t0 < T; t0 += blk) {
        const int64_t t1 = std::min(T, t0 + blk), s0 = first(b, t0);
        RowMajorSgemm(false, true, t1 - t0, keys(t1) - s0, H, hq.at(b, n) + t0 * hq.row, hq.row,
                      hk.at(b, n) + s0 * hk.row, hk.row, 0.0f,
                      lp + ((b * N + n) * T + t0) * S + s0, S);
      }
    });
    at::Tensor probs;
    if (CpuHasAvx512F()) {
      SoftmaxWithBiasInPlace(logits, bias, cb, starts);  // one kernel: + mask, max, e^x, Σ, scale
      probs = logits;
    } else {
      if (cb > 0) {  // the skipped blocks (masked by the bias) were not computed
        logits.masked_fill_(SkippedByCausalBlocks(T, S, cb, starts), 0.0);
      }
      if (bias.numel() > 0) logits.add_(bias);
      probs = at::softmax(logits, -1);
    }
    at::Tensor out = at::empty({B, T, N, H}, q.options());
    const float* pp = probs.data_ptr<float>();
    float* op = out.data_ptr<float>();
    ForEachHead(B, N, 2 * T * S * H, [&](int64_t b, int64_t n) {
      for (int64_t t0 = 0; t0 < T; t0 += blk) {
        const int64_t t1 = std::min(T, t0 + blk), s0 = first(b, t0);
        RowMajorSgemm(false, false, t1 - t0, H, keys(t1) - s0,
                      pp + ((b * N + n) * T + t0) * S + s0, S, hv.at(b, n) + s0 * hv.row, hv.row,
                      0.0f, op + (b * T + t0) * N * H + n * H, N * H);
      }
    });
    ctx->save_for_backward({q, k, v, probs});
    ctx->saved_data["bf16"] = bf16;
    ctx->saved_data["causal_block"] = cb;
    ctx->saved_data["block_starts"] = starts;
    // An unused output (the probs, mostly) gets no gradient rather than a materialized zero
    // tensor [B, N, T, S] that backward would then add.
    ctx->set_materialize_grads(false);
    if (bf16) return {Narrow(out, at::kBFloat16), Narrow(probs, at::kBFloat16)};
    return {out, probs};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &probs = saved[3];
    const int64_t B = q.size(0), T = q.size(1), N = q.size(2), H = q.size(3), S = k.size(1);
    // dL/dP: through the output, plus the probs' own gradient when they were used (then over
    // whole rows: that gradient may be nonzero where the probabilities are 0).
    const bool bf16 = ctx->saved_data["bf16"].toBool();
    const int64_t cb = grads[1].defined() ? 0 : ctx->saved_data["causal_block"].toInt();
    const int64_t blk = cb > 0 ? cb : T;
    const std::vector<int64_t> starts =
        cb > 0 ? ctx->saved_data["block_starts"].toIntVector() : std::vector<int64_t>();
    if (ctx->saved_data.count("dot") > 0) {  // saved[3]: the bias (the probabilities are remade)
      const Bf16DotAttentionGrads d = Bf16DotAttentionBackward(
          q, k, v, saved[3],
          grads[0].defined() ? grads[0] : at::zeros({B, T, N, H}, q.options()), grads[1],
          ctx->saved_data["causal_block"].toInt(), ctx->saved_data["block_starts"].toIntVector());
      return {d.dq, d.dk, d.dv, at::Tensor(), at::Tensor()};
    }
    const auto first = BlockFirstKey(starts, T, blk);
    auto keys = [&](int64_t t1) { return cb > 0 ? t1 : S; };
    const at::Tensor g =
        grads[0].defined() ? Widen(grads[0]) : at::zeros({B, T, N, H}, q.options());
    const Heads hq(q), hk(k), hv(v);
    const float* gp = g.data_ptr<float>();
    const float* pp = probs.data_ptr<float>();
    at::Tensor dp = at::empty({B, N, T, S}, q.options());
    float* dpp = dp.data_ptr<float>();
    ForEachHead(B, N, 2 * T * S * H, [&](int64_t b, int64_t n) {
      for (int64_t t0 = 0; t0 < T; t0 += blk) {
        const int64_t t1 = std::min(T, t0 + blk), s0 = first(b, t0);
        RowMajorSgemm(false, true, t1 - t0, keys(t1) - s0, H, gp + (b * T + t0) * N * H + n * H,
                      N * H, hv.at(b, n) + s0 * hv.row, hv.row, 0.0f,
                      dpp + ((b * N + n) * T + t0) * S + s0, S);
      }
    });
    if (grads[1].defined()) dp.add_(bf16 ? Widen(grads[1]) : grads[1]);
    at::Tensor ds;
    if (CpuHasAvx512F()) {
      SoftmaxBackwardInPlace(dp, probs, cb, starts);
      ds = dp;
    } else {
      if (cb > 0) dp.masked_fill_(SkippedByCausalBlocks(T, S, cb, starts), 0.0);
      ds = at::_softmax_backward_data(dp, probs, -1, at::kFloat);
    }
    const float* dsp = ds.data_ptr<float>();
    at::Tensor dq = at::empty({B, T, N, H}, q.options());
    at::Tensor dk = at::empty({B, S, N, H}, q.options());
    at::Tensor dv = at::empty({B, S, N, H}, q.options());
    float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
    ForEachHead(B, N, 2 * T * S * H, [&](int64_t b, int64_t n) {
      const float* ds_bn = dsp + (b * N + n) * T * S;
      const float* p_bn = pp + (b * N + n) * T * S;
      for (int64_t t0 = 0; t0 < T; t0 += blk) {
        const int64_t t1 = std::min(T, t0 + blk), s0 = first(b, t0);
        RowMajorSgemm(false, false, t1 - t0, H, keys(t1) - s0, ds_bn + t0 * S + s0, S,
                      hk.at(b, n) + s0 * hk.row, hk.row, 0.0f,
                      dqp + (b * T + t0) * N * H + n * H, N * H);
      }
      // Keys [s0, s1): causal, only queries from s0 on see them.
      const int64_t kblk = cb > 0 ? cb : S;
      for (int64_t s0 = 0; s0 < S; s0 += kblk) {
        const int64_t s1 = std::min(S, s0 + kblk), from = cb > 0 ? s0 : 0;
        RowMajorSgemm(true, false, s1 - s0, H, T - from, ds_bn + from * S + s0, S,
                      hq.at(b, n) + from * hq.row, hq.row, 0.0f,
                      dkp + (b * S + s0) * N * H + n * H, N * H);
        RowMajorSgemm(true, false, s1 - s0, H, T - from, p_bn + from * S + s0, S,
                      gp + (b * T + from) * N * H + n * H, N * H, 0.0f,
                      dvp + (b * S + s0) * N * H + n * H, N * H);
      }
    });
    if (bf16) {
      return {Narrow(dq, at::kBFloat16), Narrow(dk, at::kBFloat16), Narrow(dv, at::kBFloat16),
              at::Tensor(), at::Tensor()};
    }
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

// bf16 attention on the native core (float32 sgemms of the widened heads) or ATen's (oneDNN's
// bf16 batched GEMMs): measured once per shape class (glossa/kernels/kernel_choice.h).
bool Bf16AttentionRunsNative(const at::Tensor& q, const at::Tensor& k, bool training) {
  // One path per head shape and mode, measured at a fixed batch and length, whatever the batch:
  // a sentence's bits must not depend on what shares its batch (sharded decoding, batch-invariant
  // serving), as they would if the path changed with the batch's shape.
  (void)k;
  const int64_t B = training ? 8 : 4, T = training ? 128 : 64, S = T, N = q.size(2),
                H = q.size(3);
  const std::string shape =
      StrCat("B", B, " T", T, " S", S, " N", N, " H", H, training ? " train" : " infer");
  return ChooseNative(KernelChoice::kBf16, "bf16_attention", shape, [&](bool native) {
    at::AutoGradMode grad(training);
    auto operand = [](int64_t b, int64_t t, int64_t n, int64_t h, double phase) {
      return at::sin(at::arange(b * t * n * h, at::kFloat).mul_(0.37).add_(phase))
          .reshape({b, t, n, h})
          .to(at::kBFloat16);
    };
    const at::Tensor pq = operand(B, T, N, H, 0.1).requires_grad_(training);
    const at::Tensor pk = operand(B, S, N, H, 0.5).requires_grad_(training);
    const at::Tensor pv = operand(B, S, N, H, 0.9).requires_grad_(training);
    const at::Tensor no_bias = at::empty({0}, at::kFloat);
    const at::Tensor out =
        native ? StridedAttentionCore::apply(pq, pk, pv, no_bias, false)[0]
               : AttentionCoreReference(pq, pk, pv, no_bias).first;
    if (training) out.backward(at::ones_like(out));
  });
}

}  // namespace

bool AttentionCoreNativeApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return StridedCoreAppliesImpl(q, k, v);
}

std::pair<at::Tensor, at::Tensor> AttentionCore(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& bias,
                                                bool causal_blocks, bool batch_invariant) {
  if (batch_invariant && !KernelsForcedToReference() && q.device().is_cpu() &&
      q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
      v.scalar_type() == at::kFloat) {
    return InvariantAttention(q, k, v, bias);  // the bias masks the future: no causal blocks
  }
  if (AttentionCoreNativeApplies(q, k, v)) {
    auto out = StridedAttentionCore::apply(q, k, v, bias, causal_blocks);
    return {out[0], out[1]};
  }
  return AttentionCoreReference(q, k, v, bias);
}

std::pair<at::Tensor, at::Tensor> AttentionCoreReference(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v,
                                                         const at::Tensor& bias) {
  at::Tensor logits = at::einsum("btnh,bsnh->bnts", {q, k});
  // bf16 logits: the bias added and the softmax taken in one pass (kernels/bf16_softmax.h).
  if (Bf16SoftmaxApplies(logits, bias)) {
    const at::Tensor probs = Bf16SoftmaxWithBias(logits, bias);
    return {at::einsum("bnts,bsnh->btnh", {probs, v}), probs};
  }
  // The mask as an additive bias on the (small, broadcast) mask: a masked_fill over the full
  // [B, N, T, S] logits, and its backward, cost ~10x more on CPU. logit + lowest rounds to
  // lowest for any finite logit of sane size, so the result is the same.
  if (bias.defined() && bias.numel() > 0) logits = logits + bias;
  at::Tensor probs = at::softmax(logits, -1);
  return {at::einsum("bnts,bsnh->btnh", {probs, v}), probs};
}

}  // namespace glossa
