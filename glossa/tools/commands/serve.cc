// `glossa serve`: an inference bundle over HTTP/JSON (glossa/inference/server.h) until SIGTERM or
// SIGINT, which stop accepting, finish the requests in flight and exit 0.
#include <CLI/CLI.hpp>
#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/inference/predictor.h"
#include "glossa/inference/server.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

struct ServeFlags {
  std::string bundle, checkpoint, port_file;
  std::vector<std::string> subgraphs;
  ServeOptions options;
  int64_t port = 0, max_batch_size = 32, batch_timeout_micros = 0, max_enqueued = 256;
  int64_t batch_threads = 0, max_body_bytes = 4 << 20, intra_op_threads = 0;
  int64_t max_input_tokens = 4096, max_new_tokens = 512;
  int64_t max_connections = 512, max_connections_per_client = 128;
  double header_timeout_secs = 10, body_timeout_secs = 60, request_timeout_secs = 60;
  bool no_batching = false;
  bool no_continuous_batching = false;
  bool batch_invariant = true;
  std::string precision;
  KernelFlags kernels;
};


int Serve(ServeFlags& f) {
  // Block the stop signals in every thread; this one waits for them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  CheckIntraOpThreads(f.intra_op_threads);
  ApplyKernelFlags(f.kernels);
  // Replicas x threads from the cores (glossa/runtime/cpu_runtime.h), decided here, printed below.
  const ServingLayout layout = ChooseServingLayout(ProcessCores(), static_cast<int>(f.batch_threads),
                                                   static_cast<int>(f.intra_op_threads));
  ApplyServingLayout(layout, ConfigureCpuRuntime(0, false, CpuWorkload::kInference));
  PredictorOptions po;
  po.subgraphs = f.subgraphs;
  po.checkpoint = f.checkpoint;
  po.max_input_tokens = f.max_input_tokens;
  po.max_new_tokens = f.max_new_tokens;
  po.max_batch_size = f.max_batch_size;  // a request of more examples is 400 (docs/inference.md)
  po.batch_invariant = f.batch_invariant;
  po.precision = f.precision;
  Predictor predictor(f.bundle, po);
  ServeOptions& o = f.options;
  o.connection_limits = {.max_connections = f.max_connections,
                         .max_connections_per_client = f.max_connections_per_client,
                         .header_timeout_secs = f.header_timeout_secs,
                         .body_timeout_secs = f.body_timeout_secs};
  o.port = static_cast<int>(f.port);
  o.enable_batching = !f.no_batching;
  o.continuous_batching = !f.no_continuous_batching;
  o.max_batch_size = f.max_batch_size;
  o.batch_timeout_micros = f.batch_timeout_micros;
  o.max_enqueued_requests = f.max_enqueued;
  o.num_batch_threads = layout.replicas;
  o.max_body_bytes = static_cast<size_t>(f.max_body_bytes);
  o.request_timeout_secs = f.request_timeout_secs;
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  std::cout << "serving " << f.bundle << " (global step " << predictor.global_step()
            << ") on http://" << o.host << ":" << port << std::endl;
  std::cout << "compute: " << predictor.policy().ToString() << " (" << predictor.prepared_weights()
            << " weights prepared at load)" << std::endl;
  for (const std::string& note : predictor.plan_notes()) std::cout << "compute: " << note << std::endl;
  std::cout << "layout: " << layout.ToString()
            << (o.enable_batching ? "" : "; without batching each request runs on its connection's thread")
            << std::endl;
  const std::vector<std::string> continuous = server.ContinuousSubgraphs();
  if (!continuous.empty()) {
    std::cout << "continuous batching: " << Join(continuous, ", ")
              << " (requests join a running decoding batch at every step; POST "
                 "/v1/subgraphs/NAME:stream streams their tokens)" << std::endl;
  }
  if (!f.port_file.empty()) {  // written whole, then renamed: a reader never sees half of it
    const std::string tmp = f.port_file + ".tmp";
    {
      std::ofstream pf(tmp, std::ios::trunc);
      pf << port << "\n";
      if (!pf) throw AbortedError(StrCat("--port_file: cannot write '", tmp, "'"));
    }
    if (std::rename(tmp.c_str(), f.port_file.c_str()) != 0) {
      throw AbortedError(StrCat("--port_file: cannot rename '", tmp, "' to '", f.port_file, "'"));
    }
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cout << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
            << ": finishing the requests in flight" << std::endl;
  server.Stop();
  std::cout << "stopped" << std::endl;
  return 0;
}

class ServeCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand(
        "serve", "Serve an inference bundle over HTTP/JSON with dynamic batching (docs/inference.md).");
    ServeFlags& f = f_;
    c->add_option("--bundle", f.bundle, "The bundle directory (glossa export).")->required();
    AddKernelFlags(c, f.kernels);
    c->add_option("--host", f.options.host, "The address to listen on.")->capture_default_str();
    AddIntFlag(c, "--port", f.port, 0, 65535, "The port (0: a free one, printed).");
    c->add_option("--port_file", f.port_file, "Write the port to this file once listening.");
    c->add_option("--subgraphs", f.subgraphs,
                  "Subgraphs to serve, comma-separated (default: all the bundle has).")
        ->delimiter(',');
    c->add_option("--checkpoint", f.checkpoint,
                  "Serve this training checkpoint's weights instead of the bundle's.");
    c->add_option("--watch_logdir", f.options.watch_logdir,
                  "Reload the latest checkpoint of <dir>/train whenever it changes.");
    c->add_option("--watch_interval_secs", f.options.watch_interval_secs,
                  "How often to look at --watch_logdir.")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 86400.0));
    c->add_flag("--no_batching", f.no_batching,
                "Run each request alone on its connection's thread (no dynamic batching).");
    c->add_flag("--no_continuous_batching", f.no_continuous_batching,
                "Generation subgraphs batch as the others do, instead of a running decoding "
                "batch that requests join at every step (and :stream is refused).");
    c->add_flag("--batch_invariant,!--no_batch_invariant", f.batch_invariant,
                "Batch-invariant kernels (default on): a request's answer has the same bits "
                "alone or in any batch, at any thread count.");
    c->add_option("--precision", f.precision,
                  "float32, int8 (weights quantized per output channel at load) or bf16 "
                  "(weights rounded to bf16 at load, float32 activations); default: the "
                  "bundle's (int8 or bf16 when exported with --quantize=int8 or bf16).")
        ->check(CLI::IsMember({"float32", "int8", "bf16"}));
    DefineLimits(c);
    return c;
  }

  int Run(const CommandContext&) override { return Serve(f_); }

 private:
  void DefineLimits(CLI::App* c) {
    ServeFlags& f = f_;
    AddIntFlag(c, "--max_batch_size", f.max_batch_size, 1, 4096,
               "Most examples merged into one run.");
    AddIntFlag(c, "--batch_timeout_micros", f.batch_timeout_micros, 0, 3600000000,
               "How long the first request of a batch waits for others.");
    AddIntFlag(c, "--max_enqueued_requests", f.max_enqueued, 1, 1000000,
               "Requests that may wait for a batch; more are answered 503.");
    AddIntFlag(c, "--num_batch_threads", f.batch_threads, 0, 256,
               "Replicas: batches of a subgraph run at once, each on its own thread over the one "
               "copy of the weights (0: one per core, or cores / --intra_op_threads).");
    AddIntFlag(c, "--max_new_tokens", f.max_new_tokens, 0, 1 << 20,
               "A generation request asking for more new tokens is answered 400 (default 512).");
    AddIntFlag(c, "--max_connections", f.max_connections, 1, 1 << 16,
               "Open connections in all (default 512): more are answered 503 and closed.");
    AddIntFlag(c, "--max_connections_per_client", f.max_connections_per_client, 1, 1 << 16,
               "Open connections per client address (default 128): more are answered 503 and "
               "closed.");
    c->add_option("--header_timeout_secs", f.header_timeout_secs,
                  "A request's header must arrive within this many seconds of the connection's "
                  "open or previous answer, in total.")
        ->capture_default_str()
        ->check(CLI::Range(0.1, 3600.0));
    c->add_option("--body_timeout_secs", f.body_timeout_secs,
                  "A request's body must arrive within this many seconds of its header.")
        ->capture_default_str()
        ->check(CLI::Range(0.1, 3600.0));
    c->add_option("--request_timeout_secs", f.request_timeout_secs,
                  "A :run request not answered within this many seconds of its body is "
                  "answered 503 and its thread freed; one still waiting for a batch is dropped "
                  "unrun (0: no limit; with --no_batching a run is not cut short).")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 86400.0));
    AddIntFlag(c, "--max_body_bytes", f.max_body_bytes, 1, int64_t{1} << 31,
               "Larger request bodies are answered 413.");
    AddIntFlag(c, "--max_input_tokens", f.max_input_tokens, 1, int64_t{1} << 24,
               "Longer inputs are answered 400.");
    AddIntFlag(c, "--intra_op_threads", f.intra_op_threads, 0, 1024,
               "Threads per replica: ATen's, OpenBLAS's and Glossa's kernel threads (0: cores / "
               "replicas, at least 1).");
  }

  ServeFlags f_;
};
GLOSSA_REGISTER_COMMAND(ServeCommand, 90);

}  // namespace
}  // namespace cli
}  // namespace glossa
