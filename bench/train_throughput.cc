// Training throughput of the Transformer LM task (glossa/tasks/lm/transformer_lm.h), or with
// --task=mt of the encoder-decoder mt::TransformerModel (glossa/tasks/mt/mt.h: source and target of
// --seq tokens, num_layers each side, tokens/s counting target tokens), on random tokens:
// tokens/s, median over runs, in fp32 or with bf16 compute (fprop_dtype bfloat16); or, with
// --gemm, the best GEMM rate (2048² matmul, or --gemm_shape=MxKxN) this machine reaches in fp32, or
// with --dtype=bf16 in bf16 (each in its thread layout; bf16 also through Glossa's Affine,
// kernels/gemm.h). Run by train_throughput.sh beside the same model in PyTorch
// (train_throughput.py).
//   bench_train_throughput --model_dim=512 --num_layers=6 --seq=256 --batch=8 --vocab=8000
//   --dtype=fp32
// Started as data-parallel workers (WORLD_SIZE, RANK, MASTER_PORT, LOCAL_WORLD_SIZE in the
// environment, as bench/distributed.sh does), each rank trains on batch / world of the global
// batch with gradients averaged by DataParallelGradientSync (--bucket_mb, --overlap); rank 0
// prints the global tokens/s and the allreduce's bytes and exposed time per step. With
// --count_ops: one step's op counts (dispatcher calls, outermost calls by name, autograd nodes)
// instead of timings. With --profile_ops: where `steps` steps' time goes (inclusive times by op
// and autograd node, and the page faults per step); GLOSSA_PROFILE_SHAPES=<op> adds a line per
// call of that op (its inputs' sizes and strides, its time and its page faults).
// With --peak_beside (train_throughput.sh sets it), each timed run is followed by a short
// measurement of the row's own GEMM peak (2048² matmul in its dtype: OpenBLAS's fp32, or the
// faster of oneDNN's bf16 and Glossa's native one), and the median over runs of the run's FLOP
// rate over that peak is printed as own_peak_fraction: on a VM whose speed moves ~2x between
// invocations a peak measured minutes apart is in another state than the run it divides.
// With --gemm_model (the LM task): the step's GEMMs alone at the model's shapes (each projection
// and the logits, forward x·w and backward dy·wᵀ and xᵀ·dy, batch·seq rows, on ATen's mm in the
// dtype, in bf16 also on Glossa's native projection GEMM, the faster), their FLOP rate against the
// 2048² peak measured beside them: a bound on the step's fraction of that peak, whatever else the
// step does; and the tokens/s of a step that did nothing but those GEMMs (a bound on its rate).
// With --gemm_in_step (fp32, with --gemm_split=aten): the same GEMMs as they run inside the step
// (every ATen mm/addmm of a float32 projection, forward and backward, timed where it is called),
// and the tokens/s of a step that did nothing but them. Their operands come from memory, not from
// a cache warmed by the call before, so this is the bound a step on these GEMMs meets; on a
// 2-core Xeon it was 15-25% below --gemm_model's.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "glossa/kernels/gemm.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/core/step_seed.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/mt/mt.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/optim/learner.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"
#include "glossa/runtime/blas_kernels.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/gradient_sync.h"
#include "glossa/runtime/mesh.h"
#include "bench/bench_util.h"

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

}  // namespace

int main(int argc, char** argv) {
  using glossa::bench::Now;
  glossa::UseBestBlasKernels(argv);
  using namespace glossa;
  auto f = bench::ParseFlags(argc, argv,
                             {{"model_dim", "128"},
                              {"num_layers", "2"},
                              {"num_heads", "4"},
                              {"hidden_dim", "0"},
                              {"vocab", "2000"},
                              {"seq", "128"},
                              {"batch", "16"},
                              {"steps", "10"},
                              {"runs", "3"},
                              {"max_warmup", "8"},
                              {"dtype", "fp32"},
                              {"threads", "0"},
                              {"gemm", "0"},
                              {"gemm_shape", "2048x2048x2048"},
                              {"peak_beside", "0"},
                              {"gemm_model", "0"},
                              {"bf16_kernels", "measure"},
                              {"gemm_split", "measure"},
                              {"row_kernels", "measure"},
                              {"task", "lm"},
                              {"bucket_mb", "25"},
                              {"overlap", "1"},
                              {"count_ops", "0"},
                              {"profile_ops", "0"},
                              {"gemm_in_step", "0"}},
                             /*bare_means_true=*/true);
  const auto layout = ConfigureCpuRuntime(std::stoi(f["threads"]), f["dtype"] == "bf16");
  SetKernelMode(KernelChoice::kBf16, ParseKernelMode(f["bf16_kernels"], "--bf16_kernels"));
  SetKernelMode(KernelChoice::kGemmSplit, ParseKernelMode(f["gemm_split"], "--gemm_split"));
  // In training: the attention core's per-head GEMMs (BLAS sgemm or Glossa's small-GEMM kernel).
  SetKernelMode(KernelChoice::kRowKernel, ParseKernelMode(f["row_kernels"], "--row_kernels"));
  const int runs = std::stoi(f["runs"]);
  if (f["gemm"] == "1") {
    // The GEMM peak of the dtype's thread layout: fp32 (OpenBLAS) or bf16 (oneDNN).
    const bool bf16 = f["dtype"] == "bf16";
    int64_t gm = 0, gk = 0, gn = 0;
    if (std::sscanf(f["gemm_shape"].c_str(), "%ldx%ldx%ld", &gm, &gk, &gn) != 3 || gm <= 0 ||
        gk <= 0 || gn <= 0) {
      std::fprintf(stderr, "--gemm_shape must be MxKxN with positive sizes, got '%s'\n",
                   f["gemm_shape"].c_str());
      return 2;
    }
    const double flops = 2.0 * gm * gk * gn;
    at::Tensor a = at::randn({gm, gk}), b = at::randn({gk, gn});
    if (bf16) {
      a = a.to(at::kBFloat16);
      b = b.to(at::kBFloat16);
    }
    // A peak is the best rate the machine sustains: the fastest of at least 15 windows of 5
    // calls. On a shared VM a median of a few windows moved by 2x between runs (bench/README.md,
    // Zen 5), and a low peak inflates every row's fraction of it.
    at::mm(a, b);
    const int windows = std::max(runs, 15);
    double best = 0;
    for (int r = 0; r < windows; ++r) {
      const double t0 = Now();
      for (int i = 0; i < 5; ++i) at::mm(a, b);
      best = std::max(best, 5 * flops / (Now() - t0) / 1e9);
    }
    std::printf("gemm_%s_gflops %.1f\n", bf16 ? "bf16" : "fp32", best);
    if (bf16) {
      // Glossa's native bf16 path (kernels/gemm.h): float32 sgemms of the widened values,
      // widening and rounding included; Affine runs it where it measures faster than oneDNN's.
      at::NoGradGuard no_grad;
      Bf16AffineNative(a, b, at::Tensor());
      double own = 0;
      for (int r = 0; r < windows; ++r) {
        const double t0 = Now();
        for (int i = 0; i < 5; ++i) Bf16AffineNative(a, b, at::Tensor());
        own = std::max(own, 5 * flops / (Now() - t0) / 1e9);
      }
      std::printf("gemm_bf16_glossa_gflops %.1f via native_float32_sgemm\n", own);
    }
    return 0;
  }
  const int64_t d = std::stoll(f["model_dim"]), layers = std::stoll(f["num_layers"]);
  const int64_t hidden = std::stoll(f["hidden_dim"]) > 0 ? std::stoll(f["hidden_dim"]) : 4 * d;
  const int64_t vocab = std::stoll(f["vocab"]), seq = std::stoll(f["seq"]),
                batch = std::stoll(f["batch"]);
  const int steps = std::stoi(f["steps"]);
  const bool mt = f["task"] == "mt";
  if (!mt && f["task"] != "lm") {
    std::fprintf(stderr, "--task must be lm or mt\n");
    return 2;
  }
  Params tp = mt ? mt::TransformerModel::CommonParams(vocab, d, hidden, std::stoll(f["num_heads"]),
                                                      layers)
                 : TransformerLmTask::CommonParams(vocab, d, hidden, std::stoll(f["num_heads"]),
                                                   layers);
  tp.Set("name", mt ? "mt" : "lm").Set("random_seed", 1);
  if (f["dtype"] == "bf16") {
    tp.Set("fprop_dtype", DType::kBFloat16);
  } else if (f["dtype"] != "fp32") {
    std::fprintf(stderr, "--dtype must be fp32 or bf16\n");
    return 2;
  }
  tp.Set("train.learner.learning_rate", 1e-4);
  tp.Set("train.learner.lr_schedule", ConstantSchedule::Params());
  tp.Set("train.learner.optimizer",
         Adam::Params().Set("beta1", 0.9).Set("beta2", 0.98).Set("epsilon", 1e-9));
  Params mp = SingleTaskModel::Params();
  mp.Set("name", "model");
  mp.Set("task", tp);
  auto model = InstantiateLayer<SingleTaskModel>(mp);
  BaseTask& task = model->task();
  const auto vars = LearnerVariables(*model);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor ids = at::randint(3, vocab, {batch, seq}, gen);
  NestedMap b{{"ids", ids}, {"labels", ids.roll(-1, 1)}, {"paddings", at::zeros({batch, seq})}};
  if (mt) {
    b = NestedMap();
    b.Set("src.ids", at::randint(3, vocab, {batch, seq}, gen));
    b.Set("src.paddings", at::zeros({batch, seq}));
    b.Set("tgt.ids", ids);
    b.Set("tgt.labels", ids.roll(-1, 1));
    b.Set("tgt.paddings", at::zeros({batch, seq}));
    b.Set("tgt.weights", at::ones({batch, seq}));
  }
  std::unique_ptr<Distributed> dist;
  std::shared_ptr<DataParallelGradientSync> sync;
  if (auto o = DistributedOptionsFromEnv(); o && o->world_size > 1) {
    dist = std::make_unique<Distributed>(*o);
    if (batch % o->world_size != 0) {
      std::fprintf(stderr, "--batch=%lld does not divide among %d workers\n",
                   static_cast<long long>(batch), o->world_size);
      return 2;
    }
    // This rank's rows of the global batch.
    const int64_t share = batch / o->world_size, from = share * o->rank;
    b = b.Transform([&](const NestedValue& v) -> NestedValue {
      return v.AsTensor().slice(0, from, from + share).contiguous();
    });
    std::vector<at::Tensor> values;
    for (const auto& v : vars) values.push_back(v.value);
    dist->Broadcast(values);
    sync = std::make_shared<DataParallelGradientSync>(
        *dist, static_cast<int64_t>(std::stod(f["bucket_mb"]) * (1 << 20)), f["overlap"] == "1");
    task.learner().SetGradientSync(sync);
  }
  int64_t step = 0;
  double fprop_seconds = 0;  // the forward's share of the steps (--profile_ops)
  auto train_step = [&] {
    GlobalStepContext ctx(step);
    const double f0 = Now();
    auto r = task.FPropDefaultTheta(b);
    fprop_seconds += Now() - f0;
    // As the trainer's steps between summaries: no var_norm/all pass.
    task.learner().Apply(
        {{task.learner().loss_name(), Metric{r.loss, r.metrics.at("loss").weight}}}, vars, step,
        /*var_norm=*/false);
    ++step;
  };
  // Warm-up: the slots, the kernel choices, the allocator. The heap grows over the first steps,
  // and every new page is a page fault: on the 512 LM, 84,000 in the first step and 62,000 in the
  // second, then a few hundred now and then (a Zen 5 VM, 2026-12-07). Steps run until one takes
  // under 256 (1 MiB of new pages), at most --max_warmup, so that no timed run holds the second
  // step; the Python peer keeps the same rule. Ranks of a distributed run warm up one step (they
  // must run the same steps).
  int warmup_steps = 0;
  for (;;) {
    const long faults_before = MinorFaults();
    train_step();
    ++warmup_steps;
    if (dist || MinorFaults() - faults_before < 256 ||
        warmup_steps >= std::stoi(f["max_warmup"])) {
      break;
    }
  }
  if (f["count_ops"] == "1") {
    bench::PrintOpCounts(train_step, "step");
    return 0;
  }
  if (f["gemm_in_step"] == "1") {
    // The projections' GEMMs as they run in the step: each ATen mm/addmm inside a float32
    // projection (forward scope or backward node), timed on the calling thread over `steps` steps.
    if (f["dtype"] != "fp32" || f["gemm_split"] != "aten") {
      std::fprintf(stderr, "--gemm_in_step=1 needs --dtype=fp32 --gemm_split=aten (the "
                           "projections' GEMMs on ATen's mm, on the calling thread)\n");
      return 2;
    }
    static thread_local int inside = 0;             // depth of Fp32Affine scopes
    static thread_local std::vector<double> starts;  // of the open GEMM calls
    static double gemm_seconds = 0;
    static int64_t gemm_calls = 0;
    auto handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
              const std::string n = fn.name();
              if (n.find("Fp32Affine") != std::string::npos) ++inside;
              if (inside > 0 && starts.empty() && (n == "aten::mm" || n == "aten::addmm")) {
                starts.push_back(Now());
              } else if (!starts.empty()) {
                starts.push_back(-1);  // nested in a timed GEMM: not timed again
              }
              return nullptr;
            },
            [](const at::RecordFunction& fn, at::ObserverContext*) {
              const std::string n = fn.name();
              if (!starts.empty()) {
                const double t0 = starts.back();
                starts.pop_back();
                if (t0 >= 0) {
                  gemm_seconds += Now() - t0;
                  ++gemm_calls;
                }
              }
              if (n.find("Fp32Affine") != std::string::npos) --inside;
            })
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                     at::RecordScope::USER_SCOPE}));
    const double t0 = Now();
    for (int s = 0; s < steps; ++s) train_step();
    const double total = Now() - t0;
    at::removeCallback(handle);
    std::printf("step_ms %.1f gemm_in_step_ms %.1f gemm_calls_per_step %.1f "
                "gemm_in_step_tokens_per_sec %.1f\n",
                1e3 * total / steps, 1e3 * gemm_seconds / steps,
                static_cast<double>(gemm_calls) / steps,
                static_cast<double>(steps * batch * seq) / gemm_seconds);
    return 0;
  }
  if (f["profile_ops"] == "1") {
    // Where a step's time goes: inclusive wall time of each outermost call (model, learner) and of
    // each autograd node (backward), by name, summed over `steps` steps.
    struct Entry {
      double t0;
      bool timed;
      bool shapes = false;  // GLOSSA_PROFILE_SHAPES's op: its time ends the line
      long faults = 0;      // and its minor page faults (the process's)
    };
    static thread_local std::vector<Entry> stack;
    struct Spent {
      double seconds = 0;
      int64_t calls = 0;
      long faults = 0;  // the process's minor page faults while the call ran
    };
    static std::map<std::string, Spent> spent;
    auto handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
              const bool node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
              bool timed = node || stack.empty();
              if (!node) {
                for (const auto& e : stack) timed = timed && !e.timed;
              }
              // GLOSSA_PROFILE_ALL=1: every op at every depth (inclusive times overlap).
              static const bool all = std::getenv("GLOSSA_PROFILE_ALL") != nullptr;
              timed = timed || all;
              stack.push_back({Now(), timed});
              stack.back().faults = MinorFaults();
              // GLOSSA_PROFILE_SHAPES=<op name>: each call's input sizes and strides, and its time.
              static const char* shapes_of = std::getenv("GLOSSA_PROFILE_SHAPES");
              if (shapes_of != nullptr && fn.name() == std::string(shapes_of)) {
                std::string line;
                for (const auto& v : fn.inputs()) {
                  if (!v.isTensor() || !v.toTensor().defined()) continue;
                  const at::Tensor& t = v.toTensor();
                  line += " " + c10::str(t.sizes()) + "/" + c10::str(t.strides());
                }
                std::printf("  %s inputs (sizes/strides):%s", shapes_of, line.c_str());
                stack.back().shapes = true;
              }
              return nullptr;
            },
            [](const at::RecordFunction& fn, at::ObserverContext*) {
              const Entry e = stack.back();
              stack.pop_back();
              if (e.shapes) {
                std::printf(" %.3f ms, %ld page faults\n", 1e3 * (Now() - e.t0),
                            MinorFaults() - e.faults);
              }
              if (e.timed) {
                auto& s = spent[(fn.scope() == at::RecordScope::BACKWARD_FUNCTION ? "bwd:" : "") +
                                std::string(fn.name())];
                s.seconds += Now() - e.t0;
                ++s.calls;
                s.faults += MinorFaults() - e.faults;
              }
            })
            .needsInputs(std::getenv("GLOSSA_PROFILE_SHAPES") != nullptr)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                     at::RecordScope::USER_SCOPE}));
    const double t0 = Now();
    fprop_seconds = 0;
    const long faults0 = MinorFaults();
    for (int s = 0; s < steps; ++s) train_step();
    const double total = Now() - t0;
    const double faults = static_cast<double>(MinorFaults() - faults0) / steps;
    at::removeCallback(handle);
    std::vector<std::pair<double, std::string>> top;
    double covered = 0;
    for (const auto& [name, v] : spent) {
      top.emplace_back(v.seconds, name);
      covered += v.seconds;
    }
    std::sort(top.rbegin(), top.rend());
    std::printf("ms_per_step %.2f fprop_ms_per_step %.2f timed_ms_per_step %.2f "
                "page_faults_per_step %.0f\n",
                1e3 * total / steps, 1e3 * fprop_seconds / steps, 1e3 * covered / steps, faults);
    // GLOSSA_PROFILE_TOP=n: the n largest (40).
    const char* top_n = std::getenv("GLOSSA_PROFILE_TOP");
    for (size_t i = 0; i < std::min<size_t>(top.size(), top_n ? std::atoi(top_n) : 40); ++i) {
      const Spent& s = spent[top[i].second];
      std::printf("  %8.3f ms %6.1f/step %7.0f faults/step %s\n", 1e3 * s.seconds / steps,
                  static_cast<double>(s.calls) / steps, static_cast<double>(s.faults) / steps,
                  top[i].second.c_str());
    }
    return 0;
  }
  if (f["gemm_model"] == "1" && !mt) {
    at::NoGradGuard no_grad;
    const at::ScalarType dt = f["dtype"] == "bf16" ? at::kBFloat16 : at::kFloat;
    const int64_t rows = batch * seq;
    struct G {
      int64_t k, n, count;
    };
    const G gemms[] = {{d, 3 * d, layers}, {d, d, layers}, {d, hidden, layers},
                       {hidden, d, layers}, {d, vocab, 1}};
    // The best of 5 calls; in bf16, of ATen's mm and Glossa's native projection GEMM, as the
    // step's measured kernel choice may take either.
    auto time_mm = [&](const at::Tensor& a, const at::Tensor& b) {
      double best = 1e30;
      for (const bool native : {false, true}) {
        if (native && dt != at::kBFloat16) break;
        auto call = [&] { return native ? Bf16AffineNative(a, b, at::Tensor()) : at::mm(a, b); };
        call();
        for (int w = 0; w < 5; ++w) {
          const double t0 = Now();
          call();
          best = std::min(best, Now() - t0);
        }
      }
      return best;
    };
    double seconds = 0, gflop = 0;
    for (const G& g : gemms) {
      const at::Tensor x = at::randn({rows, g.k}).to(dt), w = at::randn({g.k, g.n}).to(dt),
                       dy = at::randn({rows, g.n}).to(dt);
      const double t = time_mm(x, w) + time_mm(dy, w.t()) + time_mm(x.t(), dy);
      seconds += g.count * t;
      gflop += g.count * 3 * 2.0 * rows * g.k * g.n / 1e9;
    }
    const at::Tensor a = at::randn({2048, 2048}).to(dt), b = at::randn({2048, 2048}).to(dt);
    const double peak = 2.0 * 2048 * 2048 * 2048 / time_mm(a, b) / 1e9;
    std::printf("model_gemm_ms_per_step %.1f model_gemm_gflops %.1f gemm_2048_gflops %.1f "
                "fraction %.3f model_gemm_tokens_per_sec %.1f\n",
                1e3 * seconds, gflop / seconds, peak, gflop / seconds / peak,
                static_cast<double>(rows) / seconds);
    return 0;
  }
  // The row's GEMM peak now (see --peak_beside): the fastest of 4 windows of 3 2048² matmuls.
  const bool peak_beside = f["peak_beside"] == "1";
  auto peak_now = [&] {
    at::NoGradGuard no_grad;
    const bool bf16 = f["dtype"] == "bf16";
    at::Tensor a = at::randn({2048, 2048}), b = at::randn({2048, 2048});
    if (bf16) {
      a = a.to(at::kBFloat16);
      b = b.to(at::kBFloat16);
    }
    double best = 0;
    for (const bool native : {false, true}) {
      if (native && !bf16) break;
      auto call = [&] { return native ? Bf16AffineNative(a, b, at::Tensor()) : at::mm(a, b); };
      call();
      for (int w = 0; w < 4; ++w) {
        const double t0 = Now();
        for (int i = 0; i < 3; ++i) call();
        best = std::max(best, 3 * 2.0 * 2048 * 2048 * 2048 / (Now() - t0) / 1e9);
      }
    }
    return best;
  };
  std::vector<double> rates, peaks;
  for (int r = 0; r < runs; ++r) {
    const double t0 = Now();
    for (int s = 0; s < steps; ++s) train_step();
    rates.push_back(static_cast<double>(steps * batch * seq) / (Now() - t0));
    if (peak_beside) peaks.push_back(peak_now());
  }
  // Training FLOPs per token: 6 x matmul parameters (attention projections, feed-forward, softmax)
  // + 12 x layers x seq x d for the attention scores and their use.
  // (mt, per target token: the encoder's layers on one source token, the decoder's with
  // cross-attention, 4 d² more per layer, and both sides' attention.)
  const double flops =
      mt ? 6.0 * static_cast<double>(layers * (4 * d * d + 2 * d * hidden) +
                                     layers * (8 * d * d + 2 * d * hidden) + d * vocab) +
               12.0 * static_cast<double>(3 * layers * seq * d)
         : 6.0 * static_cast<double>(layers * (4 * d * d + 2 * d * hidden) + d * vocab) +
               12.0 * static_cast<double>(layers * seq * d);
  if (dist && dist->rank() != 0) return 0;
  std::printf(
      "glossa_tokens_per_sec %.1f flops_per_token %.0f aten_threads %d blas_threads %d "
      "blas_core %s warmup_steps %d\n",
      Median(rates), flops, layout.aten_threads, layout.blas_threads, BlasCoreName(),
      warmup_steps);
  if (peak_beside) {
    std::vector<double> fractions;
    for (size_t r = 0; r < rates.size(); ++r) fractions.push_back(rates[r] * flops / 1e9 / peaks[r]);
    std::printf("own_peak_gflops %.1f own_peak_fraction %.3f\n", Median(peaks), Median(fractions));
  }
  bench::PrintKernelChoices();
  if (sync) {
    const auto st = sync->stats();
    std::printf("allreduce_mb_per_step %.2f exposed_ms_per_step %.2f buckets_per_step %.1f "
                "early_fraction %.2f\n",
                st.bytes / 1e6 / st.steps, 1e3 * st.exposed_seconds / st.steps,
                static_cast<double>(st.buckets) / st.steps,
                st.buckets ? static_cast<double>(st.early_buckets) / st.buckets : 0.0);
  }
  return 0;
}
