// The masks of MultiHeadedAttention (glossa/layers/attention.h): which keys a query may not see
// (padded keys, keys of another segment of a packed row, future keys of causal attention), and
// the additive bias that masks them. Every layer of a stack attends over the same inputs, so each
// function keeps its last result per thread, keyed by the tensors it came from.
//
//   at::Tensor mask = KeyMask(paddings, {}, {}, t, s, /*causal=*/true, q.device());
//   at::Tensor bias = MaskBias(mask, q.options());   // 0, or the dtype's lowest where masked
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace glossa {

// [B or 1, 1, T or 1, S] bool, true = masked: keys with paddings [B, S] > 0.5; with segment ids
// (query_segments [B, T], key_segments [B, S]), keys of another segment, and a query in segment 0
// (the padding) is not masked by the key paddings; with `causal`, keys s > t. Undefined when
// nothing is masked.
at::Tensor KeyMask(const at::Tensor& paddings, const at::Tensor& query_segments,
                   const at::Tensor& key_segments, int64_t t, int64_t s, bool causal,
                   at::Device device);

// The additive bias of a key mask in options' dtype and device: the dtype's lowest value where
// masked (its probability is exactly 0 after the softmax), else 0.
at::Tensor MaskBias(const at::Tensor& key_mask, const at::TensorOptions& options);

}  // namespace glossa
