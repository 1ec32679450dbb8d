// One decoding step of attention over preallocated k/v caches read through a row table: the
// attention core of incremental decoding (MultiHeadedAttention::ExtendStep), one query row per
// hypothesis and head, with no cache copied when a beam search reorders its hypotheses.
//
// The caches hold step s of every hypothesis slot at column s: key and value [slots, C, heads,
// dim], written in place as steps come (C, the capacity, grows by doubling). rows [N, ≥ L] (int64)
// says, for each hypothesis and step s < L, which slot's column s is its own: a beam search
// reorders the rows table (N × L integers), never the caches.
//
//   at::Tensor out = StepAttention(q, key, value, rows, L, bias);  // q [N, heads, dim] scaled
//
// out[i, n] = Σ_s softmax_s(q[i, n]·key[rows[i, s], s, n] + bias[i, s]) · value[rows[i, s], s, n]
// over s < L; bias [N, L] float (the additive mask: the lowest float for a masked step) or
// undefined. The native kernel (float32 CPU tensors, AVX-512) computes each (hypothesis, head)
// row on its own: a dot product per step, the softmax with the sum in step order, and the output
// as one fused multiply-add chain over the steps, so a hypothesis's bits do not depend on the
// others (glossa/kernels/batch_invariant.h). Otherwise, and with GLOSSA_KERNELS=reference, the
// reference gathers each hypothesis's keys and values and runs ATen's einsum, softmax, einsum.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace glossa {

at::Tensor StepAttention(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
                         const at::Tensor& rows, int64_t length, const at::Tensor& bias);
// The raw form, for fused kernels (glossa/kernels/decoder_step.h): every (hypothesis, head) row,
// split over the kernel threads. Hypothesis i's step s is slot rows[i * rows_stride + s], or, when
// rows is null, slot i % sources (a source of `capacity` = `length` positions read by every
// hypothesis i ≡ its index mod `sources`: one copy of a sentence's keys and values for all its
// beams; sources 0: slot i), whose row of `bias` it reads too.
struct StepAttentionArgs {
  const float* q = nullptr;      // [n, heads, dim], scaled
  const float* key = nullptr;    // [slots, capacity, heads, dim]
  const float* value = nullptr;  // like key
  const float* bias = nullptr;   // [n, length] or null
  const int64_t* rows = nullptr;
  int64_t rows_stride = 0;
  int64_t sources = 0;           // without rows: hypothesis i reads slot i % sources (0: i)
  int64_t n = 0, heads = 0, dim = 0, capacity = 0, length = 0;
  float* out = nullptr;          // [n, heads, dim]
};
// AVX-512 where the CPU has it, else a portable loop of the same order (std::exp for e^x).
void StepAttentionRaw(const StepAttentionArgs& a);

at::Tensor StepAttentionReference(const at::Tensor& q, const at::Tensor& key,
                                  const at::Tensor& value, const at::Tensor& rows, int64_t length,
                                  const at::Tensor& bias);

}  // namespace glossa
