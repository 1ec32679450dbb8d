#include "glossa/kernels/bf16_dot_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "glossa/kernels/attention_core.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"
#if GLOSSA_X86_SIMD
// GCC 12 reports _mm512_undefined_epi32() inside its own AVX-512 intrinsics (zero-extensions,
// masked loads) as uninitialized; a known false positive (as in kernels/simd_math.h).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "glossa/kernels/bf16_simd.h"
#endif

namespace glossa {

bool Bf16DotAttentionApplies(const at::Tensor& q) {
  return CpuHasAvx512Bf16() && q.dim() == 4 && q.size(3) % 2 == 0;
}

namespace {

// Head (b, n) of x [B, rows, N, H] (bf16, rows contiguous): its first row and row stride.
struct Head {
  const uint16_t* data;
  int64_t row;
  Head(const at::Tensor& x, int64_t b, int64_t n)
      : data(reinterpret_cast<const uint16_t*>(x.data_ptr()) + b * x.stride(0) + n * x.stride(2)),
        row(x.stride(1)) {}
};

// The keys query block [t0, t0 + blk) of batch row b computes: [first, end).
struct Blocks {
  int64_t T, S, cb, blk, count;
  const std::vector<int64_t>* starts;
  Blocks(int64_t t, int64_t s, int64_t causal_block, const std::vector<int64_t>& block_starts)
      : T(t), S(s), cb(causal_block), blk(causal_block > 0 ? causal_block : t),
        count((t + (causal_block > 0 ? causal_block : t) - 1) / (causal_block > 0 ? causal_block : t)),
        starts(&block_starts) {}
  int64_t First(int64_t b, int64_t t0) const {
    return starts->empty() ? 0 : (*starts)[b * count + t0 / blk];
  }
  int64_t End(int64_t t1) const { return cb > 0 ? t1 : S; }
  // Batch row b's block starts, as the softmax of one head takes them.
  std::vector<int64_t> RowStarts(int64_t b) const {
    if (starts->empty()) return {};
    return std::vector<int64_t>(starts->begin() + b * count, starts->begin() + (b + 1) * count);
  }
};

#if GLOSSA_X86_SIMD

#define GLOSSA_BF16_DOT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// The products. A "pair" is two bf16 values in one 32-bit word (the first in the low half); a
// dot-product lane adds a pair's two products. C [M, N] = Σ_p A(i, p) · B[p][j] over `pairs`
// pairs, A's pair (i, p) read at byte offset i·am + p·ap from a (two bf16 values in a row of a
// row-major matrix, or a word of a packed one), B row-major words with row stride ldb. With
// half_last, the last pair of A has one value (its high half counts as 0: the last column of a
// row of odd length). C is float32 or bf16 (rounded once), row stride ldc.

// A tile of up to 8 rows by 32 columns (masks m0 and m1) in 16 accumulators: rows past `rows`
// repeat the last row's products and are not stored. (Named registers, not an array: GCC 12
// kept an array of 16 accumulators in memory, storing all of them at every pair.)
template <bool kBf16Out>
GLOSSA_BF16_DOT void DotTile(int64_t rows, const char* a, int64_t am, int64_t ap,
                             const uint32_t* b, int64_t ldb, int64_t pairs, bool half_last,
                             __mmask16 m0, __mmask16 m1, void* c, int64_t ldc) {
  const char* r[8];
  for (int i = 0; i < 8; ++i) r[i] = a + std::min<int64_t>(i, rows - 1) * am;
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00,
         c70 = c00, c71 = c00;
  const int64_t whole = half_last && pairs > 0 ? pairs - 1 : pairs;
  // A's pair as a broadcast word; `mask` keeps its low half only (a last pair of one value).
  auto word = [](const char* p, uint32_t mask) {
    uint32_t w;
    std::memcpy(&w, p, 4);
    return static_cast<int>(w & mask);
  };
#define GLOSSA_DOT_ROW(i, off, mask)                                                          \
  {                                                                                           \
    const __m512bh av = (__m512bh)_mm512_set1_epi32(word(r[i] + (off), (mask)));             \
    c##i##0 = _mm512_dpbf16_ps(c##i##0, av, (__m512bh)b0);                                    \
    c##i##1 = _mm512_dpbf16_ps(c##i##1, av, (__m512bh)b1);                                    \
  }
#define GLOSSA_DOT_STEP(p, mask)                                                              \
  {                                                                                           \
    const __m512i b0 = _mm512_maskz_loadu_epi32(m0, b + (p) * ldb);                           \
    const __m512i b1 = _mm512_maskz_loadu_epi32(m1, b + (p) * ldb + 16);                      \
    const int64_t off = (p) * ap;                                                             \
    GLOSSA_DOT_ROW(0, off, mask) GLOSSA_DOT_ROW(1, off, mask) GLOSSA_DOT_ROW(2, off, mask)    \
    GLOSSA_DOT_ROW(3, off, mask) GLOSSA_DOT_ROW(4, off, mask) GLOSSA_DOT_ROW(5, off, mask)    \
    GLOSSA_DOT_ROW(6, off, mask) GLOSSA_DOT_ROW(7, off, mask)                                 \
  }
  for (int64_t p = 0; p < whole; ++p) GLOSSA_DOT_STEP(p, 0xffffffffu)
  // The last pair's second value is past the row's end: read as 0 (its low half only). The
  // 4-byte read stays inside the row's buffer only when the row is not the last, so read 2.
  if (whole < pairs) {
    const __m512i b0 = _mm512_maskz_loadu_epi32(m0, b + whole * ldb);
    const __m512i b1 = _mm512_maskz_loadu_epi32(m1, b + whole * ldb + 16);
    auto half = [&](int i) {
      uint16_t lo;
      std::memcpy(&lo, r[i] + whole * ap, 2);
      return static_cast<int>(lo);
    };
#define GLOSSA_DOT_HALF(i)                                           \
  {                                                                  \
    const __m512bh av = (__m512bh)_mm512_set1_epi32(half(i));        \
    c##i##0 = _mm512_dpbf16_ps(c##i##0, av, (__m512bh)b0);           \
    c##i##1 = _mm512_dpbf16_ps(c##i##1, av, (__m512bh)b1);           \
  }
    GLOSSA_DOT_HALF(0) GLOSSA_DOT_HALF(1) GLOSSA_DOT_HALF(2) GLOSSA_DOT_HALF(3)
    GLOSSA_DOT_HALF(4) GLOSSA_DOT_HALF(5) GLOSSA_DOT_HALF(6) GLOSSA_DOT_HALF(7)
#undef GLOSSA_DOT_HALF
  }
#undef GLOSSA_DOT_STEP
#undef GLOSSA_DOT_ROW
  const __m512 out[8][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                            {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
  for (int64_t i = 0; i < rows; ++i) {
    for (int j = 0; j < 2; ++j) {
      const __mmask16 m = j == 0 ? m0 : m1;
      if (m == 0) continue;
      if constexpr (kBf16Out) {
        bf16_simd::Store(static_cast<uint16_t*>(c) + i * ldc + 16 * j, out[i][j], m);
      } else {
        _mm512_mask_storeu_ps(static_cast<float*>(c) + i * ldc + 16 * j, m, out[i][j]);
      }
    }
  }
}

// C [M, N] in tiles of 8 rows by 32 columns (16 accumulators, two B vectors, one A broadcast).
template <bool kBf16Out>
GLOSSA_BF16_DOT void Dot(const void* a, int64_t am, int64_t ap, const uint32_t* b, int64_t ldb,
                         int64_t M, int64_t N, int64_t pairs, bool half_last, void* c,
                         int64_t ldc) {
  using Out = std::conditional_t<kBf16Out, uint16_t, float>;
  for (int64_t j0 = 0; j0 < N; j0 += 32) {
    const int64_t cols = std::min<int64_t>(32, N - j0);
    const __mmask16 m0 = bf16_simd::FirstLanes(cols);
    const __mmask16 m1 = cols > 16 ? bf16_simd::FirstLanes(cols - 16) : 0;
    for (int64_t i0 = 0; i0 < M; i0 += 8) {
      DotTile<kBf16Out>(std::min<int64_t>(8, M - i0), static_cast<const char*>(a) + i0 * am, am,
                        ap, b + j0, ldb, pairs, half_last, m0, m1,
                        static_cast<Out*>(c) + i0 * ldc + j0, ldc);
    }
  }
}

// The packings (each a few thousand words a head, against T·S·H products).

// dst[p][r] = the p-th pair of row r (the pairs along a head row, as words across rows):
// rows [0, R) of x (row stride `row`), H/2 pairs each; dst's row stride R.
void PairsAcrossRows(const uint16_t* x, int64_t row, int64_t R, int64_t H, uint32_t* dst) {
  const int64_t P = H / 2;
  for (int64_t r = 0; r < R; ++r) {
    const uint16_t* xr = x + r * row;
    for (int64_t p = 0; p < P; ++p) {
      uint32_t w;
      std::memcpy(&w, xr + 2 * p, 4);
      dst[p * R + r] = w;
    }
  }
}

// The bf16 bits of 16 values (the first lanes of m) in the low halves of 32-bit lanes: bf16
// values as they are, float32 ones rounded (as c10::BFloat16 rounds).
GLOSSA_BF16_DOT inline __m512i Bits16(const uint16_t* x, __mmask16 m) {
  return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x));
}
GLOSSA_BF16_DOT inline __m512i Bits16(const float* x, __mmask16 m) {
  return bf16_simd::RoundToBits(_mm512_maskz_loadu_ps(m, x));
}

// dst[p][c] = (x[2p][c], x[2p + 1][c]) for c < C: pairs of consecutive rows of x (bf16, or
// float32 rounded to bf16; row stride `row`), ⌈R/2⌉ of them (a missing row 2p + 1 gives 0);
// dst's row stride C.
template <typename T>
GLOSSA_BF16_DOT void PairsOfRows(const T* x, int64_t row, int64_t R, int64_t C, uint32_t* dst) {
  for (int64_t p = 0; 2 * p < R; ++p) {
    const T* lo = x + 2 * p * row;
    const T* hi = 2 * p + 1 < R ? lo + row : nullptr;
    for (int64_t c = 0; c < C; c += 16) {
      const __mmask16 m = bf16_simd::FirstLanes(C - c);
      __m512i w = Bits16(lo + c, m);
      if (hi != nullptr) w = _mm512_or_si512(w, _mm512_slli_epi32(Bits16(hi + c, m), 16));
      _mm512_mask_storeu_epi32(dst + p * C + c, m, w);
    }
  }
}

// bf16 rows of float32 ones: R rows of C values, both with row stride C.
GLOSSA_BF16_DOT void RoundRows(const float* x, int64_t R, int64_t C, uint16_t* dst) {
  const int64_t n = R * C;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = bf16_simd::FirstLanes(n - i);
    bf16_simd::Store(dst + i, _mm512_maskz_loadu_ps(m, x + i), m);
  }
}

// Pairs [first / 2, ⌈end / 2⌉) of a row's columns [first, end): the pair holding `first` (its
// other value, before `first`, is 0 there: the softmax zeroes a row before its first key), and
// whether the last pair has one value.
struct PairRange {
  int64_t first, count;
  bool half_last;
  PairRange(int64_t from, int64_t end)
      : first(from / 2), count((end + 1) / 2 - from / 2), half_last(end % 2 == 1) {}
};

// The bias rows of batch row b: bias [B or 1, 1, T or 1, S], or empty.
at::Tensor BiasOfRow(const at::Tensor& bias, int64_t b) {
  if (!bias.defined() || bias.numel() == 0 || bias.size(0) == 1) return bias;
  return bias.narrow(0, b, 1);
}

#endif  // GLOSSA_X86_SIMD

}  // namespace

#if GLOSSA_X86_SIMD

namespace {

// Head (b, ·)'s softmax(q·kᵀ + bias) into `out` [T, S] (float32), keys in pair layout `kt` (the
// entries its causal blocks skip are 0). The forward and the backward (which recomputes them
// rather than keep [B, N, T, S] float32 probabilities between the two) get the same bits.
void HeadProbabilities(const Head& hq, const uint32_t* kt, const at::Tensor& bias,
                       const Blocks& blocks, int64_t b, int64_t causal_block, int64_t T,
                       int64_t S, int64_t P, float* out) {
  for (int64_t t0 = 0; t0 < T; t0 += blocks.blk) {
    const int64_t t1 = std::min(T, t0 + blocks.blk), s0 = blocks.First(b, t0),
                  e = blocks.End(t1);
    Dot<false>(hq.data + t0 * hq.row, 2 * hq.row, 4, kt + s0, S, t1 - t0, e - s0, P, false,
               out + t0 * S + s0, S);
  }
  at::Tensor rows = at::from_blob(out, {1, 1, T, S}, at::kFloat);
  SoftmaxWithBiasInPlace(rows, BiasOfRow(bias, b), causal_block, blocks.RowStarts(b));
}

}  // namespace

Bf16DotAttention Bf16DotAttentionForward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& bias,
                                         int64_t causal_block,
                                         const std::vector<int64_t>& block_starts) {
  TORCH_CHECK(Bf16DotAttentionApplies(q), "Bf16DotAttentionForward: needs AVX-512 BF16 and an even head size");
  const int64_t B = q.size(0), T = q.size(1), N = q.size(2), H = q.size(3), S = k.size(1);
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->dim() == 4 && t->stride(3) == 1 &&
                    t->size(0) == B && t->size(2) == N && t->size(3) == H,
                "Bf16DotAttentionForward: bf16 [B, T or S, N, H] heads with contiguous rows");
  }
  TORCH_CHECK(v.size(1) == S, "Bf16DotAttentionForward: ", S, " keys against ", v.size(1), " values");
  const Blocks blocks(T, S, causal_block, block_starts);
  Bf16DotAttention r;
  r.probs_bf16 = at::empty({B, N, T, S}, q.options());
  r.out = at::empty({B, T, N, H}, q.options());
  uint16_t* out = reinterpret_cast<uint16_t*>(r.out.data_ptr());
  const int64_t P = H / 2, Sp = (S + 1) / 2;
  KernelParallelFor(0, B * N, ParallelGrain(4 * T * S * H), [&](int64_t lo, int64_t hi) {
    std::vector<uint32_t> kt(P * S), vr(Sp * H);
    std::vector<float> probs(T * S);  // the head's float32 probabilities, in cache
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b = i / N, n = i % N;
      const Head hq(q, b, n), hk(k, b, n), hv(v, b, n);
      PairsAcrossRows(hk.data, hk.row, S, H, kt.data());  // kt[p][s]: key s's pair p
      PairsOfRows(hv.data, hv.row, S, H, vr.data());      // vr[p][h]: keys 2p and 2p + 1
      HeadProbabilities(hq, kt.data(), bias, blocks, b, causal_block, T, S, P, probs.data());
      const float* logits = probs.data();
      uint16_t* pb = reinterpret_cast<uint16_t*>(r.probs_bf16.data_ptr()) + i * T * S;
      RoundRows(logits, T, S, pb);
      for (int64_t t0 = 0; t0 < T; t0 += blocks.blk) {
        const int64_t t1 = std::min(T, t0 + blocks.blk);
        const PairRange pr(blocks.First(b, t0), blocks.End(t1));
        Dot<true>(pb + t0 * S + 2 * pr.first, 2 * S, 4, vr.data() + pr.first * H, H, t1 - t0, H,
                  pr.count, pr.half_last, out + (b * T + t0) * N * H + n * H, N * H);
      }
    }
  });
  return r;
}

// long function: one head's backward is one sequence of products sharing its packed operands.
Bf16DotAttentionGrads Bf16DotAttentionBackward(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& bias,
                                               const at::Tensor& dout_in,
                                               const at::Tensor& dprobs_in,
                                               int64_t forward_causal_block,
                                               const std::vector<int64_t>& forward_starts) {
  TORCH_CHECK(Bf16DotAttentionApplies(q), "Bf16DotAttentionBackward: needs AVX-512 BF16 and an even head size");
  const int64_t B = q.size(0), T = q.size(1), N = q.size(2), H = q.size(3), S = k.size(1);
  // The probabilities are made again over the forward's blocks; dL/dP covers whole rows when the
  // probabilities have a gradient of their own (it may be nonzero where they are 0).
  const Blocks forward_blocks(T, S, forward_causal_block, forward_starts);
  const int64_t causal_block = dprobs_in.defined() ? 0 : forward_causal_block;
  const std::vector<int64_t> no_starts;
  const std::vector<int64_t>& block_starts = causal_block > 0 ? forward_starts : no_starts;
  const at::Tensor dout = dout_in.to(at::kBFloat16).contiguous();
  TORCH_CHECK(dout.sizes() == q.sizes(), "Bf16DotAttentionBackward: dout ", dout.sizes(), " for q ",
              q.sizes());
  const at::Tensor dprobs =
      dprobs_in.defined() ? dprobs_in.to(at::kFloat).contiguous() : at::Tensor();
  const Blocks blocks(T, S, causal_block, block_starts);
  Bf16DotAttentionGrads g;
  g.dq = at::empty({B, T, N, H}, q.options());
  g.dk = at::empty({B, S, N, H}, q.options());
  g.dv = at::empty({B, S, N, H}, q.options());
  uint16_t* dq = reinterpret_cast<uint16_t*>(g.dq.data_ptr());
  uint16_t* dk = reinterpret_cast<uint16_t*>(g.dk.data_ptr());
  uint16_t* dv = reinterpret_cast<uint16_t*>(g.dv.data_ptr());
  const uint16_t* go = reinterpret_cast<const uint16_t*>(dout.data_ptr());
  const int64_t P = H / 2, Tp = (T + 1) / 2, Sp = (S + 1) / 2;
  const int64_t kblk = causal_block > 0 ? causal_block : S;
  KernelParallelFor(0, B * N, ParallelGrain(8 * T * S * H), [&](int64_t lo, int64_t hi) {
    std::vector<uint32_t> vt(P * S), kt(P * S), kr(Sp * H), qr(Tp * H), gr(Tp * H), xds(Tp * S),
        xp(Tp * S);
    std::vector<float> dp(T * S), probs(T * S);
    std::vector<uint16_t> dsb(T * S);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b = i / N, n = i % N;
      const Head hq(q, b, n), hk(k, b, n), hv(v, b, n);
      const uint16_t* g_bn = go + b * T * N * H + n * H;
      PairsAcrossRows(hv.data, hv.row, S, H, vt.data());  // vt[p][s]: value s's pair p
      PairsOfRows(hk.data, hk.row, S, H, kr.data());      // kr[p][h]: keys 2p and 2p + 1
      PairsOfRows(hq.data, hq.row, T, H, qr.data());      // qr[p][h]: queries 2p and 2p + 1
      PairsOfRows(g_bn, N * H, T, H, gr.data());
      PairsAcrossRows(hk.data, hk.row, S, H, kt.data());  // kt[p][s]: key s's pair p
      HeadProbabilities(hq, kt.data(), bias, forward_blocks, b, forward_causal_block, T, S, P,
                        probs.data());
      // dL/dP over each block's keys; 0 elsewhere (the softmax backward leaves a row's keys after
      // its block unwritten, and the key gradients read whole columns).
      std::fill(dp.begin(), dp.end(), 0.0f);
      for (int64_t t0 = 0; t0 < T; t0 += blocks.blk) {
        const int64_t t1 = std::min(T, t0 + blocks.blk), s0 = blocks.First(b, t0),
                      e = blocks.End(t1);
        Dot<false>(g_bn + t0 * N * H, 2 * N * H, 4, vt.data() + s0, S, t1 - t0, e - s0, P, false,
                   dp.data() + t0 * S + s0, S);
      }
      if (dprobs.defined()) {
        const float* d = dprobs.data_ptr<float>() + i * T * S;
        for (int64_t j = 0; j < T * S; ++j) dp[j] += d[j];
      }
      at::Tensor ds = at::from_blob(dp.data(), {1, 1, T, S}, at::kFloat);
      SoftmaxBackwardInPlace(ds, at::from_blob(probs.data(), {1, 1, T, S}, at::kFloat),
                             causal_block, blocks.RowStarts(b));
      RoundRows(dp.data(), T, S, dsb.data());
      PairsOfRows(dp.data(), S, T, S, xds.data());  // xds[p][s]: queries 2p and 2p + 1
      PairsOfRows(probs.data(), S, T, S, xp.data());
      // dq = dS·k over each block's keys.
      for (int64_t t0 = 0; t0 < T; t0 += blocks.blk) {
        const int64_t t1 = std::min(T, t0 + blocks.blk);
        const PairRange pr(blocks.First(b, t0), blocks.End(t1));
        Dot<true>(dsb.data() + t0 * S + 2 * pr.first, 2 * S, 4, kr.data() + pr.first * H, H,
                  t1 - t0, H, pr.count, pr.half_last, dq + (b * T + t0) * N * H + n * H, N * H);
      }
      // dk = dSᵀ·q and dv = Pᵀ·dO per block of keys, over the queries that may see them (causal:
      // from the block's first query on; the entries before are 0).
      for (int64_t s0 = 0; s0 < S; s0 += kblk) {
        const int64_t s1 = std::min(S, s0 + kblk), from = causal_block > 0 ? s0 : 0;
        const int64_t pf = from / 2;  // `from` is even: a multiple of the causal block, or 0
        Dot<true>(xds.data() + pf * S + s0, 4, 4 * S, qr.data() + pf * H, H, s1 - s0, H, Tp - pf,
                  false, dk + (b * S + s0) * N * H + n * H, N * H);
        Dot<true>(xp.data() + pf * S + s0, 4, 4 * S, gr.data() + pf * H, H, s1 - s0, H, Tp - pf,
                  false, dv + (b * S + s0) * N * H + n * H, N * H);
      }
    }
  });
  return g;
}

#else  // no x86 SIMD in this build: Bf16DotAttentionApplies is false and these are never called

Bf16DotAttention Bf16DotAttentionForward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, int64_t, const std::vector<int64_t>&) {
  NoSimdInThisBuild();
}
Bf16DotAttentionGrads Bf16DotAttentionBackward(const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&, int64_t,
                                               const std::vector<int64_t>&) {
  NoSimdInThisBuild();
}

#endif  // GLOSSA_X86_SIMD

}  // namespace glossa
