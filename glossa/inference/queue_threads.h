// The threads of a serving queue (BatchQueue's dynamic batching, ContinuousBatcher's running
// batches): the lock and wake-up they share with the queue, and the stop, drain and pause states.
// A queue derives from it and waits on cv_ for its work or for stop_ / draining_, never while
// paused_.
//
//   class MyQueue : public QueueThreads { ... threads_.push_back(StartThread(...)); ... };
//   queue.Pause();  queue.Resume();  queue.Drain();  queue.Stop();
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace glossa {

class QueueThreads {
 public:
  // The threads run what is queued without waiting for more (and unpause); Stop() then joins.
  void Drain();
  // Stops the threads (they finish what their loop says: a queue's Loop returns when stop_ is set
  // and it has nothing left) and joins them. Idempotent.
  void Stop();
  // For tests: hold the threads before their next run until Resume.
  void Pause();
  void Resume();

 protected:
  QueueThreads() = default;
  ~QueueThreads() = default;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool paused_ = false, stop_ = false, draining_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace glossa
