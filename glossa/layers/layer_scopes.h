// The execution-mode scopes layers read (Lingvo's cluster.do_eval; variable stubs): thread-locals
// that ThreadState carries to the threads Glossa starts (glossa/base/thread_state.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace glossa {

class BaseLayer;

// True inside an EvalModeScope on this thread (Lingvo's cluster.do_eval): no dropout, EMA weights.
bool IsEvalMode();
class EvalModeScope {
 public:
  explicit EvalModeScope(bool eval = true);
  ~EvalModeScope();
  EvalModeScope(const EvalModeScope&) = delete;
  EvalModeScope& operator=(const EvalModeScope&) = delete;

 private:
  bool saved_;
};

// While alive on this thread, CreateVariable returns a cached zero tensor per (shape, dtype)
// instead of initializing a variable, except for names containing "total_samples". Lets a test
// instantiate every registered model cheaply.
class VariableStubScope {
 public:
  VariableStubScope();
  ~VariableStubScope();
  VariableStubScope(const VariableStubScope&) = delete;
  VariableStubScope& operator=(const VariableStubScope&) = delete;
  // How many distinct zero tensors were handed out.
  size_t num_cached() const;
  // The innermost scope on this thread, or null.
  static VariableStubScope* Current();

 private:
  friend class BaseLayer;
  std::map<std::pair<std::vector<int64_t>, at::ScalarType>, at::Tensor> cache_;
  VariableStubScope* previous_;
};

}  // namespace glossa
