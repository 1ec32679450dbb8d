// The summary context (Lingvo's tpu_summary): layers record scalars and tensors anywhere during a
// step; the program collects them. Outside a SummaryContext every call is a no-op.
//
//   SummaryContext ctx;                        // thread-local, not re-entrant
//   { SummaryNameScope s("enc");  summary::Scalar("over_capacity", ratio); }
//   { SummaryLoop loop;  for (...) summary::Scalar("loss", l); }   // reduced when `loop` ends
//   std::map<std::string, at::Tensor> all = ctx.MergeAll();   // {"loss": mean,
//   "over_capacity/enc": ...}
//
// In a loop region values accumulate per iteration and are reduced when the loop ends: scalars by
// mean (sum / max(1, count)) or sum, tensors stacked along a new dim 0 (flattened and concatenated
// when the iterations' shapes differ). At most max_loop_vars distinct summaries accumulate in a
// loop; later ones are dropped (counted and logged), as in Lingvo.
//
// Per-example tensors ([batch, ...]) are not loop-reduced: they belong to the step that recorded
// them. A program takes them after each step (TakePerExample) and hands them on with the step's
// other per-example outputs (the train outfeed, a decode batch's output); values recorded under
// one key in the same step (one per tower) are concatenated along dim 0.
//
// The context is thread-local: summaries recorded on other threads (input processors, GPipe stage
// threads) see no context and are dropped. docs/training.md lists where the programs open one.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace glossa {

enum class SummaryReduce { kMean, kSum };

class SummaryContext {
 public:
  // FailedPrecondition when a context is already active on this thread.
  explicit SummaryContext(int64_t max_loop_vars = 16);
  ~SummaryContext();
  SummaryContext(const SummaryContext&) = delete;
  SummaryContext& operator=(const SummaryContext&) = delete;

  // The active context of this thread, or null.
  static SummaryContext* Current();

  // "name/scope" (or "name" without a scope) -> value, in recording order of first appearance.
  std::map<std::string, at::Tensor> MergeAll() const;
  // Per-example tensors not yet taken: "scope__name" with '/' replaced by "__" -> value (entries
  // under one key concatenated along dim 0).
  std::map<std::string, at::Tensor> MergeAllPerExample() const;
  // MergeAllPerExample, then forgets them: what a program calls after each step.
  std::map<std::string, at::Tensor> TakePerExample();
  int64_t num_dropped_loop_vars() const { return dropped_; }

  struct Entry {
    std::string name;
    std::string scope;
    at::Tensor value;
    enum class Kind { kScalar, kTensor, kPerExample } kind;
    SummaryReduce reduce = SummaryReduce::kMean;
  };
  // For work on other threads (pipeline stages): each thread records into a context of its own,
  // whose entries (outside loops, per-example ones included) are taken with TakeEntries and
  // recorded, scopes kept, into the caller's context with RecordEntries on the caller's thread.
  std::vector<Entry> TakeEntries();
  void RecordEntries(std::vector<Entry> entries);

 private:
  friend class SummaryLoop;
  friend void RecordSummary(SummaryContext::Entry entry);
  void Record(Entry entry);
  std::vector<Entry> entries_;
  std::vector<Entry> per_example_;
  // Loop accumulation: key -> values per iteration.
  struct LoopVar {
    Entry entry;
    std::vector<at::Tensor> values;
  };
  std::vector<std::map<std::string, LoopVar>> loops_;
  std::vector<std::vector<std::string>> loop_order_;
  std::vector<std::set<std::string>> loop_dropped_;  // keys dropped (and logged) per loop
  int64_t max_loop_vars_;
  int64_t dropped_ = 0;
};

// Pushes a name scope ("a/b" when nested) for the summaries recorded inside it.
class SummaryNameScope {
 public:
  explicit SummaryNameScope(const std::string& name);
  ~SummaryNameScope();
  SummaryNameScope(const SummaryNameScope&) = delete;
  SummaryNameScope& operator=(const SummaryNameScope&) = delete;
  static std::string Current();
};

// A loop region of the current context (no-op without one).
class SummaryLoop {
 public:
  SummaryLoop();
  ~SummaryLoop();  // reduces the accumulated values into the context
  SummaryLoop(const SummaryLoop&) = delete;
  SummaryLoop& operator=(const SummaryLoop&) = delete;

 private:
  SummaryContext* ctx_;
};

// While alive on this thread (nesting allowed), summaries recorded on it are dropped: for replays
// of a forward pass (RevNet's reverse pass rebuilding activations in the backward), which must not
// count their summaries twice.
class SummarySuppressScope {
 public:
  SummarySuppressScope();
  ~SummarySuppressScope();
  SummarySuppressScope(const SummarySuppressScope&) = delete;
  SummarySuppressScope& operator=(const SummarySuppressScope&) = delete;
};

namespace summary {
void Scalar(const std::string& name, const at::Tensor& value,
            SummaryReduce reduce = SummaryReduce::kMean);
void Scalar(const std::string& name, double value, SummaryReduce reduce = SummaryReduce::kMean);
void Tensor(const std::string& name, const at::Tensor& value);
void PerExampleTensor(const std::string& name, const at::Tensor& value);
}  // namespace summary

// Lingvo's py_utils.AddTpuSummaryTensor / GetTpuSummaryTensors / ClearTpuSummaryTensors: named
// (value, weight) pairs a layer adds during FProp, which the task reports as metrics (weighted
// means over towers, loop steps and eval batches, as Lingvo's eval metrics are). Keys are
// "<name>/<scope>" with the scope sanitized as Lingvo's SanitizeScopeKey does (one leading '_'
// dropped, '[' -> '_', ']' removed); a later value under one key replaces the earlier. Storage is
// per thread: the innermost TpuSummaryTensorContext, else a thread-wide list. BaseTask::FProp
// opens a context per tower and adds what its layers recorded to the tower's metrics.
namespace summary {
void AddTpuSummaryTensor(const std::string& name, const at::Tensor& value, double weight = 1.0);
std::map<std::string, std::pair<at::Tensor, at::Tensor>> GetTpuSummaryTensors();
void ClearTpuSummaryTensors();
}  // namespace summary

class TpuSummaryTensorContext {
 public:
  TpuSummaryTensorContext();
  ~TpuSummaryTensorContext();
  TpuSummaryTensorContext(const TpuSummaryTensorContext&) = delete;
  TpuSummaryTensorContext& operator=(const TpuSummaryTensorContext&) = delete;
};

}  // namespace glossa
