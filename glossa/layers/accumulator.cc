// Lingvo's Accumulator (glossa/layers/accumulator.h).
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/accumulator.h"

namespace glossa {

at::Tensor Accumulator::GetValue() const {
  if (IsDisabled() || !value_.defined()) return DefaultValue();
  return value_;
}
void Accumulator::SetValue(at::Tensor value) {
  if (!IsDisabled()) value_ = std::move(value);
}
void Accumulator::Reset() {
  if (!IsDisabled()) value_ = at::Tensor();
}
void Accumulator::Enable() {
  if (disable_count_ <= 0) throw FailedPreconditionError("unbalanced Accumulator Enable/Disable");
  --disable_count_;
}

}  // namespace glossa
