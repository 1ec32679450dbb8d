// The execution-mode scopes of glossa/layers/layer_scopes.h (eval mode, variable stubs):
// thread-locals carried to the threads Glossa starts as ThreadState slots.
#include <string>
#include <utility>
#include <vector>

#include "glossa/base/thread_state.h"
#include "glossa/layers/layer_scopes.h"

namespace glossa {
namespace {

thread_local bool t_eval_mode = false;                    // ThreadState: "eval_mode"
thread_local VariableStubScope* t_stub_scope = nullptr;     // ThreadState: "variable_stubs"
GLOSSA_THREAD_STATE_SLOT("eval_mode", t_eval_mode);
GLOSSA_THREAD_STATE_SLOT("variable_stubs", t_stub_scope);

}  // namespace

bool IsEvalMode() { return t_eval_mode; }
EvalModeScope::EvalModeScope(bool eval) : saved_(t_eval_mode) { t_eval_mode = eval; }
EvalModeScope::~EvalModeScope() { t_eval_mode = saved_; }

VariableStubScope::VariableStubScope() : previous_(t_stub_scope) { t_stub_scope = this; }
VariableStubScope::~VariableStubScope() { t_stub_scope = previous_; }
size_t VariableStubScope::num_cached() const { return cache_.size(); }
VariableStubScope* VariableStubScope::Current() { return t_stub_scope; }

}  // namespace glossa
