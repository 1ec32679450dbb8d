// The execution-mode scopes of glossa/layers/base_layer.h (eval mode, variable stubs, extra
// variable collections): thread-locals carried to the threads Glossa starts as ThreadState slots.
#include <string>
#include <utility>
#include <vector>

#include "glossa/base/thread_state.h"
#include "glossa/layers/base_layer.h"

namespace glossa {
namespace {

thread_local bool t_eval_mode = false;                    // ThreadState: "eval_mode"
thread_local VariableStubScope* t_stub_scope = nullptr;     // ThreadState: "variable_stubs"
thread_local std::vector<std::string> t_extra_collections;  // ThreadState: "collections"
GLOSSA_THREAD_STATE_SLOT("eval_mode", t_eval_mode);
GLOSSA_THREAD_STATE_SLOT("variable_stubs", t_stub_scope);
GLOSSA_THREAD_STATE_SLOT("collections", t_extra_collections);

}  // namespace

bool IsEvalMode() { return t_eval_mode; }
EvalModeScope::EvalModeScope(bool eval) : saved_(t_eval_mode) { t_eval_mode = eval; }
EvalModeScope::~EvalModeScope() { t_eval_mode = saved_; }

VariableStubScope::VariableStubScope() : previous_(t_stub_scope) { t_stub_scope = this; }
VariableStubScope::~VariableStubScope() { t_stub_scope = previous_; }
size_t VariableStubScope::num_cached() const { return cache_.size(); }
VariableStubScope* VariableStubScope::Current() { return t_stub_scope; }

VariableCollectionScope::VariableCollectionScope(std::string collection) {
  t_extra_collections.push_back(std::move(collection));
}
VariableCollectionScope::~VariableCollectionScope() { t_extra_collections.pop_back(); }
const std::vector<std::string>& VariableCollectionScope::Current() { return t_extra_collections; }

}  // namespace glossa
