// Beam-search translation throughput: mt.bible.TransformerEnEsTiny restored from a trained logdir
// translates the first --sentences English verses of the Bible Test set with beam 4 in batches of
// --batch (fp32 compute, ids in: tokenization excluded), sentences/s and target tokens/s, median
// over --runs. Writes the source ids and the best hypotheses to <workdir> for the PyTorch eager
// peer (bench/beam_search.py), which runs the same model and search and compares its outputs.
//   bench_beam_search --logdir=runs/bible_tiny --workdir=/tmp/glossa_bench_beam --batch=1
// --precision=int8 (or --int8=1) runs the projections in int8, --precision=bf16 on the weights
// rounded to bf16 (what `glossa export --quantize=int8` or `bf16` bundles run), and writes
// glossa_hyps_int8.jsonl or glossa_hyps_bf16.jsonl. --fused=0 runs each decoder layer's step as the unfused
// composition of the layers' ExtendStep instead of one DecoderLayerStep
// (glossa/kernels/decoder_step.h), for the comparison in bench/README.md.
// --drop_finished_sources=0 keeps every sentence of a batch in the decoding batch until the last
// one finishes (beam_search.drop_finished_sources False), for the comparison in bench/README.md.
// --shortlist=FILE decodes with a vocabulary shortlist (`glossa shortlist`; task.shortlist_file)
// and writes glossa_hyps_shortlist.jsonl.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/input/input_generator.h"
#include "glossa/kernels/decoder_step.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/model/base_model.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/data_dir.h"
#include "glossa/tasks/mt/mt.h"
#include "glossa/checkpoint/checkpointer.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/checkpoint/saver.h"
#include "glossa/runtime/blas_kernels.h"
#include "bench/bench_util.h"

int main(int argc, char** argv) {
  using glossa::bench::Now;
  glossa::UseBestBlasKernels(argv);
  using namespace glossa;
  auto f = bench::ParseFlags(argc, argv,
                             {{"logdir", "runs/bible_tiny"},
                              {"workdir", "/tmp/glossa_bench_beam"},
                              {"sentences", "64"},
                              {"batch", "1"},
                              {"beam", "4"},
                              {"runs", "3"},
                              {"int8", "0"},
                              {"precision", "float32"},
                              {"fused", "1"},
                              {"drop_finished_sources", "1"},
                              {"shortlist", ""},
                              {"row_kernels", "measure"}});
  // --row_kernels=measure|aten|native: how short inputs are projected (kernel_choice.h).
  SetKernelMode(KernelChoice::kRowKernel, ParseKernelMode(f["row_kernels"], "--row_kernels"));
  ConfigureCpuRuntime(0, false, CpuWorkload::kInference);
  const int64_t n = std::stoll(f["sentences"]), batch = std::stoll(f["batch"]);
  const int64_t runs = std::stoll(f["runs"]);
  CreateDirectories(f["workdir"]);
  Params p = GetModelParams("mt.bible.TransformerEnEsTiny", "Test",
                            StrCat("task.fprop_dtype : float32\n"
                                   "task.decoder.beam_search.num_hyps_per_beam : ",
                                   f["beam"], "\ntask.decoder.beam_search.drop_finished_sources : ",
                                   f["drop_finished_sources"] == "0" ? "False" : "True",
                                   "\ntask.shortlist_file : '", f["shortlist"], "'"));
  auto model = InstantiateLayer<BaseModel>(p);
  const auto ckpt = Saver::LatestCheckpoint(JoinPath(f["logdir"], "train"));
  if (!ckpt) {
    std::fprintf(stderr, "no checkpoint in %s/train: train mt.bible.TransformerEnEsTiny first\n",
                 f["logdir"].c_str());
    return 1;
  }
  const int64_t step = RestoreForEval(LoadCheckpoint(*ckpt), *model, nullptr).value_or(0);
  auto& task = dynamic_cast<mt::TransformerModel&>(model->task());
  const auto& input = dynamic_cast<const BaseSequenceInputGenerator&>(task.input());
  const BaseTokenizer& tok = input.tokenizer();
  // The first n English verses of Test.
  std::ifstream in(JoinPath(FindDataDir("bible_mt", "scripts/prepare_bible_mt.sh"), "test.en"));
  std::vector<std::vector<int64_t>> src;
  std::string line;
  while (static_cast<int64_t>(src.size()) < n && std::getline(in, line)) {
    std::vector<int64_t> ids = tok.StringToIds(line);
    ids.push_back(tok.eos_id());
    src.push_back(std::move(ids));
  }
  {
    std::ofstream out(JoinPath(f["workdir"], "src_ids.jsonl"));
    for (const auto& s : src) out << nlohmann::json(s).dump() << "\n";
  }
  auto batch_of = [&](int64_t begin) {
    const int64_t end = std::min<int64_t>(begin + batch, static_cast<int64_t>(src.size()));
    int64_t longest = 0;
    for (int64_t i = begin; i < end; ++i) longest = std::max<int64_t>(longest, src[i].size());
    at::Tensor ids = at::zeros({end - begin, longest}, at::kLong);
    at::Tensor pad = at::ones({end - begin, longest});
    for (int64_t i = begin; i < end; ++i) {
      for (size_t t = 0; t < src[i].size(); ++t) {
        ids[i - begin][static_cast<int64_t>(t)] = src[i][t];
        pad[i - begin][static_cast<int64_t>(t)] = 0;
      }
    }
    return NestedMap{{"ids", ids}, {"paddings", pad}};
  };
  std::vector<NestedMap> batches;
  for (int64_t b = 0; b < static_cast<int64_t>(src.size()); b += batch) batches.push_back(batch_of(b));
  std::vector<double> sps, tps;
  std::vector<std::vector<int64_t>> hyps;
  const NestedMap theta = task.theta();
  // --int8=1: the projections in int8, as the Predictor of a bundle exported with
  // --quantize=int8 runs them; --fused=0: the unfused decoding step. The plan the Predictor would
  // make at load (glossa/kernels/compute_plan.h).
  ComputePolicy policy;
  policy.precision = f["int8"] == "1" ? Precision::kInt8
                                      : ParsePrecision(f["precision"], "--precision");
  policy.fused_decoder_step = f["fused"] != "0";
  model->SetComputePlan(PlanInference(*model, policy));
  at::NoGradGuard no_grad;
  for (int64_t r = 0; r <= runs; ++r) {  // run 0 warms up
    hyps.clear();
    int64_t tokens = 0;
    const double t0 = Now();
    for (const NestedMap& b : batches) {
      NestedMap out = task.Translate(theta, b, 0);
      const at::Tensor ids = out.GetTensor("topk_ids").select(1, 0).contiguous();
      const at::Tensor lens = out.GetTensor("topk_lens").select(1, 0).contiguous();
      for (int64_t i = 0; i < ids.size(0); ++i) {
        const int64_t len = lens[i].item<int64_t>();
        tokens += len;
        std::vector<int64_t> h(ids[i].data_ptr<int64_t>(), ids[i].data_ptr<int64_t>() + len);
        hyps.push_back(std::move(h));
      }
    }
    const double dt = Now() - t0;
    if (r > 0) {
      sps.push_back(static_cast<double>(src.size()) / dt);
      tps.push_back(static_cast<double>(tokens) / dt);
    }
  }
  {
    std::string name = policy.precision == Precision::kFloat32
                           ? "glossa_hyps"
                           : StrCat("glossa_hyps_", PrecisionName(policy.precision));
    name += f["shortlist"].empty() ? ".jsonl" : "_shortlist.jsonl";
    std::ofstream out(JoinPath(f["workdir"], name));
    for (const auto& h : hyps) out << nlohmann::json(h).dump() << "\n";
  }
  std::sort(sps.begin(), sps.end());
  std::sort(tps.begin(), tps.end());
  std::printf("glossa_sentences_per_sec %.3f glossa_tokens_per_sec %.1f step %lld batch %lld "
              "beam %s sentences %zu blas %s\n",
              sps[sps.size() / 2], tps[tps.size() / 2], static_cast<long long>(step),
              static_cast<long long>(batch), f["beam"].c_str(), src.size(),
              BlasCoreName());
  bench::PrintKernelChoices();
  return 0;
}
