// Lingvo's layer accumulators: values a layer gathers across FProp calls (BaseLayer registers,
// collects and resets them over its tree).
#pragma once

#include <ATen/core/Tensor.h>

namespace glossa {

// Lingvo's Accumulator: a value carried across calls (e.g. recurrent steps), reset per step.
// Disable()/Enable() nest: while disabled, GetValue returns the default and Set/Reset do nothing.
class Accumulator {
 public:
  virtual ~Accumulator() = default;
  // A fresh default value on every call.
  virtual at::Tensor DefaultValue() const = 0;
  at::Tensor GetValue() const;
  void SetValue(at::Tensor value);
  void Reset();
  void Disable() { ++disable_count_; }
  void Enable();  // FailedPrecondition when not disabled
  bool IsDisabled() const { return disable_count_ > 0; }

 private:
  at::Tensor value_;
  int disable_count_ = 0;
};

}  // namespace glossa
