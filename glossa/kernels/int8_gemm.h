// int8 projections for inference: weights quantized per output channel, activations per row at
// run time (dynamic quantization, as PyTorch's quantize_dynamic and CTranslate2's int8 do).
//
//   w8 = QuantizeInt8(w);                  // w [K, N] float: q[n][k] = round(w[k][n] / s_w[n]),
//                                          // s_w[n] = max_k |w[k][n]| / 127
//   y = Int8Affine(x, *w8, b, relu);       // x [M, K] float -> y [M, N] float
//
// Each row m of x is quantized on its own: s_x[m] = max_k |x[m][k]| / 127, q_x = round(x / s_x)
// (to nearest even; rows of zeros give q_x = 0). The products are summed exactly in int32, and
//   y[m][n] = relu?(fma(float(Σ_k q_x[m][k] q[n][k]), s_x[m] · s_w[n], b[n]))
// so a row's answer depends only on that row (batch-invariant) and on nothing of the thread count.
// The AVX-512 VNNI path (vpdpbusd: u8 × s8 in groups of 4, with q_x + 128 as u8 and 128·Σ_k q[n][k]
// taken back off) and the portable one give the same bits; GLOSSA_KERNELS=reference forces the
// portable one. The ATen reference of the arithmetic is Int8AffineAten (doubles; tests only).
//
// A model's inference plan with precision int8 (glossa/kernels/compute_plan.h) quantizes its
// projections' weights once when it loads and runs them here: the Predictor of a bundle exported
// with --quantize=int8 (or given --compute=int8) makes that plan.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace glossa {

struct Int8Weight {
  int64_t k = 0, n = 0;
  std::vector<int8_t> q;        // [n][k], row n = output channel n
  std::vector<float> scale;     // [n]
  std::vector<int32_t> sum;     // [n]: Σ_k q[n][k]
  // The VNNI layout: blocks of 16 channels, k in groups of 4: [n/16][k4/4][16][4], zero padded.
  int64_t k4 = 0, n16 = 0;
  std::vector<int8_t> packed;
};

// w [K, N] (any strides, float32 or double); channel n is column n.
std::shared_ptr<const Int8Weight> QuantizeInt8(const at::Tensor& w);

// x [M, K] float32 (any strides); b [N] float32 or undefined. No autograd.
at::Tensor Int8Affine(const at::Tensor& x, const Int8Weight& w, const at::Tensor& b,
                      bool relu = false);
// The portable path: the same bits as Int8Affine's native one.
at::Tensor Int8AffinePortable(const at::Tensor& x, const Int8Weight& w, const at::Tensor& b,
                              bool relu = false);
// The raw form for fused kernels (glossa/kernels/decoder_step.h): x [m, w.k] contiguous,
// b [w.n] or null, y [m, w.n]; the same bits as Int8Affine.
void Int8AffineRaw(const float* x, int64_t m, const Int8Weight& w, const float* b, bool relu,
                   float* y);
// ATen in double: the dequantized activations times the dequantized weights (tests).
at::Tensor Int8AffineAten(const at::Tensor& x, const Int8Weight& w, const at::Tensor& b,
                          bool relu = false);
// The per-row activation quantization (q_x [M, K] int8 as int32 values, s_x [M]), for tests.
std::pair<at::Tensor, at::Tensor> QuantizeRowsInt8(const at::Tensor& x);

// Whether Int8Affine has its VNNI path here (AVX-512 VNNI and not GLOSSA_KERNELS=reference).
bool Int8HasVnni();

}  // namespace glossa
