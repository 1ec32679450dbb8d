#include "glossa/input/record_batcher.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/base/thread_state.h"

namespace glossa {

namespace {

// The values of each of `keys` across `examples` (column k: key k of each example), after
// checking that every example has example 0's keys, in its order.
std::vector<std::vector<NestedValue>> Columns(const std::vector<NestedMap>& examples,
                                              const std::vector<std::string>& keys) {
  std::vector<std::vector<NestedValue>> columns(keys.size());
  for (size_t e = 0; e < examples.size(); ++e) {
    auto flat = examples[e].FlattenItems();
    if (flat.size() != keys.size()) {
      throw InvalidArgumentError(StrCat("PadAndStack: example ", e, " has keys [",
                                        Join(examples[e].Keys(), ", "), "], example 0 has [",
                                        Join(keys, ", "), "]"));
    }
    for (size_t k = 0; k < flat.size(); ++k) {
      if (flat[k].first != keys[k]) {
        throw InvalidArgumentError(StrCat("PadAndStack: example ", e, " has key '", flat[k].first,
                                          "' where example 0 has '", keys[k], "'"));
      }
      columns[k].push_back(flat[k].second);
    }
  }
  return columns;
}

// The tensors of `col` (CPU, contiguous, one dtype, rank `rank`) stacked into one
// [col.size(), max_shape...] tensor filled with `pad`, each copied into its slot.
at::Tensor StackInPlace(const std::vector<NestedValue>& col, const std::vector<int64_t>& max_shape,
                        int64_t rank, double pad) {
  const at::Tensor& first = col[0].AsTensor();
  std::vector<int64_t> out_shape = {static_cast<int64_t>(col.size())};
  out_shape.insert(out_shape.end(), max_shape.begin(), max_shape.end());
  at::Tensor out = at::full(out_shape, pad, first.options());
  const int64_t item = static_cast<int64_t>(first.element_size());
  const int64_t slot = out.numel() / std::max<int64_t>(out.size(0), 1) * item;
  char* dst = static_cast<char*>(out.data_ptr());
  for (size_t e = 0; e < col.size(); ++e) {
    const at::Tensor& t = col[e].AsTensor();
    if (t.numel() == 0) continue;
    const char* src = static_cast<const char*>(t.data_ptr());
    if (rank <= 1) {
      std::memcpy(dst + e * slot, src, t.numel() * item);
      continue;
    }
    // Rows of the last dimension, each to its place in the padded [max_shape] slot.
    const int64_t row = t.size(rank - 1) * item, rows = t.numel() / t.size(rank - 1);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t offset = 0, rest = r;
      for (int64_t d = rank - 2; d >= 0; --d) {
        int64_t stride = max_shape[rank - 1];
        for (int64_t d2 = d + 1; d2 < rank - 1; ++d2) stride *= max_shape[d2];
        offset += (rest % t.size(d)) * stride;
        rest /= t.size(d);
      }
      std::memcpy(dst + e * slot + offset * item, src + r * row, row);
    }
  }
  return out;
}

// The tensors of `col` (rank `rank`), each padded with `pad` to [max_shape] where it is smaller,
// stacked along a new dim 0.
at::Tensor PadEachAndStack(const std::vector<NestedValue>& col,
                           const std::vector<int64_t>& max_shape, int64_t rank, double pad) {
  std::vector<at::Tensor> padded;
  for (const auto& v : col) {
    at::Tensor t = v.AsTensor();
    std::vector<int64_t> pads;
    bool needs = false;
    for (int64_t d = rank - 1; d >= 0; --d) {
      pads.push_back(0);
      pads.push_back(max_shape[d] - t.size(d));
      needs = needs || max_shape[d] != t.size(d);
    }
    padded.push_back(needs ? at::constant_pad_nd(t, pads, pad) : t);
  }
  return at::stack(padded);
}

// Column `key` of the batch: its non-tensor values as a list, or its tensors padded to a common
// shape (pad value from pad_values, else 1 for keys ending in "paddings", else 0) and stacked.
NestedValue StackColumn(const std::string& key, const std::vector<NestedValue>& col,
                        const std::map<std::string, double>& pad_values) {
  if (!col[0].is_tensor()) return NestedValue(NestedValue::List(col.begin(), col.end()));
  const int64_t rank = col[0].AsTensor().dim();
  std::vector<int64_t> max_shape = col[0].AsTensor().sizes().vec();
  for (const auto& v : col) {
    const at::Tensor& t = v.AsTensor();
    if (t.dim() != rank) {
      throw InvalidArgumentError(StrCat("PadAndStack: '", key, "' has rank ", t.dim(),
                                        " in one example and ", rank, " in another"));
    }
    for (int64_t d = 0; d < rank; ++d) max_shape[d] = std::max(max_shape[d], t.size(d));
  }
  double pad = 0.0;
  auto it = pad_values.find(key);
  if (it != pad_values.end()) {
    pad = it->second;
  } else if (key.size() >= 8 && key.compare(key.size() - 8, 8, "paddings") == 0) {
    pad = 1.0;
  }
  // The common case, each example's tensor contiguous on the CPU in one dtype: one output
  // filled with the pad value and each example copied into its slot (a padded copy and its
  // allocation per example and column cost more than the copying).
  const at::Tensor& first = col[0].AsTensor();
  bool direct = first.device().is_cpu();
  for (const auto& v : col) {
    const at::Tensor& t = v.AsTensor();
    direct = direct && t.device().is_cpu() && t.scalar_type() == first.scalar_type() &&
             t.is_contiguous() && !t.is_complex();
  }
  if (direct) return NestedValue(StackInPlace(col, max_shape, rank, pad));
  return NestedValue(PadEachAndStack(col, max_shape, rank, pad));
}

}  // namespace

NestedMap PadAndStack(const std::vector<NestedMap>& examples,
                      const std::map<std::string, double>& pad_values) {
  if (examples.empty()) throw InvalidArgumentError("PadAndStack: no examples");
  const auto keys = examples[0].Keys();
  const std::vector<std::vector<NestedValue>> columns = Columns(examples, keys);
  std::vector<NestedValue> stacked;
  for (size_t k = 0; k < keys.size(); ++k) {
    stacked.push_back(StackColumn(keys[k], columns[k], pad_values));
  }
  return examples[0].Pack(stacked);
}

struct RecordBatcher::State {
  std::shared_ptr<RecordYielder> yielder;
  BatcherOptions options;
  RecordProcessor processor;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<NestedMap>> buckets;
  std::unique_ptr<SequencePacker> packer;  // with options.packing
  std::deque<NestedMap> ready;
  std::vector<std::thread> threads;
  int active = 0;
  bool stop = false;
  bool flushed_at_end = false;
  std::exception_ptr error;
  std::atomic<int64_t> too_long{0}, dropped{0}, processed{0};
  // The yielder's epoch when an example last went into a bucket (mu held): once a whole epoch
  // has passed since, no record of the input can make a batch, and waiting would never end.
  int64_t last_accept_epoch = -1;

  // Emits the packer's open rows (mu held).
  void EmitPacked() {
    while (std::optional<NestedMap> batch = packer->Flush()) {
      ready.push_back(std::move(*batch));
      cv.notify_all();
    }
  }

  // Every open bucket or row as a batch (mu held).
  void EmitAll() {
    if (packer) EmitPacked();
    for (size_t b = 0; b < buckets.size(); ++b) Emit(b);
  }

  // Places an example of bucket key `key` (mu held); false when it is dropped or too long.
  bool Accept(NestedMap example, int64_t key) {
    if (key < 0) {
      ++dropped;
      return false;
    }
    if (packer) {
      if (!packer->Fits(example)) {
        ++too_long;
        return false;
      }
      if (std::optional<NestedMap> batch = packer->Add(std::move(example))) {
        ready.push_back(std::move(*batch));
        cv.notify_all();
      }
      return true;
    }
    const auto& bounds = options.bucket_upper_bound;
    const auto it = std::lower_bound(bounds.begin(), bounds.end(), key);
    if (it == bounds.end()) {
      ++too_long;
      return false;
    }
    const size_t b = it - bounds.begin();
    buckets[b].push_back(std::move(example));
    if (static_cast<int64_t>(buckets[b].size()) >= options.bucket_batch_limit[b]) Emit(b);
    return true;
  }

  // Emits bucket i as a batch (mu held).
  void Emit(size_t i) {
    if (buckets[i].empty()) return;
    std::vector<NestedMap> examples = std::move(buckets[i]);
    buckets[i].clear();
    ready.push_back(PadAndStack(examples, options.pad_values));
    cv.notify_all();
  }

  void Loop() {
    try {
      while (true) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] {
            return stop || error ||
                   static_cast<int64_t>(ready.size()) < std::max<int64_t>(options.prefetch, 1);
          });
          if (stop || error) break;
        }
        Record record;
        try {
          record = yielder->Next();
        } catch (const OutOfRangeError&) {
          break;
        }
        auto result = processor(record);
        const int64_t n = ++processed;
        const int64_t epoch = yielder->current_epoch();
        std::lock_guard<std::mutex> lock(mu);
        if (last_accept_epoch < 0) last_accept_epoch = epoch;
        bool accepted = false;
        if (result) {
          accepted = Accept(std::move(result->first), result->second);
        } else {
          ++dropped;
        }
        if (accepted) {
          last_accept_epoch = epoch;
        } else if (epoch >= last_accept_epoch + 2) {
          throw InvalidArgumentError(StrCat(
              "input: a full pass over the data gave no example a batch: ", too_long.load(),
              packer ? " longer than a packed row" : " longer than the last bucket_upper_bound (",
              packer ? "" : StrCat(options.bucket_upper_bound.back(), ")"), ", ", dropped.load(), " dropped by the processor, of ", n, " records read"));
        }
        if (options.flush_every_n > 0 && n % options.flush_every_n == 0) EmitAll();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    --active;
    if (active == 0 && !error) {
      EmitAll();  // end of data: flush partial buckets and rows
    }
    cv.notify_all();
  }
};

RecordBatcher::RecordBatcher(std::shared_ptr<RecordYielder> yielder, const BatcherOptions& options,
                             RecordProcessor processor)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.yielder = std::move(yielder);
  s.options = options;
  s.processor = std::move(processor);
  const auto& b = options.bucket_upper_bound;
  if (b.empty() || b.size() != options.bucket_batch_limit.size()) {
    throw InvalidArgumentError(
        StrCat("RecordBatcher: bucket_upper_bound (", b.size(), ") and bucket_batch_limit (",
               options.bucket_batch_limit.size(), ") must be non-empty and of equal length"));
  }
  if (!std::is_sorted(b.begin(), b.end())) {
    throw InvalidArgumentError(StrCat("RecordBatcher: bucket_upper_bound must be sorted, got [",
                                      Join(
                                          [&] {
                                            std::vector<std::string> v;
                                            for (auto x : b) v.push_back(std::to_string(x));
                                            return v;
                                          }(),
                                          ", "),
                                      "]"));
  }
  for (int64_t limit : options.bucket_batch_limit) {
    if (limit <= 0)
      throw InvalidArgumentError("RecordBatcher: bucket_batch_limit entries must be > 0");
  }
  s.buckets.resize(b.size());
  if (options.packing.rows > 0) {
    s.packer = std::make_unique<SequencePacker>(options.packing, options.pad_values);
  }
  const int64_t n = std::max<int64_t>(1, options.num_batcher_threads);
  s.active = static_cast<int>(n);
  for (int64_t i = 0; i < n; ++i) s.threads.push_back(StartThread(ThreadState::Fresh(), [&s] { s.Loop(); }));
}

RecordBatcher::~RecordBatcher() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  for (auto& t : state_->threads) t.join();
}

NestedMap RecordBatcher::Next() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait(lock, [&] { return !s.ready.empty() || s.error || s.active == 0; });
  if (!s.ready.empty()) {
    NestedMap batch = std::move(s.ready.front());
    s.ready.pop_front();
    s.cv.notify_all();
    return batch;
  }
  if (s.error) std::rethrow_exception(s.error);
  throw OutOfRangeError("end of input: the record batcher has emitted every batch");
}

int64_t RecordBatcher::num_skipped_too_long() const { return state_->too_long; }
int64_t RecordBatcher::num_dropped() const { return state_->dropped; }
int64_t RecordBatcher::num_processed() const { return state_->processed; }

}  // namespace glossa
