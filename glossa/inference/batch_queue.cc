#include "glossa/inference/batch_queue.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>

#include "glossa/base/strings.h"
#include "glossa/base/thread_state.h"
#include "glossa/inference/batching.h"

namespace glossa {

using Clock = std::chrono::steady_clock;

// One request waiting for a batch.
struct BatchQueue::Pending {
  std::string subgraph, key;
  InferenceMap feeds;
  int64_t n = 0;
  Clock::time_point enqueued, deadline;
  std::promise<Result> done;
};

BatchQueue::BatchQueue(Predictor* predictor, Options options,
                       std::function<void(int64_t)> on_batch)
    : predictor_(predictor), options_(options), on_batch_(std::move(on_batch)) {}

BatchQueue::~BatchQueue() { Stop(); }

void BatchQueue::Start(const std::vector<std::string>& subgraphs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& s : subgraphs) queues_[s];  // map nodes stay put for the loops
  }
  for (const auto& s : subgraphs) {
    for (int i = 0; i < options_.num_batch_threads; ++i) {
      threads_.push_back(StartThread(ThreadState::Fresh(), [this, s] { Loop(s); }));
    }
  }
}

std::future<BatchQueue::Result> BatchQueue::Enqueue(const std::string& subgraph,
                                                    InferenceMap feeds,
                                                    Clock::time_point deadline) {
  auto p = std::make_shared<Pending>();
  p->subgraph = subgraph;
  p->key = MergeKey(subgraph, feeds);
  p->n = BatchSize(feeds);
  p->feeds = std::move(feeds);
  p->enqueued = Clock::now();
  p->deadline = deadline;
  auto future = p->done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) throw UnavailableError("the server is stopping");
    if (queued_ >= options_.max_enqueued_requests) {
      throw UnavailableError(StrCat("the queue is full (", options_.max_enqueued_requests,
                                    " requests wait); retry later"));
    }
    auto q = queues_.find(subgraph);
    if (q == queues_.end()) throw UnavailableError(StrCat("no batch queue for '", subgraph, "'"));
    q->second.push_back(std::move(p));
    ++queued_;
  }
  cv_.notify_all();
  return future;
}

int64_t BatchQueue::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

void BatchQueue::Loop(const std::string& subgraph) {
  std::deque<std::shared_ptr<Pending>>* q = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    q = &queues_[subgraph];
  }
  auto& queue = *q;
  for (;;) {
    std::vector<std::shared_ptr<Pending>> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return (!queue.empty() && !paused_) || (stop_ && queue.empty()); });
      if (queue.empty()) return;  // stopping
      batch.push_back(queue.front());
      queue.pop_front();
      --queued_;
      int64_t n = batch[0]->n;
      const auto deadline =
          batch[0]->enqueued + std::chrono::microseconds(options_.batch_timeout_micros);
      while (n < options_.max_batch_size) {
        auto it = std::find_if(queue.begin(), queue.end(), [&](const auto& p) {
          return p->key == batch[0]->key && n + p->n <= options_.max_batch_size;
        });
        if (it != queue.end()) {
          n += (*it)->n;
          batch.push_back(*it);
          queue.erase(it);
          --queued_;
          continue;
        }
        if (stop_ || draining_ || Clock::now() >= deadline) break;
        cv_.wait_until(lock, deadline);
      }
    }
    DropExpired(batch);
    if (!batch.empty()) RunBatch(batch);
  }
}

void BatchQueue::DropExpired(std::vector<std::shared_ptr<Pending>>& batch) {
  const auto now = Clock::now();
  std::vector<std::shared_ptr<Pending>> kept;
  for (auto& p : batch) {
    if (now < p->deadline) {
      kept.push_back(std::move(p));
      continue;
    }
    const std::chrono::duration<double> waited = now - p->enqueued;
    p->done.set_exception(std::make_exception_ptr(UnavailableError(
        StrCat("waited ", waited.count(), " s for a batch, past its deadline: dropped unrun"))));
  }
  batch = std::move(kept);
}

void BatchQueue::RunBatch(const std::vector<std::shared_ptr<Pending>>& batch) {
  int64_t total = 0;
  for (const auto& p : batch) total += p->n;
  if (on_batch_) on_batch_(total);
  if (batch.size() > 1) {
    try {
      std::vector<const InferenceMap*> feeds;
      for (const auto& p : batch) feeds.push_back(&p->feeds);
      int64_t step = 0;
      const InferenceMap all =
          predictor_->Run(batch[0]->subgraph, MergeFeeds(feeds), {}, true, &step);
      int64_t offset = 0;
      for (const auto& p : batch) {
        p->done.set_value({SliceFetches(all, offset, p->n, total), step});
        offset += p->n;
      }
      return;
    } catch (const std::exception& e) {
      // One request must not fail the others: run each alone below.
      LOG(WARNING) << "a merged batch of " << batch.size()
                   << " requests failed; running them one by one: " << e.what();
    }
  }
  for (const auto& p : batch) {
    try {
      int64_t step = 0;
      InferenceMap fetches = predictor_->Run(p->subgraph, p->feeds, {}, true, &step);
      p->done.set_value({std::move(fetches), step});
    } catch (...) {
      p->done.set_exception(std::current_exception());
    }
  }
}

}  // namespace glossa
