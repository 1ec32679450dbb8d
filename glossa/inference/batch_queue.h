// Dynamic batching for serving: requests wait in a queue per subgraph, each with its own batch
// threads (a long generation never holds up another subgraph's requests), and a batch thread
// merges the requests that batching.h says merge (same subgraph and merge key) up to
// max_batch_size examples, waiting at most batch_timeout_micros after the first one. A merged
// run that fails runs its requests one by one, so one bad request fails only itself.
//
//   BatchQueue queue(predictor, {.max_batch_size = 8}, [&](int64_t n) { metrics.ObserveBatch(n); });
//   queue.Start({"score"});
//   auto [fetches, step] = queue.Enqueue("score", feeds).get();
//   queue.Stop();  // runs what is queued, then joins the threads
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "glossa/inference/predictor.h"
#include "glossa/inference/queue_threads.h"

namespace glossa {

// A full queue or a stopping queue (HTTP 503).
class UnavailableError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class BatchQueue : public QueueThreads {
 public:
  struct Options {
    int64_t max_batch_size = 8;
    int64_t batch_timeout_micros = 1000;
    int64_t max_enqueued_requests = 1024;
    int num_batch_threads = 1;  // per subgraph
  };
  using Result = std::pair<InferenceMap, int64_t>;  // fetches, global step

  // `on_batch` is called with the examples of each run of the model (merged or not).
  BatchQueue(Predictor* predictor, Options options, std::function<void(int64_t)> on_batch);
  ~BatchQueue();

  void Start(const std::vector<std::string>& subgraphs);
  // The request's future; UnavailableError when the queue is full or stopping. A request still
  // waiting for its batch at `deadline` is answered UnavailableError without running (its client
  // has been answered already: ServeOptions::request_timeout_secs).
  std::future<Result> Enqueue(
      const std::string& subgraph, InferenceMap feeds,
      std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
  // Drain, Stop, Pause, Resume: QueueThreads's.
  int64_t queued() const;

 private:
  struct Pending;
  void Loop(const std::string& subgraph);
  void RunBatch(const std::vector<std::shared_ptr<Pending>>& batch);
  // Answers the requests of `batch` past their deadline, and drops them.
  void DropExpired(std::vector<std::shared_ptr<Pending>>& batch);

  Predictor* predictor_;
  const Options options_;
  const std::function<void(int64_t)> on_batch_;
  std::map<std::string, std::deque<std::shared_ptr<Pending>>> queues_;
  int64_t queued_ = 0;
};

}  // namespace glossa
