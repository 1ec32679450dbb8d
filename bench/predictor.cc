// Predictor LM scoring throughput: Glossa's Predictor (strings in: tokenization, the network and
// the fetches included) scoring Austen sentences in batches of --batch, tokens/s median over runs.
// Run by predictor_throughput.sh beside the same network in PyTorch eager (predictor_throughput.py),
// which reads the bundle's weights and the ids this program writes.
//   bench_predictor --workdir=/tmp/glossa_bench_predictor --sentences=200 --batch=1 --runs=3
// --precision=int8 (or --int8=1) or bf16 runs the same checkpoint exported with
// --quantize=int8 or bf16 (<workdir>/bundle_int8, bundle_bf16).
// --count_ops=1 prints the ATen ops of one batch through the network alone instead of timings.
// The first run trains lm.austen.TransformerLmTiny one step and exports <workdir>/bundle (with
// --onnx: onnx/lm_score.onnx, which ONNX Runtime runs on the batches written to
// <workdir>/onnx_feeds_b<batch>.jsonl, the same ids and paddings the network alone gets).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "glossa/base/file.h"
#include "glossa/inference/bundle.h"
#include "glossa/inference/predictor.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/runtime/executor.h"
#include "glossa/checkpoint/saver.h"
#include "glossa/runtime/blas_kernels.h"
#include "bench/bench_util.h"

int main(int argc, char** argv) {
  using glossa::bench::Now;
  glossa::UseBestBlasKernels(argv);
  using namespace glossa;
  auto f = bench::ParseFlags(argc, argv,
                             {{"workdir", "/tmp/glossa_bench_predictor"},
                              {"sentences", "200"},
                              {"batch", "1"},
                              {"runs", "3"},
                              {"threads", "0"},
                              {"batch_invariant", "0"},
                              {"int8", "0"},
                              {"precision", "float32"},
                             {"count_ops", "0"},
                              {"row_kernels", "measure"}});
  const std::string work = f["workdir"];
  const int64_t num_sentences = std::stoll(f["sentences"]), batch = std::stoll(f["batch"]);
  const int runs = std::stoi(f["runs"]);
  // --row_kernels=measure|aten|native: how short inputs are projected (kernel_choice.h).
  SetKernelMode(KernelChoice::kRowKernel, ParseKernelMode(f["row_kernels"], "--row_kernels"));
  ConfigureCpuRuntime(std::stoi(f["threads"]), false, CpuWorkload::kInference);
  // --batch_invariant=1: the kernels glossa serve runs (a batch-invariant plan,
  // glossa/kernels/compute_plan.h).
  const bool invariant = f["batch_invariant"] == "1";
  // --precision=int8|bf16 (--int8=1: int8): the same checkpoint exported with --quantize=int8 or
  // bf16 (<workdir>/bundle_int8, bundle_bf16).
  const std::string precision = f["int8"] == "1" ? "int8" : f["precision"];
  const bool quantized = ParsePrecision(precision, "--precision") != Precision::kFloat32;
  const std::string bundle = JoinPath(work, quantized ? "bundle_" + precision : "bundle");
  const Params dev = GetModelParams("lm.austen.TransformerLmTiny", "Dev",
                                    "random_seed : 1\ntask.random_seed : 1\n");
  const std::string logdir = JoinPath(work, "lm");
  if (!FileExists(JoinPath(work, "bundle/onnx/lm_score.onnx"))) {
    std::filesystem::remove_all(JoinPath(work, "bundle"));
    std::filesystem::remove_all(JoinPath(work, "bundle_int8"));
    std::filesystem::remove_all(JoinPath(work, "bundle_bf16"));
    std::filesystem::remove_all(logdir);
    Executor(GetModelParams("lm.austen.TransformerLmTiny", "Train",
                            "random_seed : 1\ntask.random_seed : 1\ntask.train.max_steps : 1\n"
                            "task.train.steps_per_loop : 1\n"),
             {.logdir = logdir, .log = [](const std::string&) {}})
        .Run();
    ExportBundle({.model_params = dev,
                  .checkpoint = *Saver::LatestCheckpoint(JoinPath(logdir, "train")),
                  .out_dir = JoinPath(work, "bundle"),
                  .onnx = true});
  }
  if (quantized && !FileExists(JoinPath(bundle, "MANIFEST.json"))) {
    std::filesystem::remove_all(bundle);
    ExportBundle({.model_params = dev,
                  .checkpoint = *Saver::LatestCheckpoint(JoinPath(logdir, "train")),
                  .out_dir = bundle,
                  .quantize = precision});
  }
  // Sentences: the first non-empty lines of the Dev text.
  std::string pattern = dev.GetString("task.input.file_pattern");
  pattern = pattern.substr(pattern.find(':') + 1);
  std::ifstream in(pattern);
  std::vector<std::string> sentences;
  for (std::string line; std::getline(in, line) && static_cast<int64_t>(sentences.size()) <
                                                        num_sentences;) {
    if (!line.empty()) sentences.push_back(line);
  }
  PredictorOptions po;
  po.batch_invariant = invariant;
  Predictor predictor(bundle, po);
  auto pass = [&](std::vector<glossa::InferenceMap>* outs) {
    int64_t tokens = 0;
    for (size_t i = 0; i < sentences.size(); i += batch) {
      std::vector<std::string> b(sentences.begin() + i,
                                 sentences.begin() + std::min(sentences.size(), i + batch));
      InferenceMap out = predictor.Run("default", {{"text", InferenceValue::Strings(b)}});
      tokens += out.at("lengths").tensor.sum().item<int64_t>();
      if (outs) outs->push_back(std::move(out));
    }
    return tokens;
  };
  std::vector<InferenceMap> outs;
  pass(&outs);  // warm-up, and the ids and scores for the peer
  {
    std::ofstream text(JoinPath(work, "sentences.txt"), std::ios::trunc);
    for (const auto& s : sentences) text << s << "\n";
    std::ofstream ids(JoinPath(work, "ids.jsonl"), std::ios::trunc);
    for (const auto& out : outs) {
      const at::Tensor l = out.at("ids").tensor, n = out.at("lengths").tensor;
      for (int64_t r = 0; r < l.size(0); ++r) {
        const int64_t len = n[r].item<int64_t>();
        std::vector<int64_t> row(l[r].data_ptr<int64_t>(), l[r].data_ptr<int64_t>() + len);
        ids << nlohmann::json({{"ids", row},
                               {"total_log_prob", out.at("total_log_prob").tensor[r].item<double>()}})
                   .dump()
            << "\n";
      }
    }
  }
  // The network alone (ids and labels in, the labels' log-probs and their sums out: what
  // ONNX Runtime's lm_score.onnx computes), for where the time goes: its passes alternate with
  // the Predictor's so that drifts in the machine's speed hit both alike.
  LoadedBundle b = LoadBundle(bundle);
  auto& lm = dynamic_cast<TransformerLmTask&>(b.model->task());
  // The plan the Predictor made at load, for the network alone too.
  b.model->SetComputePlan(PlanInference(*b.model, predictor.policy()));
  struct NetworkInput {
    at::Tensor ids, labels, paddings;
  };
  std::vector<NetworkInput> inputs;
  int64_t total = 0;
  for (const auto& out : outs) {
    const at::Tensor labels = out.at("ids").tensor;
    const at::Tensor ids = at::cat({at::ones({labels.size(0), 1}, at::kLong),
                                    labels.slice(1, 0, labels.size(1) - 1)}, 1);
    const at::Tensor lengths = out.at("lengths").tensor;
    total += lengths.sum().item<int64_t>();
    inputs.push_back({ids, labels,
                      (at::arange(labels.size(1)).unsqueeze(0) >= lengths.unsqueeze(1))
                          .to(at::kFloat)});
  }
  {
    // The same batches for ONNX Runtime (bench/onnx/ort_run.js): ids, labels, paddings.
    std::ofstream feeds(JoinPath(work, "onnx_feeds_b" + std::to_string(batch) + ".jsonl"),
                        std::ios::trunc);
    auto field = [](const at::Tensor& t, const char* type) {
      const at::Tensor c = t.contiguous();
      nlohmann::json f = {{"type", type}, {"dims", c.sizes().vec()}};
      if (c.scalar_type() == at::kLong) {
        f["data"] = std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
      } else {
        f["data"] = std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
      }
      return f;
    };
    for (size_t i = 0; i < inputs.size(); ++i) {
      feeds << nlohmann::json({{"ids", field(inputs[i].ids, "int64")},
                               {"labels", field(inputs[i].labels, "int64")},
                               {"paddings", field(inputs[i].paddings, "float32")}})
                   .dump()
            << "\n";
    }
  }
  if (f["count_ops"] == "1") {
    // The ops of one batch through the network alone (--count_ops=1), nested ones included.
    at::NoGradGuard no_grad;
    EvalModeScope eval;
    const NestedMap theta = lm.theta();
    const NetworkInput& in = inputs[0];
    auto batch = [&] { (lm.LabelLogProbs(theta, in.ids, in.labels, in.paddings) * (1 - in.paddings)).sum(1); };
    batch();  // the steady state: what a first call makes once (the position table) is not counted
    bench::PrintOpCounts(batch, "batch");
    return 0;
  }
  std::vector<double> rates, net_rates;
  for (int r = 0; r < runs; ++r) {
    double t0 = Now();
    const int64_t tokens = pass(nullptr);
    rates.push_back(static_cast<double>(tokens) / (Now() - t0));
    at::NoGradGuard no_grad;
    EvalModeScope eval;
    const NestedMap theta = lm.theta();
    t0 = Now();
    // What ONNX Runtime's lm_score.onnx computes: each label's log-prob, masked, and their sum.
    for (const NetworkInput& in : inputs) {
      (lm.LabelLogProbs(theta, in.ids, in.labels, in.paddings) * (1 - in.paddings)).sum(1);
    }
    net_rates.push_back(static_cast<double>(total) / (Now() - t0));
  }
  std::sort(rates.begin(), rates.end());
  std::sort(net_rates.begin(), net_rates.end());

  std::printf(
      "glossa_tokens_per_sec %.1f network_only %.1f sentences %zu batch %lld blas_core %s "
      "tokens %lld\n",
      rates[rates.size() / 2], net_rates[net_rates.size() / 2], sentences.size(),
      static_cast<long long>(batch), BlasCoreName(), static_cast<long long>(total));
  bench::PrintKernelChoices();
  return 0;
}
