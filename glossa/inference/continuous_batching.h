// Continuous batching for glossa serve: the requests of a generation subgraph join a running
// decoding batch at its next step and leave it as they finish (glossa/model/generation.h), so a
// short generation never waits for a long one, and each request's tokens can be streamed as they
// are drawn (POST /v1/subgraphs/NAME:stream, server-sent events). Each of num_threads replicas
// runs its own batch over the one copy of the weights; a replica admits the oldest waiting
// requests whose rows fit in max_batch_rows at every step. A replica whose batch has emptied
// starts its next one on the weights loaded then (a reload takes effect between batches).
//
//   ContinuousBatcher gen(&predictor, "generate", {.max_batch_rows = 32});
//   gen.Start();
//   std::shared_ptr<GenerationStream> s = gen.Enqueue(feeds, deadline);
//   GenerationEvent e;
//   while (s->Next(&e, deadline) && e.kind == GenerationEvent::kToken) ...;  // then kDone or kError
//   gen.Stop();
#pragma once

#include <chrono>
#include <condition_variable>
#include <atomic>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "glossa/inference/queue_threads.h"
#include "glossa/model/generation.h"

namespace glossa {

class Predictor;

struct GenerationEvent {
  enum Kind { kJoined, kToken, kDone, kError };
  Kind kind = kToken;
  GenerationToken token;  // kToken
  // kJoined: the step of its batch the request joined at (it reads its prompts and draws its
  // first tokens in that step); kToken: the step that drew it.
  int64_t step = 0;
  // kJoined: the decoding steps run (by any replica) while it waited to join.
  int64_t queued_steps = 0;
  InferenceMap fetches;   // kDone: the subgraph's answer
  int64_t global_step = 0;
  std::exception_ptr error;  // kError
};

// One request's events, in order: kJoined, its tokens, then kDone; or kError at any point.
class GenerationStream {
 public:
  // The next event (true), or false when none came by `deadline`.
  bool Next(GenerationEvent* event, std::chrono::steady_clock::time_point deadline);
  void Push(GenerationEvent event);
  // Whether the request has ended (kDone or kError pushed).
  bool ended() const;
  // Its client went away: the request leaves its batch before the next step.
  void Cancel();
  bool cancelled() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
  bool ended_ = false;
  std::atomic<bool> cancelled_{false};
};

class ContinuousBatcher : public QueueThreads {
 public:
  struct Options {
    int64_t max_batch_rows = 32;
    int64_t max_enqueued_requests = 256;
    int num_threads = 1;  // replicas
  };
  ContinuousBatcher(Predictor* predictor, std::string subgraph, Options options);
  ~ContinuousBatcher();  // Stop()s

  void Start();
  // The request's stream; UnavailableError (glossa/inference/batch_queue.h) when the queue is
  // full or stopping. A request still waiting to join at `deadline` ends with UnavailableError
  // without running.
  std::shared_ptr<GenerationStream> Enqueue(
      InferenceMap feeds,
      std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
  // Drain (stops taking requests; the threads finish what is queued and running, then return),
  // Stop, Pause and Resume (for tests: the threads wait before their next step): QueueThreads's.
  int64_t queued() const;

 private:
  struct Waiting {
    InferenceMap feeds;
    int64_t rows = 0;
    int64_t enqueued_at = 0;  // steps_run_ then
    std::shared_ptr<GenerationStream> stream;
    std::chrono::steady_clock::time_point deadline;
  };
  void Loop();
  std::vector<Waiting> Admit(int64_t rows, bool busy, bool* done);
  void RunStep(GenerationBatch& batch, int64_t global_step,
               std::map<int64_t, std::shared_ptr<GenerationStream>>& running);

  Predictor* predictor_;
  const std::string subgraph_;
  const Options options_;
  std::deque<Waiting> queue_;
  std::atomic<int64_t> steps_run_{0};  // by every replica
};

}  // namespace glossa
