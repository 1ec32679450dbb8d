// A generation request's events (glossa/inference/continuous_batching.h) as server-sent events
// (text/event-stream), what POST /v1/subgraphs/NAME:stream answers:
//
//   event: joined
//   data: {"step": 41, "queued_steps": 1}    the batch step it joined at, the steps it waited
//   event: token
//   data: {"row": 0, "id": 17, "piece": "▁the", "step": 41}     one per token drawn
//   event: done
//   data: {"fetches": {...}, "global_step": 1200}                the :run answer, last
//   (or event: error, data: {"error": {"code", "message"}}, last)
//
// `step` is the running batch's step that drew the token: a request that joined at step s draws
// its first token at step s.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace httplib {
struct Response;
}

namespace glossa {

class GenerationStream;
struct GenerationEvent;

// One event as its SSE lines (fetch_keys: the done event's fetches to keep; empty: all).
std::string EventStreamText(const GenerationEvent& event, const std::vector<std::string>& fetch_keys);

// Answers `res` with the stream's events as they come; a gap of more than `max_wait` between two
// events ends the answer with an UNAVAILABLE error event. `on_end` is called once the answer has
// ended (true: every event written; false: the client went away).
void AnswerWithEventStream(std::shared_ptr<GenerationStream> stream,
                           std::vector<std::string> fetch_keys,
                           std::chrono::steady_clock::duration max_wait, httplib::Response& res,
                           std::function<void(bool)> on_end);

}  // namespace glossa
