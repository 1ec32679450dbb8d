// One fused decoder step: a pre-layer-norm Transformer layer (causal self-attention over k/v
// caches, optional cross-attention to a source projected once, the feed-forward block) for every
// hypothesis of a decoding batch in one call, on float32 buffers, with no tensor allocated and no
// ATen op dispatched: what incremental decoding (beam search, sampling, generate) runs per layer
// and step once it is in inference (TransformerLayer::ExtendStepProjected takes it;
// FusedStepBuilder in glossa/layers/fused_step.cc fills these arguments from the layers' typed
// children and theta).
//
// A step of 4 hypotheses is a chain of ~40 small dependent ops per layer; as separate ATen calls
// its time went to dispatch, allocation and copies (a transposed output-projection weight made
// contiguous on every call), not to arithmetic (bench/README.md). Here each piece is a loop over
// rows on scratch that lives across steps:
//
//   x += post(StepAttention(scale · q(LN1 x), caches ← k(LN1 x), v(LN1 x)))     self-attention
//   x += post(attend(scale · q(LN2 x), source keys/values, source bias))        cross-attention
//   x += w · fc1(relu(fc0(LN3 x)))                                               feed-forward
//
// The projections take the batch-invariant row kernels (glossa/kernels/batch_invariant.h) where
// the model's inference plan is batch-invariant (glossa/kernels/compute_plan.h) and where Affine
// would (RowKernelsFor: on short inputs where they measured faster than BLAS), BLAS sgemm
// otherwise, and under an int8 plan Int8AffineRaw on the weights it prepared; attention is
// StepAttentionRaw; layer norm is two passes per row in float32 (mean, then the biased variance of
// the centred values). Every row is computed on its own, so under a batch-invariant plan (the row
// kernels always) a hypothesis's bits do not depend on the batch beside it. The ATen reference
// is the unfused composition of the layers' own ExtendStep (what GLOSSA_KERNELS=reference, training
// and every configuration these arguments cannot express run); the bits differ from it in the
// summation orders only (tests/kernels/decoder_step_test.cc).
//
//   DecoderLayerStepArgs a;  // filled by FusedStepBuilder from a TransformerLayer's children
//   DecoderLayerStep(a, x);  // x [rows, model_dim], updated in place
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace glossa {

// (x − mean) · rsqrt(var + epsilon) · (scale + scale_offset) + bias over each row (LayerNorm's
// scale is applied as 1 + scale unless direct_scale).
struct StepNormArgs {
  const float* scale = nullptr;
  const float* bias = nullptr;
  float scale_offset = 0.0f;
  float epsilon = 1e-6f;
};

struct Int8Weight;   // glossa/kernels/int8_gemm.h
class ComputePlan;   // glossa/kernels/compute_plan.h

// y = x·w (+ b): w [in, out] row-major, or with `transposed` w [out, in] and y = x·wᵀ. With w8
// (an int8 plan: the quantized form of that weight, prepared at load), Int8AffineRaw instead;
// with row_kernels (a batch-invariant plan), the row kernels always. With panels (a float32 plan:
// the weight as [in, out] packed at load, PackPanels in glossa/kernels/packed_affine.h, also for
// a transposed w), PackedAffineRaw where the row kernels would run or PackedKernelsFor measured it
// faster than BLAS. With panels_bf16 (a bf16 plan: the weight rounded to bf16 and packed by
// PackPanelsBf16), PackedAffineBf16Raw always.
struct StepProjArgs {
  const float* w = nullptr;
  const float* b = nullptr;
  int64_t in = 0, out = 0;
  bool transposed = false;
  const Int8Weight* w8 = nullptr;
  bool row_kernels = false;
  const float* panels = nullptr;
  const uint16_t* panels_bf16 = nullptr;
};

struct StepSelfAttentionArgs {
  StepNormArgs ln;
  StepProjArgs query, key, value, post;  // query/key/value: D -> heads·dim; post: heads·dim -> D
  const float* query_scale = nullptr;    // [dim], multiplies every head's query
  int64_t heads = 0, dim = 0;
  // Caches [slots, capacity, heads, dim]: row i's key and value go to slot i, column `step`.
  float* key_cache = nullptr;
  float* value_cache = nullptr;
  int64_t slots = 0, capacity = 0;
  // Row i attends to its steps s <= step in slot rows[i * rows_stride + s] (rows[i][step] = i).
  const int64_t* rows = nullptr;
  int64_t rows_stride = 0;
  int64_t step = 0;
  // [rows, step + 1] additive (the lowest float: a masked step, e.g. one before the row joined a
  // running batch), or null.
  const float* bias = nullptr;
};

struct StepCrossAttentionArgs {
  StepNormArgs ln;
  StepProjArgs query, post;
  const float* query_scale = nullptr;
  int64_t heads = 0, dim = 0;
  // One copy per source: row i reads source i % sources (a sentence's beams share its keys and
  // values, CTranslate2's layout); sources == rows: a copy per row.
  const float* key = nullptr;    // [sources, source_length, heads, dim]
  const float* value = nullptr;  // like key
  const float* bias = nullptr;   // [sources, source_length] additive (the lowest float: padded)
  int64_t sources = 0, source_length = 0;
};

struct StepFeedForwardArgs {
  StepNormArgs ln;
  StepProjArgs fc0, fc1;
  bool relu = true;               // on fc0's output
  float residual_weight = 1.0f;   // x + residual_weight · fc1(...)
};

struct DecoderLayerStepArgs {
  int64_t rows = 0, model_dim = 0;
  StepSelfAttentionArgs self;
  bool has_cross = false;
  StepCrossAttentionArgs cross;
  StepFeedForwardArgs ff;
};

// What the arguments point into, held by the caller for the step (int8 weights live in the plan),
// and, when a layer cannot fill its part, why (the first reason met: "layer '...': ...").
struct FusedStepKeep {
  std::vector<at::Tensor> tensors;
  std::string declined;
};

// t's data when the fused step can read it in place (a float32 contiguous CPU tensor), else null.
const float* FusedStepData(const at::Tensor& t);

// Whether decoding steps take DecoderLayerStep now: without autograd, not with
// GLOSSA_KERNELS=reference, and unless the model's plan (null: none) turns it off
// (ComputePolicy::fused_decoder_step: tests and bench_beam_search --fused=0 compare the two).
bool FusedDecoderStepApplies(const ComputePlan* plan);
// Why not, when it does not apply ("" when it does).
std::string FusedDecoderStepDeclined(const ComputePlan* plan);
// How many DecoderLayerStep calls this thread has made (tests check which path ran).
int64_t FusedDecoderLayerSteps();

// Checks the shapes agree (InvalidArgument naming the part otherwise), then runs the step.
void DecoderLayerStep(const DecoderLayerStepArgs& a, float* x);

}  // namespace glossa
