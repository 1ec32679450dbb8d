// The attention core on bf16 heads with AVX-512 BF16 dot products (vdpbf16ps: 32 bf16 products
// summed in pairs into 16 float32 lanes per instruction), forward and backward, per batch row and
// head on the kernel threads. It is the native core's bf16 path (glossa/kernels/attention_core.h)
// on CPUs that have the instruction; elsewhere that path widens the heads to float32 and runs
// sgemms. Which of the native path and ATen's (oneDNN's bf16 GEMMs) runs stays a measured choice
// (kernel_choice.h, "bf16_attention").
//
//   if (Bf16DotAttentionApplies(q)) {
//     Bf16DotAttention a = Bf16DotAttentionForward(q, k, v, bias, causal_block, block_starts);
//     Bf16DotAttentionGrads g = Bf16DotAttentionBackward(q, k, v, bias, dout, {}, ...);
//   }
//
// Its arithmetic: the logits q·kᵀ and dL/dP = dO·vᵀ are sums of exact bf16 products in float32
// (as in the widened path); the softmax and its backward are the native core's float32 kernels;
// the probabilities and dL/dlogits are rounded to bf16 before their products with v, k and q (as
// ATen's bf16 path rounds them), and the outputs and gradients are rounded to bf16 once. Within a
// dot-product instruction a pair's two products are added in a fixed order with the CPU's
// float32 rounding, and subnormal bf16 inputs count as 0.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace glossa {

// Whether the dot-product core runs bf16 heads q [B, T, N, H]: the CPU has AVX-512 BF16 (false
// under GLOSSA_KERNELS=reference) and H is even (the products run over pairs of the head).
bool Bf16DotAttentionApplies(const at::Tensor& q);

struct Bf16DotAttention {
  at::Tensor out;         // bf16 [B, T, N, H]
  at::Tensor probs_bf16;  // bf16 [B, N, T, S]: the rounded probabilities the output was made of
};

// q [B, T, N, H], k and v [B, S, N, H]: bf16 CPU tensors whose rows (the last dimension) are
// contiguous, any other strides (views of a fused Q/K/V projection). bias: float32 [B or 1, 1,
// T or 1, S], or empty. causal_block and block_starts as the native core's softmax takes them
// (attention_core.h): query block j's products cover keys [its first key, (j + 1)·c) only.
Bf16DotAttention Bf16DotAttentionForward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& bias,
                                         int64_t causal_block,
                                         const std::vector<int64_t>& block_starts);

struct Bf16DotAttentionGrads {
  at::Tensor dq, dk, dv;  // bf16, shaped as q, k and v (contiguous)
};

// The gradients for dout (bf16 [B, T, N, H]) and dprobs (float32 [B, N, T, S], the
// probabilities' own gradient, or undefined), for the forward's q, k, v, bias and blocks. Each
// head's float32 probabilities are made again, with the forward's bits, where they are used
// (kept from the forward, they were [B, N, T, S] float32 written and read back through memory:
// 16 MB a layer of the 512-wide LM). With dprobs, causal_block must be 0 (that gradient may be
// nonzero where the probabilities are 0); causal_block and block_starts are the forward's.
Bf16DotAttentionGrads Bf16DotAttentionBackward(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& bias,
                                               const at::Tensor& dout, const at::Tensor& dprobs,
                                               int64_t causal_block,
                                               const std::vector<int64_t>& block_starts);

}  // namespace glossa
