// Training a model in a logdir: what `glossa train` and Python's glossa.train both call.
//
//   TrainOptions o;
//   o.executor.logdir = "/tmp/lm";
//   o.max_steps = 100;
//   const int64_t step = Train(GetModelParams("lm.austen.TransformerLmTiny", "Train"), o);
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "glossa/core/params.h"
#include "glossa/runtime/executor.h"

namespace glossa {

struct TrainOptions {
  // The logdir, console, verbosity, eval datasets, data-parallel workers (executor.h).
  ExecutorOptions executor;
  // Overrides every task's train.max_steps.
  std::optional<int64_t> max_steps;
  // Configure the CPU runtime for the model (cpu_runtime.h; 0: the default layout); unset: it is
  // configured already (the CLI does so for every command).
  std::optional<int> intra_op_threads;
  // Called with the executor before it runs and with null after it returns or fails (a stop
  // signal reaches the run through it).
  std::function<void(Executor*)> on_executor;
};

// Checks the Params (a model's: SingleTaskModel or MultiTaskModel; every dataset the program
// schedule evaluates given in options.executor.dataset_params), then trains to max_steps or a stop
// request. Returns the final global step. InvalidArgument for what cannot start.
int64_t Train(const Params& model_params, TrainOptions options);

}  // namespace glossa
