#include "glossa/layers/asr_frontend.h"

#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <random>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/weight_init.h"

namespace glossa {
namespace {

double HertzToMel(double hz) { return 1127.0 * std::log(1.0 + hz / 700.0); }

std::vector<double> FloatList(const ParamValue& v, int64_t n, double fill, const std::string& what) {
  if (v.is_none()) return std::vector<double>(static_cast<size_t>(n), fill);
  std::vector<double> out;
  for (const auto& x : v.AsList()) out.push_back(x.AsFloat());
  if (static_cast<int64_t>(out.size()) != n) {
    throw InvalidArgumentError(StrCat(what, " must have num_bins = ", n, " values, got ", out.size()));
  }
  return out;
}

std::optional<int64_t> SeedOf(const Params& p) {
  const ParamValue& s = p.Get("random_seed");
  return s.is_none() ? std::nullopt : std::optional<int64_t>(s.AsInt());
}

}  // namespace

at::Tensor LinearToMelWeightMatrix(int64_t num_mel_bins, int64_t num_spectrogram_bins,
                                   double sample_rate, double lower_edge_hertz,
                                   double upper_edge_hertz) {
  const double nyquist = sample_rate / 2.0;
  if (!(lower_edge_hertz >= 0 && lower_edge_hertz < upper_edge_hertz && upper_edge_hertz <= nyquist)) {
    throw InvalidArgumentError(StrCat("mel filter bank: need 0 <= lower_edge_hertz (", lower_edge_hertz,
                                      ") < upper_edge_hertz (", upper_edge_hertz,
                                      ") <= sample_rate / 2 (", nyquist, ")"));
  }
  at::Tensor w = at::zeros({num_spectrogram_bins, num_mel_bins}, at::kDouble);
  auto a = w.accessor<double, 2>();
  const double lo = HertzToMel(lower_edge_hertz), hi = HertzToMel(upper_edge_hertz);
  std::vector<double> edges(static_cast<size_t>(num_mel_bins + 2));
  for (int64_t i = 0; i < num_mel_bins + 2; ++i) {
    edges[i] = lo + (hi - lo) * static_cast<double>(i) / static_cast<double>(num_mel_bins + 1);
  }
  // Bin 0 (DC) gets no weight; bins 1.. are at linspace(0, nyquist, num_spectrogram_bins)[1:].
  for (int64_t k = 1; k < num_spectrogram_bins; ++k) {
    const double mel = HertzToMel(nyquist * static_cast<double>(k) /
                                  static_cast<double>(num_spectrogram_bins - 1));
    for (int64_t m = 0; m < num_mel_bins; ++m) {
      const double lower = (mel - edges[m]) / (edges[m + 1] - edges[m]);
      const double upper = (edges[m + 2] - mel) / (edges[m + 2] - edges[m + 1]);
      a[k][m] = std::max(0.0, std::min(lower, upper));
    }
  }
  return w;
}

glossa::Params MelAsrFrontend::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<MelAsrFrontend>());
  p.Set("name", "frontend");
  p.Define("sample_rate", 16000.0, "Sample rate in Hz.");
  p.Define("frame_size_ms", 25.0, "Analysis window in ms (one more sample feeds the pre-emphasis).");
  p.Define("frame_step_ms", 10.0, "Step between frames in ms.");
  p.Define("num_bins", 80, "Mel bins.");
  p.Define("lower_edge_hertz", 125.0, "Lowest frequency of the mel filter bank.");
  p.Define("upper_edge_hertz", 7600.0, "Highest frequency of the mel filter bank.");
  p.Define("preemph", 0.97, "Pre-emphasis coefficient (1: none).");
  p.Define("noise_scale", 8.0, "Gaussian noise stddev in int16 LSBs, added in training.");
  p.Define("window_fn", "HANNING", "'HANNING' (periodic Hann) or None.");
  p.Define("per_bin_mean", nullptr, "Per-bin means (num_bins floats); None: zeros.");
  p.Define("per_bin_stddev", nullptr, "Per-bin standard deviations; None: ones.");
  p.Define("stack_left_context", 0, "Left-context frames stacked onto each frame (and the "
                                    "subsampling factor minus 1).");
  return p;
}

MelAsrFrontend::MelAsrFrontend(const glossa::Params& p) : BaseLayer(p) {
  const double rate = p.GetFloat("sample_rate");
  num_bins_ = p.GetInt("num_bins");
  stack_ = p.GetInt("stack_left_context");
  if (rate <= 0 || num_bins_ <= 0 || stack_ < 0) {
    throw InvalidArgumentError(StrCat(path(), ": sample_rate and num_bins must be > 0, "
                                      "stack_left_context >= 0"));
  }
  frame_step_ = static_cast<int64_t>(std::llround(rate * p.GetFloat("frame_step_ms") / 1000.0));
  frame_size_ = static_cast<int64_t>(std::llround(rate * p.GetFloat("frame_size_ms") / 1000.0)) + 1;
  if (frame_step_ <= 0 || frame_size_ <= 2) {
    throw InvalidArgumentError(StrCat(path(), ": frame_size_ms and frame_step_ms are too small"));
  }
  int64_t pow2 = 1;
  while (pow2 < frame_size_) pow2 *= 2;
  fft_size_ = 2 * std::max<int64_t>(512, pow2);
  random_seed_ = SeedOf(p);
  preemph_ = p.GetFloat("preemph");
  noise_scale_ = p.GetFloat("noise_scale");
  const ParamValue& win = p.Get("window_fn");
  window_ = !win.is_none();
  if (window_ && win.AsString() != "HANNING") {
    throw InvalidArgumentError(StrCat(path(), ": window_fn must be 'HANNING' or None, not '",
                                      win.AsString(), "'"));
  }
  mel_ = LinearToMelWeightMatrix(num_bins_, fft_size_ / 2 + 1, rate, p.GetFloat("lower_edge_hertz"),
                                 p.GetFloat("upper_edge_hertz"))
             .to(at::kFloat);
  mean_ = at::tensor(FloatList(p.Get("per_bin_mean"), num_bins_, 0.0, path() + ": per_bin_mean"),
                     at::kDouble)
              .to(at::kFloat);
  stddev_ = at::tensor(FloatList(p.Get("per_bin_stddev"), num_bins_, 1.0, path() + ": per_bin_stddev"),
                       at::kDouble)
                .to(at::kFloat);
  // TensorFlow's hann_window is periodic: 0.5 - 0.5 cos(2πn / N).
  hann_ = at::hann_window(frame_size_ - 1, /*periodic=*/true, at::kFloat);
}

int64_t MelAsrFrontend::NumFrames(int64_t n) const {
  return n < frame_size_ ? 0 : 1 + (n - frame_size_) / frame_step_;
}

std::pair<at::Tensor, at::Tensor> MelAsrFrontend::FProp(const NestedMap& theta, const at::Tensor& pcm,
                                                        const at::Tensor& paddings) const {
  (void)theta;
  if (pcm.dim() != 2) {
    throw InvalidArgumentError(StrCat(path(), ": pcm must be [B, N], got ", pcm.sizes()));
  }
  const int64_t b = pcm.size(0), n = pcm.size(1);
  const int64_t frames = NumFrames(n);
  if (frames == 0) {
    throw InvalidArgumentError(StrCat(path(), ": ", n, " samples are shorter than one frame (",
                                      frame_size_, " samples)"));
  }
  const at::Tensor x = pcm.to(at::kFloat);
  at::Tensor framed = x.unfold(1, frame_size_, frame_step_);  // [B, T, frame]
  at::Tensor sig = framed.slice(2, 1) - preemph_ * framed.slice(2, 0, frame_size_ - 1);
  if (noise_scale_ > 0 && !IsEvalMode() && !is_inference()) {
    const auto seeds = GenerateStepSeedPair(random_seed_, std::nullopt, is_inference());
    at::Generator gen = MakeSeededGenerator(seeds);
    sig = sig + at::empty(sig.sizes(), at::kFloat).normal_(0.0, noise_scale_, gen);
  }
  if (window_) sig = sig * hann_;
  const at::Tensor mag = at::abs(at::fft_rfft(sig, fft_size_));  // [B, T, fft/2 + 1]
  at::Tensor mel = at::matmul(mag, mel_);
  at::Tensor feats = (at::log(at::clamp_min(mel, 1.0)) - mean_) / stddev_;  // [B, T, bins]
  at::Tensor pad;
  if (paddings.defined()) {
    pad = paddings.to(at::kFloat).unfold(1, frame_size_, frame_step_).amax(2);
  } else {
    pad = at::zeros({b, frames}, at::kFloat);
  }
  if (stack_ > 0) {
    const int64_t s = stack_ + 1;
    std::vector<at::Tensor> f = {feats.slice(1, 0, 1).expand({b, stack_, num_bins_}), feats};
    std::vector<at::Tensor> q = {pad.slice(1, 0, 1).expand({b, stack_}), pad};
    feats = at::cat(f, 1);
    pad = at::cat(q, 1);
    const int64_t t = feats.size(1) / s;
    feats = feats.slice(1, 0, t * s).reshape({b, t, s * num_bins_});
    pad = std::get<0>(pad.slice(1, 0, t * s).reshape({b, t, s}).max(2));
  }
  return {feats.unsqueeze(-1), pad};
}

glossa::Params SpecAugmentLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<SpecAugmentLayer>());
  p.Set("name", "specaugment");
  p.Define("freq_mask_max_bins", 15, "Widest frequency mask (bins).");
  p.Define("freq_mask_count", 2, "Frequency masks per example.");
  p.Define("time_mask_max_frames", 40, "Widest time mask (frames).");
  p.Define("time_mask_count", 2, "Time masks per example.");
  p.Define("time_mask_max_ratio", 0.2, "A time mask is at most this fraction of the length.");
  return p;
}

SpecAugmentLayer::SpecAugmentLayer(const glossa::Params& p) : BaseLayer(p) {
  freq_max_ = p.GetInt("freq_mask_max_bins");
  freq_count_ = p.GetInt("freq_mask_count");
  time_max_ = p.GetInt("time_mask_max_frames");
  time_count_ = p.GetInt("time_mask_count");
  time_ratio_ = p.GetFloat("time_mask_max_ratio");
  random_seed_ = SeedOf(p);
  if (freq_max_ < 0 || freq_count_ < 0 || time_max_ < 0 || time_count_ < 0 || time_ratio_ < 0) {
    throw InvalidArgumentError(StrCat(path(), ": mask sizes and counts must be >= 0"));
  }
}

at::Tensor SpecAugmentLayer::FProp(const NestedMap& theta, const at::Tensor& features,
                                   const at::Tensor& paddings) const {
  (void)theta;
  if (IsEvalMode() || is_inference()) return features;
  if (features.dim() < 3) {
    throw InvalidArgumentError(StrCat(path(), ": features must be [B, T, F, ...], got ",
                                      features.sizes()));
  }
  const int64_t b = features.size(0), t = features.size(1), f = features.size(2);
  const auto seeds = GenerateStepSeedPair(random_seed_);
  std::mt19937_64 rng(static_cast<uint64_t>(seeds[0]) * 0x9E3779B97F4A7C15ull ^
                      static_cast<uint64_t>(seeds[1]));
  at::Tensor keep = at::ones({b, t, f}, at::kFloat);
  auto k = keep.accessor<float, 3>();
  const at::Tensor lengths =
      paddings.defined() ? (1 - paddings.to(at::kFloat)).sum(1).to(at::kLong) : at::full({b}, t, at::kLong);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = std::max<int64_t>(1, lengths[i].item<int64_t>());
    for (int64_t m = 0; m < freq_count_; ++m) {
      const int64_t w = std::uniform_int_distribution<int64_t>(0, std::min(freq_max_, f))(rng);
      const int64_t s = std::uniform_int_distribution<int64_t>(0, f - w)(rng);
      for (int64_t j = s; j < s + w; ++j) {
        for (int64_t u = 0; u < t; ++u) k[i][u][j] = 0;
      }
    }
    const int64_t widest = std::min<int64_t>(time_max_, static_cast<int64_t>(time_ratio_ * len));
    for (int64_t m = 0; m < time_count_; ++m) {
      const int64_t w = std::uniform_int_distribution<int64_t>(0, std::max<int64_t>(0, widest))(rng);
      const int64_t s = std::uniform_int_distribution<int64_t>(0, std::max<int64_t>(0, len - w))(rng);
      for (int64_t u = s; u < std::min(s + w, t); ++u) {
        for (int64_t j = 0; j < f; ++j) k[i][u][j] = 0;
      }
    }
  }
  at::Tensor mask = keep.to(features.scalar_type());
  while (mask.dim() < features.dim()) mask = mask.unsqueeze(-1);
  return features * mask;
}

GLOSSA_REGISTER_CLASS(MelAsrFrontend, "glossa.layers.MelAsrFrontend");
GLOSSA_REGISTER_CLASS(SpecAugmentLayer, "glossa.layers.SpecAugmentLayer");

}  // namespace glossa
