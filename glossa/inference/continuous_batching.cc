#include "glossa/inference/continuous_batching.h"

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <utility>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/base/thread_state.h"
#include "glossa/inference/batch_queue.h"  // UnavailableError
#include "glossa/inference/batching.h"
#include "glossa/inference/predictor.h"

namespace glossa {

using Clock = std::chrono::steady_clock;

bool GenerationStream::Next(GenerationEvent* event, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return !events_.empty(); })) return false;
  *event = std::move(events_.front());
  events_.pop_front();
  return true;
}

void GenerationStream::Push(GenerationEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    ended_ = event.kind == GenerationEvent::kDone || event.kind == GenerationEvent::kError;
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

void GenerationStream::Cancel() { cancelled_ = true; }
bool GenerationStream::cancelled() const { return cancelled_.load(); }

bool GenerationStream::ended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

namespace {

void Fail(GenerationStream& stream, std::exception_ptr error) {
  GenerationEvent e;
  e.kind = GenerationEvent::kError;
  e.error = std::move(error);
  stream.Push(std::move(e));
}

}  // namespace

ContinuousBatcher::ContinuousBatcher(Predictor* predictor, std::string subgraph, Options options)
    : predictor_(predictor), subgraph_(std::move(subgraph)), options_(options) {}

ContinuousBatcher::~ContinuousBatcher() { Stop(); }

void ContinuousBatcher::Start() {
  for (int i = 0; i < std::max(1, options_.num_threads); ++i) {
    threads_.push_back(StartThread(ThreadState::Fresh(), [this] { Loop(); }));
  }
}

std::shared_ptr<GenerationStream> ContinuousBatcher::Enqueue(InferenceMap feeds,
                                                             Clock::time_point deadline) {
  auto stream = std::make_shared<GenerationStream>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || draining_) throw UnavailableError("the server is stopping");
    if (static_cast<int64_t>(queue_.size()) >= options_.max_enqueued_requests) {
      throw UnavailableError(StrCat("the queue is full (", options_.max_enqueued_requests,
                                    " requests wait); retry later"));
    }
    const int64_t rows = BatchSize(feeds);
    queue_.push_back({std::move(feeds), rows, steps_run_.load(), stream, deadline});
  }
  cv_.notify_all();
  return stream;
}

int64_t ContinuousBatcher::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

// The oldest waiting requests whose rows fit beside `rows` (one at least into an empty batch,
// whatever its rows), taken at a step boundary; empty when it is time to return.
std::vector<ContinuousBatcher::Waiting> ContinuousBatcher::Admit(int64_t rows, bool busy,
                                                                 bool* done) {
  std::vector<Waiting> joining;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    if (paused_) return false;
    return busy || !queue_.empty() || stop_ || draining_;
  });
  while (!queue_.empty() && (rows == 0 || rows + queue_.front().rows <= options_.max_batch_rows)) {
    rows += queue_.front().rows;
    joining.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  *done = joining.empty() && !busy && queue_.empty() && (stop_ || draining_);
  return joining;
}

void ContinuousBatcher::Loop() {
  std::unique_ptr<GenerationBatch> batch;
  int64_t global_step = 0;
  std::map<int64_t, std::shared_ptr<GenerationStream>> running;  // request id -> stream
  for (;;) {
    bool done = false;
    std::vector<Waiting> joining =
        Admit(batch != nullptr ? batch->rows() : 0, batch != nullptr && batch->busy(), &done);
    if (done) return;
    const auto now = Clock::now();
    for (Waiting& w : joining) {
      if (now > w.deadline) {  // its client has been answered already
        Fail(*w.stream, std::make_exception_ptr(UnavailableError("dropped: past its deadline")));
        continue;
      }
      try {
        if (batch == nullptr) batch = predictor_->StartGeneration(subgraph_, &global_step);
        if (batch == nullptr) {
          throw FailedPreconditionError(StrCat("subgraph '", subgraph_, "' does not generate"));
        }
        const int64_t id = batch->Join(w.feeds);
        running[id] = w.stream;
        GenerationEvent e;
        e.kind = GenerationEvent::kJoined;
        e.step = batch->steps();
        e.queued_steps = steps_run_.load() - w.enqueued_at;
        w.stream->Push(std::move(e));
      } catch (...) {
        Fail(*w.stream, std::current_exception());
      }
    }
    // Requests whose clients went away leave before the step.
    for (auto it = running.begin(); batch != nullptr && it != running.end();) {
      if (!it->second->cancelled()) {
        ++it;
        continue;
      }
      batch->Cancel(it->first);
      it = running.erase(it);
    }
    if (batch == nullptr || !batch->busy()) continue;
    try {
      RunStep(*batch, global_step, running);
    } catch (...) {
      LOG(ERROR) << "generation on subgraph '" << subgraph_ << "' failed; its "
                 << running.size() << " requests are answered with the error";
      for (auto& [id, stream] : running) Fail(*stream, std::current_exception());
      running.clear();
      batch.reset();
      continue;
    }
    // An empty batch ends: the next one starts on the weights loaded then.
    if (!batch->busy()) batch.reset();
  }
}

void ContinuousBatcher::RunStep(GenerationBatch& batch, int64_t global_step,
                                std::map<int64_t, std::shared_ptr<GenerationStream>>& running) {
  const int64_t step = batch.steps();
  const GenerationStep s = batch.Step();
  ++steps_run_;
  for (const GenerationToken& t : s.tokens) {
    auto it = running.find(t.request);
    if (it == running.end()) continue;
    GenerationEvent e;
    e.kind = GenerationEvent::kToken;
    e.token = t;
    e.step = step;
    it->second->Push(std::move(e));
  }
  for (int64_t id : s.finished) {
    GenerationEvent e;
    e.kind = GenerationEvent::kDone;
    e.fetches = batch.Finish(id);
    e.global_step = global_step;
    auto it = running.find(id);
    if (it == running.end()) continue;
    it->second->Push(std::move(e));
    running.erase(it);
  }
}

}  // namespace glossa
