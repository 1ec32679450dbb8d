// Softmax cross-entropy against class ids in one fused kernel: log-softmax, the label's
// log-prob, label smoothing, the max log-prob and the argmax in one pass over each row (forward),
// and the gradient softmax − targets in one pass (backward), without materializing the
// [..., C] log-probs. The ATen composition it replaces (log_softmax, gather, amax, their
// backwards) makes five passes over the logits and keeps a log-probs tensor as large as them.
//
//   if (FusedSoftmaxXentApplies(logits)) {
//     SoftmaxXent r = FusedSoftmaxXent(logits, labels, /*label_weight=*/1 - ls,
//                                      /*uniform_weight=*/ls / C, /*want_argmax=*/false);
//     at::Tensor loss = (r.xent * weights).sum();   // backward through r.xent
//   }
//
// Float32 or bf16 logits (bf16 read as they are, widened exactly, and their gradient given in
// bf16, rounded once from float32; other dtypes are cast to float32), vectorized with AVX-512
// (F, BW and VL): FusedSoftmaxXentApplies() is false on CPUs without it, and callers keep the
// ATen composition there. Results equal the ATen composition to float32 rounding (the
// exponential is a degree-6 polynomial, ~1 ulp).
#pragma once

#include <ATen/core/Tensor.h>

namespace glossa {

struct SoftmaxXent {
  // −(label_weight · log p_label + uniform_weight · Σ_c log p_c), shaped like labels; the only
  // output with a gradient (to logits).
  at::Tensor xent;
  at::Tensor label_log_prob;  // log p_label (no gradient)
  at::Tensor max_log_prob;    // max_c log p_c (no gradient)
  at::Tensor argmax;          // int64, the first maximal class; undefined unless asked for
};

// Whether this CPU runs the fused kernel (AVX-512 F, BW and VL; false with
// GLOSSA_KERNELS=reference), and
// whether it runs for these logits (also on the CPU): callers keep the ATen composition otherwise.
bool FusedSoftmaxXentSupported();
bool FusedSoftmaxXentApplies(const at::Tensor& logits);

// logits [..., C] (float32 or bf16, or cast to float32), labels [...] integers in [0, C) (else an error).
// With `bias` [C], the logits are logits + bias, added in the kernel's passes (the caller's GEMM
// then need not broadcast it into its output first), and the bias gets its gradient (the
// column sums of the logits' gradient) from the same backward pass.
SoftmaxXent FusedSoftmaxXent(const at::Tensor& logits, const at::Tensor& labels,
                             double label_weight, double uniform_weight, bool want_argmax,
                             const at::Tensor& bias = {});

}  // namespace glossa
