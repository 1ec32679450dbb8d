// The attention core: softmax(q·kᵀ + bias)·v over heads, and its gradient (MultiHeadedAttention
// in glossa/layers/attention.h projects, scales and masks around it).
//
//   // q [B, T, N, H], k and v [B, S, N, H] (any strides with contiguous rows), bias
//   // [B or 1, 1, T or 1, S] or empty: the additive mask.
//   auto [out, probs] = AttentionCore(q, k, v, bias, /*causal_blocks=*/false);
//   // out [B, T, N, H], probs [B, N, T, S]
//
// The native core (float32 heads, or bf16 ones where the measured choice "bf16_attention" says
// native; CPU tensors; BLAS sgemm linked) runs one single-threaded sgemm per batch row and head
// on the kernel threads, reading each head in place through its strides, and writes the output
// as [B, T, N, H] directly; its softmax is one AVX-512 pass per row where the CPU has it. bf16
// heads of even size on a CPU with AVX-512 BF16 run its dot-product kernels instead
// (kernels/bf16_dot_attention.h); others are widened to float32 for the sgemms. Its bias must be
// float32. With causal_blocks (T = S ≥ 64, causal), query block j's products cover keys
// [0, (j + 1)·c) only, and under a per-query bias [B, 1, T, S] (packed rows' segment masks) from
// the first key any query of the block may see: a packed row's blocks skip the segments before
// their own. Everything else, GLOSSA_KERNELS=reference, and non-CPU tensors take the
// reference: ATen's einsum, + bias, softmax, einsum (the bias in q's dtype).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace glossa {

// Whether AttentionCore runs its native core for these operands (then its bias is float32).
bool AttentionCoreNativeApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// With batch_invariant (a batch-invariant inference plan, glossa/kernels/compute_plan.h; not with
// GLOSSA_KERNELS=reference) and float32 CPU operands, InvariantAttention
// (glossa/kernels/batch_invariant.h): a row's bits do not depend on the batch or padded length.
// With query_scale (float32 [H], may require its gradient), the core of q ∘ query_scale, k and
// v: the float32 native core scales each head's queries as it reads them (no [B, T, N, H]
// product in memory, nor its backward node), with the bits of q * query_scale; elsewhere it is
// multiplied first.
std::pair<at::Tensor, at::Tensor> AttentionCore(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& bias,
                                                bool causal_blocks, bool batch_invariant = false,
                                                const at::Tensor& query_scale = {});
// Self-attention on the fused Q/K/V projection qkv [B, T, 3, N, H] (q, k and v its slices along
// dim 2): as AttentionCore on those slices, except that the float32 native core returns the
// gradient of qkv itself, written in place, where autograd would otherwise stack the three
// gradients into it after the core (UnbindBackward). InvalidArgument for another shape.
std::pair<at::Tensor, at::Tensor> AttentionCoreQkv(const at::Tensor& qkv, const at::Tensor& bias,
                                                   bool causal_blocks, bool batch_invariant = false,
                                                   const at::Tensor& query_scale = {});
std::pair<at::Tensor, at::Tensor> AttentionCoreReference(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v,
                                                         const at::Tensor& bias);

// The native core's softmax, in place on float32 contiguous CPU tensors, on a CPU with AVX-512F
// (else an error): x [B, N, T, S] becomes softmax(x + bias) over S, bias [B or 1, 1, T or 1, S]
// (or empty) added as each row is read; and the softmax backward dy ← y ∘ (dy − Σ dy∘y) over the
// last dimension. With causal_block c > 0 (causal attention computed in blocks of c queries),
// row t covers only its block's keys [0, (t / c + 1)·c): the softmax sets the rest of the row to
// 0 without reading it (the bias masks those keys anyway), and the backward neither reads nor
// writes it.
// With block_starts ([B, blocks] row-major: the first key each block computes), row t covers
// [block_starts[b][t / c], end of its block), and [0, start) is 0 in both (the bias masks those
// keys for every query of the block).
void SoftmaxWithBiasInPlace(at::Tensor& x, const at::Tensor& bias, int64_t causal_block = 0,
                            const std::vector<int64_t>& block_starts = {});
void SoftmaxBackwardInPlace(at::Tensor& dy, const at::Tensor& y, int64_t causal_block = 0,
                            const std::vector<int64_t>& block_starts = {});

// The same on rows [lo, hi) of [B, N, T, S] `sizes` (rows numbered over B·N·T), for the native
// core's head at a time (attention_softmax.cc): x holds every row; dy holds rows from
// dy_first_row on (a head's rows in a buffer of their own), y every row.
void SoftmaxWithBiasOnRows(float* x, at::IntArrayRef sizes, const at::Tensor& bias,
                           int64_t causal_block, const std::vector<int64_t>& block_starts,
                           int64_t lo, int64_t hi);
void SoftmaxBackwardOnRows(float* dy, int64_t dy_first_row, const float* y, at::IntArrayRef sizes,
                           int64_t causal_block, const std::vector<int64_t>& block_starts,
                           int64_t lo, int64_t hi);

}  // namespace glossa
