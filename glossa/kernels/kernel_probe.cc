#include "glossa/kernels/kernel_probe.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "glossa/kernels/gemm.h"
#include "glossa/kernels/packed_affine.h"

namespace glossa {

void ProbeOperands::Make(int64_t rows_in, int64_t k_in, int64_t n_in, bool pack) {
  if (!x.empty()) return;
  rows = rows_in, k = k_in, n = n_in;
  copies = std::max<int64_t>(1, kProbeColdBytes / static_cast<int64_t>(sizeof(float) * k * n));
  auto fill = [](std::vector<float>& v, size_t size, float phase) {
    v.resize(size);
    for (size_t i = 0; i < size; ++i) v[i] = 0.05f * std::sin(0.37f * static_cast<float>(i) + phase);
  };
  fill(x, static_cast<size_t>(rows * k), 0.1f);
  fill(w, static_cast<size_t>(copies * k * n), 0.7f);
  fill(b, static_cast<size_t>(n), 0.3f);
  y.assign(static_cast<size_t>(rows * n), 0.0f);
  if (pack) {
    const int64_t size = (n + kPanelCols - 1) / kPanelCols * k * kPanelCols;
    panels.resize(static_cast<size_t>(copies * size));
    for (int64_t c = 0; c < copies; ++c) {
      const at::Tensor p = PackPanels(at::from_blob(w.data() + c * k * n, {k, n}, at::kFloat));
      std::copy(p.data_ptr<float>(), p.data_ptr<float>() + size, panels.data() + c * size);
    }
  }
}

void ProbeOperands::Blas(const float* wc, bool transposed) {
  RowMajorSgemm(false, transposed, rows, n, k, x.data(), k, wc, transposed ? k : n, 0.0f,
                y.data(), n);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += b[j];
  }
}

}  // namespace glossa
