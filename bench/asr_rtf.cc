// Real-time factor of speech recognition: processing seconds per second of audio (below 1 is
// faster than real time) for the log-mel frontend alone and for whole transcriptions (frontend,
// encoder, beam search) through the Predictor, one utterance at a time, on the first --n
// utterances of a manifest. Run by asr_rtf.sh.
//   bench_asr_rtf --bundle=/tmp/las --manifest=data/speech/test.tsv --n=50 [--num_hyps=K (0: the
//   model's own beam)]
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "glossa/base/file.h"
#include "glossa/core/nested_map.h"
#include "glossa/inference/predictor.h"
#include "glossa/io/wav.h"
#include "glossa/layers/asr_frontend.h"
#include "glossa/layers/base_layer.h"
#include "glossa/runtime/blas_kernels.h"
#include "glossa/runtime/cpu_runtime.h"
#include "bench/bench_util.h"

int main(int argc, char** argv) {
  using glossa::bench::Now;
  glossa::UseBestBlasKernels(argv);
  using namespace glossa;
  auto f = bench::ParseFlags(argc, argv,
                             {{"bundle", ""}, {"manifest", ""}, {"n", "50"}, {"num_hyps", "0"}});
  ConfigureCpuRuntime(0, false, CpuWorkload::kInference);
  const std::string root = f["manifest"].substr(0, f["manifest"].rfind('/'));
  std::ifstream in(f["manifest"]);
  std::vector<std::string> wavs;
  std::string line;
  while (std::getline(in, line) && static_cast<int>(wavs.size()) < std::stoi(f["n"])) {
    wavs.push_back(ReadFileToString(JoinPath(root, line.substr(0, line.find('\t')))));
  }
  double audio = 0;
  std::vector<at::Tensor> pcm;
  for (const auto& w : wavs) {
    Wav x = ParseWav(w, "wav");
    audio += static_cast<double>(x.samples.numel()) / static_cast<double>(x.sample_rate);
    pcm.push_back(x.samples.unsqueeze(0));
  }
  auto fe = MelAsrFrontend::Params().Instantiate<MelAsrFrontend>();
  EvalModeScope eval;
  double t0 = Now();
  for (const auto& x : pcm) fe->FProp(fe->theta(), x);
  const double frontend = Now() - t0;
  Predictor pred(f["bundle"]);
  InferenceMap warm;
  warm["wav"] = InferenceValue::Strings({wavs[0]});
  pred.Run("transcribe", warm);
  t0 = Now();
  for (const auto& w : wavs) {
    InferenceMap feeds;
    feeds["wav"] = InferenceValue::Strings({w});
    const int64_t num_hyps = std::stoll(f["num_hyps"]);  // 0: the model's own beam
    if (num_hyps > 0) feeds["num_hyps"] = InferenceValue::Of(at::full({}, num_hyps, at::kLong));
    pred.Run("transcribe", feeds);
  }
  const double full = Now() - t0;
  std::printf("utterances %zu audio_seconds %.1f\n", wavs.size(), audio);
  std::printf("frontend_rtf %.5f\n", frontend / audio);
  std::printf("transcribe_rtf %.4f (beam %s, one utterance at a time)\n", full / audio,
              f["num_hyps"] == "0" ? "of the model" : f["num_hyps"].c_str());
  return 0;
}
