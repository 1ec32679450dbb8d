// The operands of a kernel choice's probe (glossa/kernels/kernel_choice.h) for the row kernels
// and the packed panels: internal to glossa/kernels/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace glossa {

// Operands for a probe of x [rows, k] times a [k, n] weight, made on the probe's first (untimed)
// call. A network pass reads each layer's weights once, after the other layers' have gone through
// the caches, so the probe does too: it rotates over copies of the weight that together exceed
// this core's L2 (kProbeColdBytes), rather than timing both paths on one hot copy, on which BLAS's
// per-call packing of the weight cost nothing it costs in a pass. (The first probes made their
// operands in every timed call: the sines took most of both paths' times and every shape tied.)
struct ProbeOperands {
  static constexpr int64_t kProbeColdBytes = int64_t{8} << 20;
  int64_t rows = 0, k = 0, n = 0, copies = 0, next = 0;
  std::vector<float> x, w, b, y, panels;

  void Make(int64_t rows_in, int64_t k_in, int64_t n_in, bool pack);
  // The copy the next call reads.
  int64_t Next() { return next++ % copies; }
  // Enough calls per timing that one is not timer noise.
  int64_t Reps() const { return std::max<int64_t>(1, (int64_t{1} << 22) / (rows * k * n)); }
  // BLAS's path: sgemm, then the bias in a pass.
  void Blas(const float* wc, bool transposed);
};

}  // namespace glossa
