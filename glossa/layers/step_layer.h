// Incremental decoding, one interface (Lingvo's ExtendStep with prefix states): the layers that
// decode a step at a time — MultiHeadedAttention, TransformerAttentionLayer, TransformerLayer and
// TransformerStack — implement it, and the tasks drive it through it (the LM's sampling and
// scoring for fusion, the MT and ASR decoders' beam search).
//
//   const StepLayer& dec = *stack;
//   NestedMap states = dec.InitStates(batch, dtype);
//   NestedMap context = dec.PrecomputeContext(theta, source, source_paddings);  // once
//   for (int64_t t = 0; t < steps; ++t) {
//     auto [y, next] = dec.ExtendStep(theta, x_t, states, context);  // x_t [B, D] -> y [B, D]
//     states = std::move(next);
//   }
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

#include "glossa/core/nested_map.h"

namespace glossa {

class StepLayer {
 public:
  virtual ~StepLayer() = default;
  // The states before the first step (empty caches) for `batch_size` sequences.
  virtual NestedMap InitStates(int64_t batch_size, at::ScalarType dtype) const = 0;
  // What every step reads and none changes, computed once per source: {aux: the cross-attention
  // source as the layer projects it, aux_paddings [B, S]}. Layers without cross-attention keep
  // only the paddings.
  virtual NestedMap PrecomputeContext(const NestedMap& theta, const at::Tensor& source,
                                      const at::Tensor& source_paddings) const;
  // One step: inputs [B, D] -> (outputs [B, D], the states after it). `context` is
  // PrecomputeContext's result (or {} without a source; MultiHeadedAttention also reads
  // `paddings` [B, S+1] from it: the cached steps' and this one's).
  virtual std::pair<at::Tensor, NestedMap> ExtendStep(const NestedMap& theta,
                                                      const at::Tensor& inputs,
                                                      const NestedMap& states,
                                                      const NestedMap& context) const = 0;
};

inline NestedMap StepLayer::PrecomputeContext(const NestedMap&, const at::Tensor&,
                                              const at::Tensor& source_paddings) const {
  NestedMap context;
  if (source_paddings.defined()) context.Put("aux_paddings", source_paddings);
  return context;
}

}  // namespace glossa
