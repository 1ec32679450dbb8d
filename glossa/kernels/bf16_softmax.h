// softmax(logits + bias) over the last dimension for bf16 attention logits, in one pass each way
// (what bf16 attention on ATen's oneDNN GEMMs runs between its two products; kernels/
// attention_core.h). ATen 1.13's bias add before its bf16 CPU softmax took 6 ms per
// [8, 8, 256, 256] call on a Zen 4 (35 ms of the 512-wide LM's bf16 step; bench/README.md), and
// its softmax 8; here each row is widened once, the bias added, the softmax taken in float32
// and rounded to bf16 once, as ATen's (which also computes in float32) rounds it. The backward,
// dx = y ∘ (dy − Σ dy∘y), likewise in float32 per row, rounded once.
//
//   if (Bf16SoftmaxApplies(logits, bias)) probs = Bf16SoftmaxWithBias(logits, bias);
#pragma once

#include <ATen/core/Tensor.h>

namespace glossa {

// logits bf16 [B, N, T, S] on the CPU (any strides), bias empty or [B or 1, 1, T or 1, S] in bf16
// or float32 without a gradient of its own, on a CPU with AVX-512 BW/VL, kernels not forced to
// the reference (GLOSSA_KERNELS=reference).
bool Bf16SoftmaxApplies(const at::Tensor& logits, const at::Tensor& bias);
// Differentiable in logits; probs in bf16, [B, N, T, S].
at::Tensor Bf16SoftmaxWithBias(const at::Tensor& logits, const at::Tensor& bias);

}  // namespace glossa
