// Ranks as threads of one test process: each with its own c10d store client and Gloo process
// group, as processes would have (tests/runtime/*_test.cc).
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/runtime/distributed.h"

namespace glossa {

// Runs fn(rank, dist) on `world` workers; rethrows the first worker's exception. Rank 0 binds a
// port the kernel picks (master_port 0) and the others join on the port it reports, so no other
// test can take the port in between.
inline void RunWorkers(int world, const std::function<void(Distributed&)>& fn, double timeout = 30) {
  std::promise<int> listening;
  std::shared_future<int> port = listening.get_future().share();
  std::once_flag told;
  const auto tell = [&](const std::string&, int p) {
    std::call_once(told, [&] { listening.set_value(p); });
  };
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        DistributedOptions o;
        o.world_size = world;
        o.rank = r;
        o.timeout_seconds = timeout;
        if (r == 0) {
          o.master_port = 0;
          o.on_listening = tell;
        } else {
          if (port.wait_for(std::chrono::duration<double>(timeout)) !=
              std::future_status::ready) {
            throw AbortedError(StrCat("rank ", r, ": rank 0 did not bind its port within ",
                                      timeout, " s"));
          }
          o.master_port = port.get();
          if (o.master_port <= 0) throw AbortedError(StrCat("rank ", r, ": rank 0 failed first"));
        }
        Distributed dist(o);
        fn(dist);
      } catch (...) {
        errors[r] = std::current_exception();
      }
      if (r == 0) tell("", -1);  // rank 0 failed before it listened: the others stop waiting
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// The pipeline stage that holds variable `name` of an LM task named "lm" whose `layers` layers are
// split evenly into `stages` stages with Lingvo's placement (TransformerStack's
// place_ends_on_stages: the embedding on stage 0, the final layer norm and the softmax on the
// last); -1 for a variable every rank holds.
inline int LmStageOf(const std::string& name, int stages, int layers) {
  const size_t at = name.find("/x_layers_");
  if (at != std::string::npos) return std::stoi(name.substr(at + 10)) / (layers / stages);
  if (name.rfind("lm/emb/", 0) == 0) return 0;
  if (name.rfind("lm/softmax/", 0) == 0 || name.rfind("lm/stack/final_ln/", 0) == 0) {
    return stages - 1;
  }
  return -1;
}

// The dim a model-sharded variable of a tensor-parallel LM (TransformerLayer::SetTensorParallel,
// the embedding's rows and the softmax's classes) is split along: its name says which projection.
inline int64_t ModelSplitDim(const std::string& name, int64_t whole_dims) {
  if (name.ends_with("emb/emb_var") || name.ends_with("softmax/bias_0")) return 0;  // the vocab
  if (name.ends_with("softmax/weight_0")) return 1;
  if (name.find("/fc1/w") != std::string::npos) return 0;  // row-parallel
  if (name.find("/fc0/") != std::string::npos) return whole_dims - 1;  // columns (and bias)
  if (name.ends_with("/b")) return 0;                       // [N, H] of a q/k/v projection
  return 1;                                                 // [D, N, H]: the heads
}

}  // namespace glossa
