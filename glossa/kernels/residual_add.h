// A residual connection's sum x + y on the kernel threads (glossa/kernels/parallel.h), with its
// gradient (both inputs get the output's gradient).
//
//   at::Tensor out = ResidualAdd(x, y);  // x and y of one shape and dtype
//
// In the float32 training layout (glossa/runtime/cpu_runtime.h) ATen has one thread and BLAS the
// cores, so ATen's add ran a Transformer's residual sums on one core between the GEMMs. Float32
// contiguous CPU operands of one shape with at least kResidualAddMinNumel elements are summed in
// chunks on the kernel threads: the same bits as ATen's add (one float addition per element).
// Anything else, GLOSSA_KERNELS=reference and non-CPU tensors take ATen's x + y.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace glossa {

// Below this, one op's dispatch costs more than a second thread saves.
constexpr int64_t kResidualAddMinNumel = int64_t{1} << 16;

at::Tensor ResidualAdd(const at::Tensor& x, const at::Tensor& y);

}  // namespace glossa
