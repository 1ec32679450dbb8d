#include "glossa/inference/queue_threads.h"

namespace glossa {

void QueueThreads::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    paused_ = false;
  }
  cv_.notify_all();
}

void QueueThreads::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    paused_ = false;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void QueueThreads::Pause() {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = true;
}

void QueueThreads::Resume() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = false;
  }
  cv_.notify_all();
}

}  // namespace glossa
