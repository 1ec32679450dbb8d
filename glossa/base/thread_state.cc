#include "glossa/base/thread_state.h"

#include <ATen/ThreadLocalState.h>

#include <utility>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

struct Slot {
  std::string name;
  std::function<std::any()> capture;
  std::function<std::any(std::any)> exchange;
  std::any fresh;
};

// Filled at static initialization (before any thread starts), read-only after; never destroyed,
// as a detached thread may still leave its Scope while the process exits.
std::vector<Slot>& Slots() {
  static auto* slots = new std::vector<Slot>;
  return *slots;
}

}  // namespace

bool RegisterThreadStateSlot(const char* name, std::function<std::any()> capture,
                             std::function<std::any(std::any)> exchange, std::any fresh) {
  Slots().push_back({name, std::move(capture), std::move(exchange), std::move(fresh)});
  return true;
}

ThreadState ThreadState::Capture() {
  ThreadState s;
  s.values_.reserve(Slots().size());
  for (const Slot& slot : Slots()) s.values_.push_back(slot.capture());
  s.aten_ = std::make_shared<const at::ThreadLocalState>();
  return s;
}

ThreadState ThreadState::Fresh() {
  ThreadState s;
  s.values_.reserve(Slots().size());
  for (const Slot& slot : Slots()) s.values_.push_back(slot.fresh);
  return s;
}

ThreadState& ThreadState::Reset(const std::string& slot) {
  const std::vector<Slot>& slots = Slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].name == slot) {
      values_[i] = slots[i].fresh;
      return *this;
    }
  }
  throw InvalidArgumentError(StrCat("ThreadState: no slot '", slot, "' (the slots: ",
                                    Join(SlotNames(), ", "), ")"));
}

ThreadState::Scope::Scope(const ThreadState& state) {
  const std::vector<Slot>& slots = Slots();
  saved_.reserve(slots.size());
  try {
    for (size_t i = 0; i < slots.size(); ++i) {
      saved_.push_back(slots[i].exchange(state.values_[i]));
    }
    if (state.aten_ != nullptr) {
      aten_guard_ = std::make_shared<at::ThreadLocalStateGuard>(
          *static_cast<const at::ThreadLocalState*>(state.aten_.get()));
    }
  } catch (...) {  // the thread's own values back before the error leaves
    for (size_t i = saved_.size(); i-- > 0;) slots[i].exchange(std::move(saved_[i]));
    throw;
  }
}

ThreadState::Scope::~Scope() {
  aten_guard_.reset();
  const std::vector<Slot>& slots = Slots();
  for (size_t i = slots.size(); i-- > 0;) slots[i].exchange(std::move(saved_[i]));
}

std::vector<std::string> ThreadState::SlotNames() {
  std::vector<std::string> names;
  for (const Slot& slot : Slots()) names.push_back(slot.name);
  return names;
}

}  // namespace glossa
