#include "glossa/kernels/attention_core.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/batch_invariant.h"
#include "glossa/kernels/bf16_dot_attention.h"
#include "glossa/kernels/bf16_softmax.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/kernels/parallel.h"
#include "glossa/kernels/small_gemm.h"

namespace glossa {
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
bool SmallGemmsFor(int64_t N, int64_t H, bool training);

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

// The calling thread's scratch buffer `slot` (a head's packed operands), at least `size` floats.
float* HeadScratch(int slot, int64_t size) {
  thread_local std::vector<float> buffers[6];  // per-thread cache: scratch, not state
  std::vector<float>& b = buffers[slot];
  if (static_cast<int64_t>(b.size()) < size) b.resize(size);
  return b.data();
}

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
  // long function: a head's stages (scores, softmax, weighted values) share its geometry, and
  // run fused a head at a time or stage by stage (without AVX-512) on the same per-head GEMMs.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q_in, const at::Tensor& k_in,
                                                const at::Tensor& v_in, const at::Tensor& bias,
                                                const at::Tensor& scale, bool causal, bool small) {
    RECORD_USER_SCOPE("fwd:StridedAttentionCore");  // seen by --profile_ops
    if (k_in.numel() == 0) {  // q_in: the fused projection [B, T, 3, N, H] (float32, AttentionCoreQkv)
      ctx->saved_data["fused"] = true;
      return forward(ctx, q_in.select(2, 0), q_in.select(2, 1), q_in.select(2, 2), bias, scale,
                     causal, small);
    }
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
    at::Tensor out = at::empty({B, T, N, H}, q.options());
    float* op = out.data_ptr<float>();
    // Head (b, n)'s q·kᵀ into its rows of the logits, and its probabilities (pp: the logits'
    // memory, or ATen's softmax's) times v into its columns of the output.
    const int64_t ldt = S + 16;  // kᵀ's rows padded off a multiple of 1 KB (L1's sets)
    const float* sp = scale.numel() > 0 ? scale.data_ptr<float>() : nullptr;
    auto scores = [&](int64_t b, int64_t n) {
      float* kt = nullptr;
      if (small) {
        kt = HeadScratch(0, H * ldt);
        TransposeRows(S, H, hk.at(b, n), hk.row, kt, ldt);
      }
      // The head's queries, times the scale (q ∘ s, as ATen's product) where there is one.
      const float* qr = hq.at(b, n);
      int64_t q_row = hq.row;
      if (sp != nullptr) {
        float* qs = HeadScratch(2, T * H);
        PackScaledRows(T, H, qr, q_row, sp, qs, H);
        qr = qs, q_row = H;
      }
      for (int64_t t0 = 0; t0 < T; t0 += blk) {
        const int64_t t1 = std::min(T, t0 + blk), s0 = first(b, t0);
        float* c = lp + ((b * N + n) * T + t0) * S + s0;
        if (small) {
          SmallSgemm(t1 - t0, keys(t1) - s0, H, qr + t0 * q_row, q_row, 1, kt + s0, ldt, false, c,
                     S);
        } else {
          RowMajorSgemm(false, true, t1 - t0, keys(t1) - s0, H, qr + t0 * q_row, q_row,
                        hk.at(b, n) + s0 * hk.row, hk.row, 0.0f, c, S);
        }
      }
    };
    const float* pp = lp;
    auto weighted = [&](int64_t b, int64_t n) {
      float* vc = nullptr;
      if (small) {
        vc = HeadScratch(1, S * H);
        PackRows(S, H, hv.at(b, n), hv.row, vc, H);
      }
      for (int64_t t0 = 0; t0 < T; t0 += blk) {
        const int64_t t1 = std::min(T, t0 + blk), s0 = first(b, t0);
        const float* a = pp + ((b * N + n) * T + t0) * S + s0;
        float* c = op + (b * T + t0) * N * H + n * H;
        if (small) {
          SmallSgemm(t1 - t0, H, keys(t1) - s0, a, S, 1, vc + s0 * H, H, false, c, N * H);
        } else {
          RowMajorSgemm(false, false, t1 - t0, H, keys(t1) - s0, a, S, hv.at(b, n) + s0 * hv.row,
                        hv.row, 0.0f, c, N * H);
        }
      }
    };
    at::Tensor probs;
    if (CpuHasAvx512F()) {
      // Each head's scores, softmax (+ mask, max, e^x, Σ, scale) and weighted values in turn,
      // while its [T, S] rows are in the core's cache: one pass over the [B, N, T, S] logits in
      // memory instead of four. The same calls on the same rows as one stage at a time over
      // every head, so the same bits.
      ForEachHead(B, N, 4 * T * S * H, [&](int64_t b, int64_t n) {
        scores(b, n);
        const int64_t r0 = (b * N + n) * T;
        SoftmaxWithBiasOnRows(lp, logits.sizes(), bias, cb, starts, r0, r0 + T);
        weighted(b, n);
      });
      probs = logits;
    } else {
      ForEachHead(B, N, 2 * T * S * H, scores);
      if (cb > 0) {  // the skipped blocks (masked by the bias) were not computed
        logits.masked_fill_(SkippedByCausalBlocks(T, S, cb, starts), 0.0);
      }
      if (bias.numel() > 0) logits.add_(bias);
      probs = at::softmax(logits, -1);
      pp = probs.data_ptr<float>();
      ForEachHead(B, N, 2 * T * S * H, weighted);
    }
    ctx->save_for_backward({q, k, v, probs, scale});
    ctx->saved_data["bf16"] = bf16;
    ctx->saved_data["small"] = small;
    ctx->saved_data["causal_block"] = cb;
    ctx->saved_data["block_starts"] = starts;
    // An unused output (the probs, mostly) gets no gradient rather than a materialized zero
    // tensor [B, N, T, S] that backward would then add.
    ctx->set_materialize_grads(false);
    if (bf16) return {Narrow(out, at::kBFloat16), Narrow(probs, at::kBFloat16)};
    return {out, probs};
  }

  // long function: as the forward, a head's stages share its geometry and run fused a head at a
  // time, or stage by stage where the probabilities' own gradient joins dL/dP.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &probs = saved[3];
    // The query scale s (q ∘ s met the keys): dq = (dS·k) ∘ s, ds = Σ (dS·k) ∘ q, and dk = dSᵀ·(q ∘ s).
    const at::Tensor scale = saved.size() > 4 ? saved[4] : at::Tensor();
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
      return {d.dq, d.dk, d.dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const auto first = BlockFirstKey(starts, T, blk);
    auto keys = [&](int64_t t1) { return cb > 0 ? t1 : S; };
    const at::Tensor g =
        grads[0].defined() ? Widen(grads[0]) : at::zeros({B, T, N, H}, q.options());
    const Heads hq(q), hk(k), hv(v);
    const float* gp = g.data_ptr<float>();
    const float* pp = probs.data_ptr<float>();
    // The gradients: of the fused projection [B, T, 3, N, H] (no stack of three after), or of q,
    // k and v; `grow`: their row stride.
    const bool fused = ctx->saved_data.count("fused") > 0;
    const at::Tensor dqkv = fused ? at::empty({B, T, 3, N, H}, q.options()) : at::Tensor();
    at::Tensor dq = fused ? dqkv.select(2, 0) : at::empty({B, T, N, H}, q.options());
    at::Tensor dk = fused ? dqkv.select(2, 1) : at::empty({B, S, N, H}, q.options());
    at::Tensor dv = fused ? dqkv.select(2, 2) : at::empty({B, S, N, H}, q.options());
    const int64_t grow = fused ? 3 * N * H : N * H;
    float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
    const float* sp = scale.defined() && scale.numel() > 0 ? scale.data_ptr<float>() : nullptr;
    const bool want_scale = sp != nullptr && ctx->needs_input_grad(4);
    // Each head's Σₜ (dS·k)[t, h]·q[t, h], summed over the heads in order after the loop.
    at::Tensor scale_parts = want_scale ? at::empty({B * N, H}, q.options()) : at::Tensor();
    // Head (b, n)'s dL/dP = dO·vᵀ into dp_bn ([T, S], row stride S).
    const bool small = ctx->saved_data["small"].toBool();
    const int64_t ldt = S + 16;  // vᵀ's rows padded off a multiple of 1 KB (L1's sets)
    auto prob_grads = [&](int64_t b, int64_t n, float* dp_bn) {
      float* vt = nullptr;
      if (small) {
        vt = HeadScratch(0, H * ldt);
        TransposeRows(S, H, hv.at(b, n), hv.row, vt, ldt);
      }
      for (int64_t t0 = 0; t0 < T; t0 += blk) {
        const int64_t t1 = std::min(T, t0 + blk), s0 = first(b, t0);
        const float* a = gp + (b * T + t0) * N * H + n * H;
        if (small) {
          SmallSgemm(t1 - t0, keys(t1) - s0, H, a, N * H, 1, vt + s0, ldt, false,
                     dp_bn + t0 * S + s0, S);
        } else {
          RowMajorSgemm(false, true, t1 - t0, keys(t1) - s0, H, a, N * H,
                        hv.at(b, n) + s0 * hv.row, hv.row, 0.0f, dp_bn + t0 * S + s0, S);
        }
      }
    };
    // Head (b, n)'s dq = dS·k, dk = dSᵀ·q, dv = Pᵀ·dO from its dL/dS ds_bn ([T, S]).
    auto input_grads = [&](int64_t b, int64_t n, const float* ds_bn) {
      const float* p_bn = pp + (b * N + n) * T * S;
      // k, q and dO's rows of the head: in place for BLAS, packed for SmallSgemm.
      const float *kr = hk.at(b, n), *qr = hq.at(b, n), *gr = gp + b * T * N * H + n * H;
      int64_t k_row = hk.row, q_row = hq.row, g_row = N * H;
      if (small) {
        float *kc = HeadScratch(1, S * H), *gc = HeadScratch(3, T * H);
        PackRows(S, H, kr, k_row, kc, H);
        PackRows(T, H, gr, g_row, gc, H);
        kr = kc, gr = gc;
        k_row = g_row = H;
      }
      if (small || sp != nullptr) {  // the queries as the forward met them
        float* qc = HeadScratch(2, T * H);
        if (sp != nullptr) {
          PackScaledRows(T, H, qr, q_row, sp, qc, H);
        } else {
          PackRows(T, H, qr, q_row, qc, H);
        }
        qr = qc, q_row = H;
      }
      // dS·k: into dq, or where there is a scale into a buffer, then dq = (dS·k) ∘ s.
      float* dqs = sp != nullptr ? HeadScratch(4, T * H) : nullptr;
      for (int64_t t0 = 0; t0 < T; t0 += blk) {
        const int64_t t1 = std::min(T, t0 + blk), s0 = first(b, t0);
        float* c = dqs != nullptr ? dqs + t0 * H : dqp + (b * T + t0) * grow + n * H;
        const int64_t ldc = dqs != nullptr ? H : grow;
        if (small) {
          SmallSgemm(t1 - t0, H, keys(t1) - s0, ds_bn + t0 * S + s0, S, 1, kr + s0 * k_row, k_row,
                     false, c, ldc);
        } else {
          RowMajorSgemm(false, false, t1 - t0, H, keys(t1) - s0, ds_bn + t0 * S + s0, S,
                        kr + s0 * k_row, k_row, 0.0f, c, ldc);
        }
      }
      if (dqs != nullptr) {
        ScaleRowsAndDot(T, H, dqs, sp, hq.at(b, n), hq.row, dqp + b * T * grow + n * H, grow,
                        want_scale ? scale_parts.data_ptr<float>() + (b * N + n) * H : nullptr);
      }
      // Keys [s0, s1): causal, only queries from s0 on see them.
      const int64_t kblk = cb > 0 ? cb : S;
      for (int64_t s0 = 0; s0 < S; s0 += kblk) {
        const int64_t s1 = std::min(S, s0 + kblk), from = cb > 0 ? s0 : 0;
        float *dkc = dkp + (b * S + s0) * grow + n * H, *dvc = dvp + (b * S + s0) * grow + n * H;
        if (small) {  // dSᵀ and Pᵀ read in place as the transposed A
          SmallSgemm(s1 - s0, H, T - from, ds_bn + from * S + s0, 1, S, qr + from * q_row, q_row,
                     false, dkc, grow);
          SmallSgemm(s1 - s0, H, T - from, p_bn + from * S + s0, 1, S, gr + from * g_row, g_row,
                     false, dvc, grow);
        } else {
          RowMajorSgemm(true, false, s1 - s0, H, T - from, ds_bn + from * S + s0, S,
                        qr + from * q_row, q_row, 0.0f, dkc, grow);
          RowMajorSgemm(true, false, s1 - s0, H, T - from, p_bn + from * S + s0, S,
                        gr + from * g_row, g_row, 0.0f, dvc, grow);
        }
      }
    };
    if (CpuHasAvx512F() && !grads[1].defined()) {
      // Each head in turn in a [T, S] buffer of its thread, while it is in the core's cache:
      // no [B, N, T, S] dL/dP in memory. The same calls on the same rows, so the same bits.
      KernelParallelFor(0, B * N, ParallelGrain(8 * T * S * H), [&](int64_t lo, int64_t hi) {
        std::vector<float> ds(T * S);
        for (int64_t i = lo; i < hi; ++i) {
          prob_grads(i / N, i % N, ds.data());
          SoftmaxBackwardOnRows(ds.data(), i * T, pp, probs.sizes(), cb, starts, i * T,
                                (i + 1) * T);
          input_grads(i / N, i % N, ds.data());
        }
      });
    } else {
      at::Tensor dp = at::empty({B, N, T, S}, q.options());
      float* dpp = dp.data_ptr<float>();
      ForEachHead(B, N, 2 * T * S * H,
                  [&](int64_t b, int64_t n) { prob_grads(b, n, dpp + (b * N + n) * T * S); });
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
      ForEachHead(B, N, 2 * T * S * H,
                  [&](int64_t b, int64_t n) { input_grads(b, n, dsp + (b * N + n) * T * S); });
    }
    at::Tensor dscale;
    if (want_scale) {  // the heads' sums added in order: the same bits on any thread count
      dscale = at::zeros({H}, q.options());
      float* d = dscale.data_ptr<float>();
      const float* parts = scale_parts.data_ptr<float>();
      for (int64_t i = 0; i < B * N; ++i) {
        for (int64_t h = 0; h < H; ++h) d[h] += parts[i * H + h];
      }
    }
    if (bf16) {
      return {Narrow(dq, at::kBFloat16), Narrow(dk, at::kBFloat16), Narrow(dv, at::kBFloat16),
              at::Tensor(), dscale, at::Tensor(), at::Tensor()};
    }
    if (fused) return {dqkv, at::Tensor(), at::Tensor(), at::Tensor(), dscale, at::Tensor(), at::Tensor()};
    return {dq, dk, dv, at::Tensor(), dscale, at::Tensor(), at::Tensor()};
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
  // Decided before this probe: a probe runs under the decisions' lock.
  const bool small = SmallGemmsFor(N, H, training);
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
        native ? StridedAttentionCore::apply(pq, pk, pv, no_bias, no_bias, false, small)[0]
               : AttentionCoreReference(pq, pk, pv, no_bias).first;
    if (training) out.backward(at::ones_like(out));
  });
}

// Whether the core's per-head products run on SmallSgemm (Glossa's small-GEMM kernel, on the
// head's operands packed once per head) rather than BLAS sgemm (on them in place, packing both
// on every call): on a CPU with AVX-512F, measured once per head shape and mode at a fixed batch
// and length (KernelChoice::kRowKernel: Glossa's kernels where BLAS packs its operands on every
// call; --row_kernels pins it). Inside a training step of the 512-wide LM (Xeon without AMX)
// the core's forward and backward took ~89 ms a step with it, ~108 with BLAS's.
bool SmallGemmsFor(int64_t N, int64_t H, bool training) {
  if (!CpuHasAvx512F()) return false;
  const int64_t B = training ? 8 : 4, T = training ? 128 : 64;
  const std::string shape = StrCat("B", B, " T", T, " S", T, " N", N, " H", H, " causal",
                                   training ? " train" : " infer");
  return ChooseNative(KernelChoice::kRowKernel, "fp32_attention", shape, [&](bool native) {
    at::AutoGradMode grad(training);
    auto operand = [&](double phase) {
      return at::sin(at::arange(B * T * N * H, at::kFloat).mul_(0.37).add_(phase))
          .reshape({B, T, N, H})
          .requires_grad_(training);
    };
    const at::Tensor pq = operand(0.1), pk = operand(0.5), pv = operand(0.9);
    const at::Tensor bias = at::full({T, T}, -1e30f).triu_(1).view({1, 1, T, T});
    const at::Tensor out =
        StridedAttentionCore::apply(pq, pk, pv, bias, at::empty({0}, at::kFloat), true, native)[0];
    if (training) out.backward(at::ones_like(out));
  });
}

}  // namespace

bool AttentionCoreNativeApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return StridedCoreAppliesImpl(q, k, v);
}

namespace {

// Whether the native core can apply query_scale itself to q [B, T, N, H]: float32 [H] on the CPU.
bool ScaleGoesInside(const at::Tensor& query_scale, const at::Tensor& q) {
  const at::Tensor& s = query_scale;
  return s.defined() && q.scalar_type() == at::kFloat && s.scalar_type() == at::kFloat &&
         s.dim() == 1 && s.size(0) == q.size(3) && s.is_contiguous() && s.device().is_cpu();
}

// The native core on q (or the fused projection, k and v then empty), its per-head GEMMs as
// measured for q's head shape; `scale`: applied inside, or undefined.
std::pair<at::Tensor, at::Tensor> NativeCore(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& bias,
                                             const at::Tensor& scale, bool causal_blocks,
                                             int64_t heads, int64_t head_dim) {
  const bool training =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad() ||
                                     (scale.defined() && scale.requires_grad()));
  auto out = StridedAttentionCore::apply(q, k, v, bias,
                                         scale.defined() ? scale : at::empty({0}, q.options()),
                                         causal_blocks, SmallGemmsFor(heads, head_dim, training));
  return {out[0], out[1]};
}

}  // namespace

std::pair<at::Tensor, at::Tensor> AttentionCore(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& bias,
                                                bool causal_blocks, bool batch_invariant,
                                                const at::Tensor& query_scale) {
  const bool fp32 = q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                    v.scalar_type() == at::kFloat;
  const bool invariant = batch_invariant && !KernelsForcedToReference() && q.device().is_cpu() && fp32;
  const bool native = !invariant && AttentionCoreNativeApplies(q, k, v);
  const bool scale_inside = native && fp32 && ScaleGoesInside(query_scale, q);
  const at::Tensor qs = query_scale.defined() && !scale_inside ? q * query_scale : q;
  if (invariant) {
    return InvariantAttention(qs, k, v, bias);  // the bias masks the future: no causal blocks
  }
  if (native) {
    return NativeCore(qs, k, v, bias, scale_inside ? query_scale : at::Tensor(), causal_blocks,
                      q.size(2), q.size(3));
  }
  return AttentionCoreReference(qs, k, v, bias);
}

std::pair<at::Tensor, at::Tensor> AttentionCoreQkv(const at::Tensor& qkv, const at::Tensor& bias,
                                                   bool causal_blocks, bool batch_invariant,
                                                   const at::Tensor& query_scale) {
  if (qkv.dim() != 5 || qkv.size(2) != 3) {
    throw InvalidArgumentError(StrCat("AttentionCoreQkv: qkv must be [B, T, 3, N, H], got ", qkv.sizes()));
  }
  const std::vector<at::Tensor> parts = qkv.unbind(2);
  const at::Tensor &q = parts[0], &k = parts[1], &v = parts[2];
  const bool whole = qkv.scalar_type() == at::kFloat &&
                     !(batch_invariant && !KernelsForcedToReference()) &&
                     AttentionCoreNativeApplies(q, k, v) &&
                     (!query_scale.defined() || ScaleGoesInside(query_scale, q));
  if (!whole) return AttentionCore(q, k, v, bias, causal_blocks, batch_invariant, query_scale);
  const at::Tensor none = at::empty({0}, qkv.options());
  return NativeCore(qkv, none, none, bias, query_scale, causal_blocks, q.size(2), q.size(3));
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
