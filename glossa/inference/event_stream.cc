#include "glossa/inference/event_stream.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/inference/batch_queue.h"  // UnavailableError
#include "glossa/inference/continuous_batching.h"
#include "glossa/inference/json_io.h"

namespace glossa {
namespace {

nlohmann::ordered_json ErrorJson(const std::exception_ptr& error) {
  std::string code = "INTERNAL", message = "unknown error";
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    code = std::string(StatusCodeName(e.code()));
    message = e.message();
  } catch (const UnavailableError& e) {
    code = "UNAVAILABLE";
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  }
  nlohmann::ordered_json j;
  j["error"] = {{"code", code}, {"message", message}};
  return j;
}

std::string Dump(const nlohmann::ordered_json& j) {
  // Pieces and texts may hold invalid UTF-8 (a piece cut mid-character): U+FFFD, never a throw.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

std::string EventStreamText(const GenerationEvent& e, const std::vector<std::string>& fetch_keys) {
  nlohmann::ordered_json j;
  std::string name;
  switch (e.kind) {
    case GenerationEvent::kJoined:
      name = "joined";
      j["step"] = e.step;
      j["queued_steps"] = e.queued_steps;
      break;
    case GenerationEvent::kToken:
      name = "token";
      j["row"] = e.token.row;
      j["id"] = e.token.id;
      j["piece"] = e.token.piece;
      j["step"] = e.step;
      break;
    case GenerationEvent::kDone: {
      name = "done";
      nlohmann::ordered_json all = FetchesToJson(e.fetches);
      if (fetch_keys.empty()) {
        j["fetches"] = std::move(all);
      } else {
        j["fetches"] = nlohmann::ordered_json::object();
        for (const auto& k : fetch_keys) j["fetches"][k] = all[k];
      }
      j["global_step"] = e.global_step;
      break;
    }
    case GenerationEvent::kError:
      name = "error";
      j = ErrorJson(e.error);
      break;
  }
  return StrCat("event: ", name, "\ndata: ", Dump(j), "\n\n");
}

void AnswerWithEventStream(std::shared_ptr<GenerationStream> stream,
                           std::vector<std::string> fetch_keys,
                           std::chrono::steady_clock::duration max_wait, httplib::Response& res,
                           std::function<void(bool)> on_end) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream, fetch_keys = std::move(fetch_keys), max_wait](size_t, httplib::DataSink& sink) {
        GenerationEvent e;
        if (!stream->Next(&e, std::chrono::steady_clock::now() + max_wait)) {
          e.kind = GenerationEvent::kError;
          e.error = std::make_exception_ptr(UnavailableError(
              "no token within request_timeout_secs (the server is overloaded)"));
        }
        const std::string text = EventStreamText(e, fetch_keys);
        if (!sink.write(text.data(), text.size())) {  // the client went away
          stream->Cancel();
          return false;
        }
        if (e.kind == GenerationEvent::kDone || e.kind == GenerationEvent::kError) sink.done();
        return true;
      },
      [stream, on_end = std::move(on_end)](bool success) {
        if (!success) stream->Cancel();  // (a no-op once it has ended)
        on_end(success);
      });
}

}  // namespace glossa
