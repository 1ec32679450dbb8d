// ThreadState: the Lingvo-style contexts a thread computes under (eval mode, global step, step
// seed, batch shard, summaries, aux losses, the distributed group, kernel policy scopes, ATen's
// grad mode), taken as one value on one thread and put in place on another. Each context that
// lives in a thread-local registers a slot (GLOSSA_THREAD_STATE_SLOT, in the file that owns it);
// ThreadState::Capture() copies every slot, a ThreadState::Scope installs them and restores the
// thread's own on exit. Every thread Glossa starts is started by StartThread with an explicit state:
// the starter's (Capture(), for threads that compute for it: pipeline stages) or Fresh() (the
// defaults, for threads that outlive the starter's scopes: servers, flushers, savers, input
// readers). tests/lint/check_thread_state.py fails on a thread_local that is neither a slot nor
// marked a per-thread cache, and on a thread started any other way.
//
//   thread_local bool t_eval_mode = false;  // ThreadState: "eval_mode"
//   GLOSSA_THREAD_STATE_SLOT("eval_mode", t_eval_mode);
//   std::thread t = StartThread(ThreadState::Capture(), [&] { /* sees the caller's eval mode */ });
#pragma once

#include <any>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace glossa {

class ThreadState {
 public:
  // This thread's value of every registered slot, and ATen's thread-local state.
  static ThreadState Capture();
  // Every slot at its default (a new thread's value), ATen's state as on a new thread.
  static ThreadState Fresh();
  // This state with `slot` at its default: what a thread must not share with its starter (say
  // "summaries", for threads that record into contexts of their own). InvalidArgument naming an
  // unknown slot.
  ThreadState& Reset(const std::string& slot);

  // Installs `state` on this thread for its lifetime; the thread's own values come back after
  // (and at once, if installing one slot fails).
  class Scope {
   public:
    explicit Scope(const ThreadState& state);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::vector<std::any> saved_;
    std::shared_ptr<void> aten_guard_;
  };

  // The registered slots' names, in registration order.
  static std::vector<std::string> SlotNames();

 private:
  ThreadState() = default;        // only Capture() and Fresh() make one
  std::vector<std::any> values_;  // one per slot
  std::shared_ptr<const void> aten_;  // at::ThreadLocalState, or null for Fresh()
};

// Registers a slot: `capture` reads this thread's value, `exchange` installs a value and returns
// the one it replaced, `fresh` is a new thread's value. Called at static initialization by
// GLOSSA_THREAD_STATE_SLOT; returns true.
bool RegisterThreadStateSlot(const char* name, std::function<std::any()> capture,
                             std::function<std::any(std::any)> exchange, std::any fresh);

#define GLOSSA_THREAD_STATE_CONCAT2(a, b) a##b
#define GLOSSA_THREAD_STATE_CONCAT(a, b) GLOSSA_THREAD_STATE_CONCAT2(a, b)
// `var`: a thread_local of a copyable type, named in this file, whose initializer is its default.
#define GLOSSA_THREAD_STATE_SLOT(name, var)                                                     \
  [[maybe_unused]] static const bool GLOSSA_THREAD_STATE_CONCAT(glossa_thread_state_slot_,      \
                                                                __LINE__) =                    \
      ::glossa::RegisterThreadStateSlot(                                                        \
          name, [] { return std::any(var); },                                                   \
          [](std::any v) {                                                                      \
            auto value = std::any_cast<std::decay_t<decltype(var)>>(std::move(v));              \
            std::swap(var, value);                                                              \
            return std::any(std::move(value));                                                  \
          },                                                                                    \
          std::any(std::decay_t<decltype(var)>(var)))

// A std::thread running fn() under `state` (which fn's thread holds for its whole life).
template <typename Fn>
std::thread StartThread(ThreadState state, Fn&& fn) {
  return std::thread([state = std::move(state), fn = std::forward<Fn>(fn)]() mutable {
    ThreadState::Scope scope(state);
    fn();
  });
}

}  // namespace glossa
