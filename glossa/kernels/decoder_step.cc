#include "glossa/kernels/decoder_step.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include <ATen/core/grad_mode.h>

#include "glossa/kernels/compute_plan.h"
#include "glossa/kernels/batch_invariant.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/int8_gemm.h"
#include "glossa/kernels/packed_affine.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/step_attention.h"

namespace glossa {
namespace {

// per-thread (not carried): the count of fused layer steps this thread ran.
thread_local int64_t fused_layer_steps = 0;

// Scratch of the step, kept per thread across steps (a decoding loop runs on one thread).
struct Scratch {
  std::vector<float> h, q, k, v, ctx, out, hidden;
  static float* Sized(std::vector<float>& buf, int64_t n) {
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
    return buf.data();
  }
};

void LayerNormRows(const float* x, int64_t rows, int64_t d, const StepNormArgs& ln, float* y) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * d;
    float* yi = y + i * d;
    float sum = 0.0f;
    for (int64_t j = 0; j < d; ++j) sum += xi[j];
    const float mean = sum / static_cast<float>(d);
    float sq = 0.0f;
    for (int64_t j = 0; j < d; ++j) sq = std::fma(xi[j] - mean, xi[j] - mean, sq);
    const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(d) + ln.epsilon);
    for (int64_t j = 0; j < d; ++j) {
      yi[j] = (xi[j] - mean) * rstd * (ln.scale[j] + ln.scale_offset) + ln.bias[j];
    }
  }
}

// y [rows, p.out] = x [rows, p.in] · w (+ b), relu optional: the row kernels where the plan asks
// for them (p.row_kernels: batch-invariant) or Affine would take them (RowKernelsFor: short inputs
// where they measured faster), else one BLAS sgemm and the bias (and relu) in a pass.
void Project(const float* x, int64_t rows, const StepProjArgs& p, bool relu, float* y) {
  if (p.w8 != nullptr) {
    Int8AffineRaw(x, rows, *p.w8, p.b, relu, y);
    return;
  }
  // A bf16 plan's weights: what the plan computes with at any row count.
  if (p.panels_bf16 != nullptr && !KernelsForcedToReference()) {
    PackedAffineBf16Raw(x, p.panels_bf16, p.b, y, rows, p.in, p.out, relu);
    return;
  }
  // The plan's packed panels: the same bits as InvariantAffineRaw on the [in, out] matrix.
  if (p.panels != nullptr && !KernelsForcedToReference() &&
      (p.row_kernels || PackedKernelsFor(rows, p.in, p.out))) {
    PackedAffineRaw(x, p.panels, p.b, y, rows, p.in, p.out, relu);
    return;
  }
  // GLOSSA_KERNELS=reference: the portable row kernel (a step's rows stay independent).
  if (!HasSgemm() || KernelsForcedToReference() || p.row_kernels ||
      RowKernelsFor(rows, p.in, p.out, p.transposed)) {
    if (p.transposed) {
      InvariantAffineTransposedRaw(x, p.w, p.b, y, rows, p.in, p.out, relu);
    } else {
      InvariantAffineRaw(x, p.w, p.b, y, rows, p.in, p.out, relu);
    }
    return;
  }
  RowMajorSgemm(false, p.transposed, rows, p.out, p.in, x, p.in, p.w,
                p.transposed ? p.in : p.out, 0.0f, y, p.out);
  if (p.b == nullptr && !relu) return;
  for (int64_t i = 0; i < rows; ++i) {
    float* yi = y + i * p.out;
    for (int64_t j = 0; j < p.out; ++j) {
      const float v = p.b != nullptr ? yi[j] + p.b[j] : yi[j];
      yi[j] = relu ? (v > 0.0f ? v : 0.0f) : v;
    }
  }
}

void ScaleQueries(float* q, int64_t rows_heads, int64_t dim, const float* scale) {
  for (int64_t r = 0; r < rows_heads; ++r) {
    for (int64_t h = 0; h < dim; ++h) q[r * dim + h] *= scale[h];
  }
}

// x += y (times w when w != 1, as at::add(x, y, alpha) computes x + alpha·y).
void AddResidual(float* x, const float* y, int64_t n, float w) {
  if (w == 1.0f) {
    for (int64_t j = 0; j < n; ++j) x[j] += y[j];
  } else {
    for (int64_t j = 0; j < n; ++j) x[j] += w * y[j];
  }
}

void SelfAttention(const StepSelfAttentionArgs& a, int64_t rows, int64_t d, float* x, Scratch& s) {
  const int64_t nh = a.heads * a.dim;
  float* h = Scratch::Sized(s.h, rows * d);
  float* q = Scratch::Sized(s.q, rows * nh);
  float* k = Scratch::Sized(s.k, rows * nh);
  float* v = Scratch::Sized(s.v, rows * nh);
  float* ctx = Scratch::Sized(s.ctx, rows * nh);
  float* out = Scratch::Sized(s.out, rows * d);
  LayerNormRows(x, rows, d, a.ln, h);
  Project(h, rows, a.query, false, q);
  Project(h, rows, a.key, false, k);
  Project(h, rows, a.value, false, v);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t at = (i * a.capacity + a.step) * nh;
    std::memcpy(a.key_cache + at, k + i * nh, static_cast<size_t>(nh) * sizeof(float));
    std::memcpy(a.value_cache + at, v + i * nh, static_cast<size_t>(nh) * sizeof(float));
  }
  ScaleQueries(q, rows * a.heads, a.dim, a.query_scale);
  StepAttentionArgs sa;
  sa.q = q, sa.key = a.key_cache, sa.value = a.value_cache, sa.rows = a.rows, sa.bias = a.bias;
  sa.rows_stride = a.rows_stride, sa.n = rows, sa.heads = a.heads, sa.dim = a.dim;
  sa.capacity = a.capacity, sa.length = a.step + 1, sa.out = ctx;
  StepAttentionRaw(sa);
  Project(ctx, rows, a.post, false, out);
  AddResidual(x, out, rows * d, 1.0f);
}

void CrossAttention(const StepCrossAttentionArgs& a, int64_t rows, int64_t d, float* x,
                    Scratch& s) {
  const int64_t nh = a.heads * a.dim;
  float* h = Scratch::Sized(s.h, rows * d);
  float* q = Scratch::Sized(s.q, rows * nh);
  float* ctx = Scratch::Sized(s.ctx, rows * nh);
  float* out = Scratch::Sized(s.out, rows * d);
  LayerNormRows(x, rows, d, a.ln, h);
  Project(h, rows, a.query, false, q);
  ScaleQueries(q, rows * a.heads, a.dim, a.query_scale);
  StepAttentionArgs sa;
  sa.q = q, sa.key = a.key, sa.value = a.value, sa.bias = a.bias;
  sa.n = rows, sa.heads = a.heads, sa.dim = a.dim, sa.sources = a.sources;
  sa.capacity = a.source_length, sa.length = a.source_length, sa.out = ctx;
  StepAttentionRaw(sa);
  Project(ctx, rows, a.post, false, out);
  AddResidual(x, out, rows * d, 1.0f);
}

void FeedForward(const StepFeedForwardArgs& a, int64_t rows, int64_t d, float* x, Scratch& s) {
  float* h = Scratch::Sized(s.h, rows * d);
  float* hidden = Scratch::Sized(s.hidden, rows * a.fc0.out);
  float* out = Scratch::Sized(s.out, rows * d);
  LayerNormRows(x, rows, d, a.ln, h);
  Project(h, rows, a.fc0, a.relu, hidden);
  Project(hidden, rows, a.fc1, false, out);
  AddResidual(x, out, rows * d, a.residual_weight);
}

void CheckProj(const StepProjArgs& p, int64_t in, int64_t out, const char* what) {
  if (p.w == nullptr || p.in != in || p.out != out ||
      (p.w8 != nullptr && (p.w8->k != in || p.w8->n != out))) {
    throw InvalidArgumentError(StrCat("DecoderLayerStep: ", what, " must map ", in, " -> ", out,
                                      ", got ", p.in, " -> ", p.out,
                                      p.w == nullptr ? " (no weight)" : ""));
  }
}

void CheckNorm(const StepNormArgs& ln, const char* what) {
  if (ln.scale == nullptr || ln.bias == nullptr) {
    throw InvalidArgumentError(StrCat("DecoderLayerStep: ", what, " needs its scale and bias"));
  }
}

void Check(const DecoderLayerStepArgs& a) {
  const int64_t d = a.model_dim;
  const StepSelfAttentionArgs& s = a.self;
  const int64_t nh = s.heads * s.dim;
  CheckNorm(s.ln, "self-attention layer norm");
  CheckProj(s.query, d, nh, "self-attention query");
  CheckProj(s.key, d, nh, "self-attention key");
  CheckProj(s.value, d, nh, "self-attention value");
  CheckProj(s.post, nh, d, "self-attention post");
  if (s.step < 0 || s.step >= s.capacity || s.slots < a.rows || s.key_cache == nullptr ||
      s.value_cache == nullptr || s.rows == nullptr || s.rows_stride <= s.step ||
      s.query_scale == nullptr) {
    throw InvalidArgumentError(StrCat("DecoderLayerStep: step ", s.step, " needs caches of ",
                                      a.rows, " slots and capacity > step (got ", s.slots, ", ",
                                      s.capacity, "), a row table and a query scale"));
  }
  if (a.has_cross) {
    const StepCrossAttentionArgs& c = a.cross;
    CheckNorm(c.ln, "cross-attention layer norm");
    CheckProj(c.query, d, c.heads * c.dim, "cross-attention query");
    CheckProj(c.post, c.heads * c.dim, d, "cross-attention post");
    if (c.key == nullptr || c.value == nullptr || c.source_length <= 0 ||
        c.query_scale == nullptr) {
      throw InvalidArgumentError("DecoderLayerStep: cross-attention needs source keys and values "
                                 "of length > 0 and a query scale");
    }
    if (c.sources <= 0 || a.rows % c.sources != 0) {
      throw InvalidArgumentError(StrCat("DecoderLayerStep: ", a.rows,
                                        " rows do not read one of ", c.sources,
                                        " sources each (rows must be a multiple)"));
    }
  }
  CheckNorm(a.ff.ln, "feed-forward layer norm");
  CheckProj(a.ff.fc0, d, a.ff.fc0.out, "feed-forward fc0");
  CheckProj(a.ff.fc1, a.ff.fc0.out, d, "feed-forward fc1");
}

}  // namespace

const float* FusedStepData(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.scalar_type() != at::kFloat ||
      !t.is_contiguous()) {
    return nullptr;
  }
  return t.data_ptr<float>();
}

bool FusedDecoderStepApplies(const ComputePlan* plan) {
  return FusedDecoderStepDeclined(plan).empty();
}

std::string FusedDecoderStepDeclined(const ComputePlan* plan) {
  if (plan != nullptr && !plan->policy().fused_decoder_step) {
    return "the plan's policy turns the fused decoder step off";
  }
  if (at::GradMode::is_enabled()) return "autograd is on (the fused step has no backward)";
  if (KernelsForcedToReference()) return "GLOSSA_KERNELS=reference runs ATen's kernels";
  return "";
}

int64_t FusedDecoderLayerSteps() { return fused_layer_steps; }

void DecoderLayerStep(const DecoderLayerStepArgs& a, float* x) {
  Check(a);
  ++fused_layer_steps;
  if (a.rows == 0) return;
  thread_local Scratch scratch;  // per-thread cache: the step's buffers
  SelfAttention(a.self, a.rows, a.model_dim, x, scratch);
  if (a.has_cross) CrossAttention(a.cross, a.rows, a.model_dim, x, scratch);
  FeedForward(a.ff, a.rows, a.model_dim, x, scratch);
}

}  // namespace glossa
