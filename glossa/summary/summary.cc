#include "glossa/summary/summary.h"

#include <ATen/ATen.h>
#include <glog/logging.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/base/thread_state.h"

namespace glossa {
namespace {

thread_local SummaryContext* t_context = nullptr;    // ThreadState: "summaries"
thread_local std::vector<std::string> t_scopes;      // ThreadState: "summary_name_scopes"
thread_local int t_suppressed = 0;                   // ThreadState: "summaries_suppressed"
GLOSSA_THREAD_STATE_SLOT("summaries", t_context);
GLOSSA_THREAD_STATE_SLOT("summary_name_scopes", t_scopes);
GLOSSA_THREAD_STATE_SLOT("summaries_suppressed", t_suppressed);

// Lingvo's merge_all key: "<name>/<name scope>", the scope a suffix ("name/" at the root).
std::string Key(const std::string& name, const std::string& scope) { return name + "/" + scope; }

}  // namespace

SummaryContext::SummaryContext(int64_t max_loop_vars) : max_loop_vars_(max_loop_vars) {
  if (t_context != nullptr) {
    throw FailedPreconditionError(
        "a SummaryContext is already active on this thread (not re-entrant)");
  }
  t_context = this;
}

SummaryContext::~SummaryContext() { t_context = nullptr; }

SummaryContext* SummaryContext::Current() { return t_context; }

void SummaryContext::Record(Entry entry) {
  if (entry.kind == Entry::Kind::kPerExample) {
    per_example_.push_back(std::move(entry));
    return;
  }
  if (loops_.empty()) {
    entries_.push_back(std::move(entry));
    return;
  }
  const std::string key =
      Key(entry.name, entry.scope) + "#" + std::to_string(static_cast<int>(entry.kind));
  auto& loop = loops_.back();
  auto it = loop.find(key);
  if (it == loop.end()) {
    if (static_cast<int64_t>(loop.size()) >= max_loop_vars_) {
      ++dropped_;
      if (loop_dropped_.back().insert(key).second) {  // once per summary and loop, not per step
        LOG(WARNING) << "summary '" << Key(entry.name, entry.scope) << "' dropped: more than "
                     << max_loop_vars_ << " summaries in a loop (max_loop_vars)";
      }
      return;
    }
    loop_order_.back().push_back(key);
    it = loop.emplace(key, LoopVar{entry, {}}).first;
  }
  // A scalar is often a view of a larger tensor (x[0][0]): copy it so the loop holds no more.
  it->second.values.push_back(entry.kind == Entry::Kind::kScalar ? entry.value.detach().clone()
                                                                 : entry.value.detach());
}

std::map<std::string, at::Tensor> SummaryContext::MergeAll() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& e : entries_) out[Key(e.name, e.scope)] = e.value;
  // merge_all covers per-example tensors too (those not yet taken).
  for (const auto& e : per_example_) out[Key(e.name, e.scope)] = e.value;
  return out;
}

std::map<std::string, at::Tensor> SummaryContext::MergeAllPerExample() const {
  std::map<std::string, std::vector<at::Tensor>> parts;
  for (const auto& e : per_example_) {
    // merge_all_pw_tensor: "<scope>/<name>" with every '/' as "__" ("__name" at the root).
    std::string key = e.scope + "/" + e.name;
    std::string flat;
    for (char c : key) {
      if (c == '/') {
        flat += "__";
      } else {
        flat += c;
      }
    }
    parts[flat].push_back(e.value.dim() == 0 ? e.value.unsqueeze(0) : e.value);
  }
  std::map<std::string, at::Tensor> out;
  for (auto& [key, values] : parts) {
    out[key] = values.size() == 1 ? values[0] : at::cat(values, 0);
  }
  return out;
}

std::map<std::string, at::Tensor> SummaryContext::TakePerExample() {
  std::map<std::string, at::Tensor> out = MergeAllPerExample();
  per_example_.clear();
  return out;
}

std::vector<SummaryContext::Entry> SummaryContext::TakeEntries() {
  std::vector<Entry> out = std::move(entries_);
  for (auto& e : per_example_) out.push_back(std::move(e));
  entries_.clear();
  per_example_.clear();
  return out;
}

void SummaryContext::RecordEntries(std::vector<Entry> entries) {
  for (auto& e : entries) Record(std::move(e));
}

SummaryNameScope::SummaryNameScope(const std::string& name) { t_scopes.push_back(name); }
SummaryNameScope::~SummaryNameScope() { t_scopes.pop_back(); }
std::string SummaryNameScope::Current() { return Join(t_scopes, "/"); }

SummaryLoop::SummaryLoop() : ctx_(t_context) {
  if (ctx_) {
    ctx_->loops_.emplace_back();
    ctx_->loop_order_.emplace_back();
    ctx_->loop_dropped_.emplace_back();
  }
}

SummaryLoop::~SummaryLoop() {
  if (!ctx_) return;
  auto loop = std::move(ctx_->loops_.back());
  auto order = std::move(ctx_->loop_order_.back());
  ctx_->loops_.pop_back();
  ctx_->loop_order_.pop_back();
  ctx_->loop_dropped_.pop_back();
  for (const auto& key : order) {
    auto& var = loop.at(key);
    SummaryContext::Entry e = var.entry;
    if (e.kind == SummaryContext::Entry::Kind::kScalar) {
      at::Tensor sum = at::stack(var.values).sum(0);
      e.value = e.reduce == SummaryReduce::kSum
                    ? sum
                    : sum / static_cast<double>(std::max<size_t>(1, var.values.size()));
    } else {
      bool same_shape = true;
      for (const auto& v : var.values)
        same_shape = same_shape && v.sizes() == var.values[0].sizes();
      if (same_shape) {
        e.value = at::stack(var.values);
      } else {  // e.g. activations of batches with different lengths
        std::vector<at::Tensor> flat;
        for (const auto& v : var.values) flat.push_back(v.reshape({-1}));
        e.value = at::cat(flat);
      }
    }
    ctx_->Record(std::move(e));  // into the enclosing loop, or the context
  }
}

SummarySuppressScope::SummarySuppressScope() { ++t_suppressed; }
SummarySuppressScope::~SummarySuppressScope() { --t_suppressed; }

void RecordSummary(SummaryContext::Entry entry) {
  if (t_context == nullptr || t_suppressed > 0) return;
  entry.scope = SummaryNameScope::Current();
  t_context->Record(std::move(entry));
}

namespace summary {

void Scalar(const std::string& name, const at::Tensor& value, SummaryReduce reduce) {
  if (!SummaryContext::Current()) return;
  if (value.dim() != 0) {
    throw InvalidArgumentError(StrCat("summary::Scalar('", name, "') takes a scalar (rank 0), got "
                                      "shape ", value.sizes(), ": use summary::Tensor() instead"));
  }
  RecordSummary({name, "", value.detach(), SummaryContext::Entry::Kind::kScalar, reduce});
}
void Scalar(const std::string& name, double value, SummaryReduce reduce) {
  if (!SummaryContext::Current()) return;
  Scalar(name, at::full({}, value, at::TensorOptions().dtype(at::kDouble)), reduce);
}
void Tensor(const std::string& name, const at::Tensor& value) {
  if (!SummaryContext::Current()) return;
  RecordSummary(
      {name, "", value.detach(), SummaryContext::Entry::Kind::kTensor, SummaryReduce::kMean});
}
void PerExampleTensor(const std::string& name, const at::Tensor& value) {
  if (!SummaryContext::Current()) return;
  RecordSummary(
      {name, "", value.detach(), SummaryContext::Entry::Kind::kPerExample, SummaryReduce::kMean});
}

namespace {
struct TpuSummaryTensor {
  std::string name, scope;
  at::Tensor value, weight;
};
// per-thread (not carried): each thread's own collected values, outside contexts and in them
// (innermost last); a thread's values are read on that thread (GetTpuSummaryTensors).
thread_local std::vector<TpuSummaryTensor> t_tpu_tensors;
thread_local std::vector<std::vector<TpuSummaryTensor>> t_tpu_contexts;  // per-thread

std::vector<TpuSummaryTensor>& TpuTensors() {
  return t_tpu_contexts.empty() ? t_tpu_tensors : t_tpu_contexts.back();
}

std::string SanitizeScopeKey(std::string scope) {
  if (!scope.empty() && scope[0] == '_') scope.erase(0, 1);
  std::string out;
  for (char c : scope) {
    if (c == '[') {
      out += '_';
    } else if (c != ']') {
      out += c;
    }
  }
  return out;
}
}  // namespace

void AddTpuSummaryTensor(const std::string& name, const at::Tensor& value, double weight) {
  if (value.numel() != 1) {
    throw InvalidArgumentError(StrCat("AddTpuSummaryTensor('", name, "') takes a scalar, got shape ",
                                      value.sizes()));
  }
  TpuTensors().push_back({name, SummaryNameScope::Current(), value,
                          at::full({}, weight, at::TensorOptions().dtype(at::kDouble))});
}

std::map<std::string, std::pair<at::Tensor, at::Tensor>> GetTpuSummaryTensors() {
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> out;
  for (const auto& t : TpuTensors()) {
    out[t.name + "/" + SanitizeScopeKey(t.scope)] = {t.value, t.weight};
  }
  return out;
}

void ClearTpuSummaryTensors() { TpuTensors().clear(); }

}  // namespace summary
}  // namespace glossa

namespace glossa {
TpuSummaryTensorContext::TpuSummaryTensorContext() { summary::t_tpu_contexts.emplace_back(); }
TpuSummaryTensorContext::~TpuSummaryTensorContext() { summary::t_tpu_contexts.pop_back(); }
}  // namespace glossa
