// Continuous batching (Orca's iteration-level scheduling, as vLLM and TGI run it): a decoding
// batch that requests join and leave at step boundaries, so a short generation never waits for a
// long one to finish. A task that generates token by token offers one per generation subgraph
// (BaseTask::StartGeneration); glossa serve runs one per replica and streams each step's tokens.
//
//   std::unique_ptr<GenerationBatch> batch = predictor.StartGeneration("generate");
//   const int64_t a = batch->Join(feeds);             // feeds as the subgraph takes them
//   while (batch->busy()) for (const GenerationToken& t : batch->Step().tokens) ...;
//   InferenceMap out = batch->Finish(a);              // what Run("generate", feeds) answers
//
// A request's answer is what it gets alone: each row draws with its own generator, and under a
// batch-invariant plan (glossa/kernels/compute_plan.h) its arithmetic does not depend on the rows
// beside it, nor on the steps the batch ran before the row joined (they are masked, and add exact
// zeros).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "glossa/model/inference_spec.h"

namespace glossa {

// A token drawn by a step: request `request`'s row `row` drew `id` (`piece`: its vocabulary piece).
struct GenerationToken {
  int64_t request = 0;
  int64_t row = 0;
  int64_t id = 0;
  std::string piece;
};

struct GenerationStep {
  std::vector<GenerationToken> tokens;
  // Requests every row of which has finished (</s> drawn, or its max_new_tokens): Finish them.
  std::vector<int64_t> finished;
};

class GenerationBatch {
 public:
  virtual ~GenerationBatch() = default;
  // Adds a request (its feeds as the subgraph takes them; InvalidArgument when they are not) that
  // joins the batch at the next Step. Returns its id (unique in this batch).
  virtual int64_t Join(const InferenceMap& feeds) = 0;
  // One step: the requests joined since the last step read their prompts (all of a prompt in this
  // step), then every row draws its next token.
  virtual GenerationStep Step() = 0;
  // Drops a request that has not finished (its client went away): its rows leave before the next
  // step, and it is forgotten. NotFound for an unknown request.
  virtual void Cancel(int64_t request) = 0;
  // The fetches of a finished request (as the subgraph's RunInference gives them); it is then
  // forgotten. NotFound for an unknown or unfinished request.
  virtual InferenceMap Finish(int64_t request) = 0;
  // Rows decoding (joined and not finished) and whether a Step has anything to do.
  virtual int64_t rows() const = 0;
  virtual bool busy() const = 0;
  // Steps run so far.
  virtual int64_t steps() const = 0;
};

}  // namespace glossa
