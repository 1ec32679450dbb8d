// Speech features (Lingvo's tasks/asr/frontend.py and core/spectrum_augmenter.py).
//
// MelAsrFrontend: PCM [B, N] (int16 scale) with paddings [B, N] -> log-mel features
// [B, T, num_bins · (stack_left_context + 1), 1] with paddings [B, T]. The stages are Lingvo's:
//   frame (frame_size_ms + 1 sample, frame_step_ms; no end padding) -> pre-emphasis within each
//   frame (x[1:] - preemph · x[:-1]) -> noise (noise_scale LSBs, training only) -> periodic Hann
//   window -> |rfft| at 2 · max(512, next power of 2 of the frame) -> mel filter bank
//   (TensorFlow's linear_to_mel_weight_matrix: HTK mel scale, lower_edge_hertz..upper_edge_hertz,
//   magnitudes) -> log(max(1, ·)) -> (x - per_bin_mean) / per_bin_stddev -> stacking of
//   stack_left_context frames on the left (the first frame repeated), subsampled by the stack
//   size. A frame is padded when any of its samples is.
//
// SpecAugment (Park et al. 2019; Lingvo's SpectrumAugmenter): in training only, per example,
// freq_mask_count frequency masks of width uniform in [0, freq_mask_max_bins] and time_mask_count
// time masks of width uniform in [0, min(time_mask_max_frames, time_mask_max_ratio · length)],
// set to 0; deterministic given the step seed.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "glossa/layers/base_layer.h"

namespace glossa {

class MelAsrFrontend : public BaseLayer {
 public:
  // + sample_rate, frame_size_ms, frame_step_ms, num_bins, lower_edge_hertz, upper_edge_hertz,
  // preemph, noise_scale, window_fn ('HANNING' | None), per_bin_mean, per_bin_stddev,
  // stack_left_context.
  static glossa::Params Params();
  explicit MelAsrFrontend(const glossa::Params& p);
  // pcm [B, N] float (int16 scale), paddings [B, N] (1 = padded; undefined: none). Returns
  // (features [B, T, output_dim(), 1], paddings [B, T]).
  std::pair<at::Tensor, at::Tensor> FProp(const NestedMap& theta, const at::Tensor& pcm,
                                          const at::Tensor& paddings = {}) const;
  int64_t output_dim() const { return num_bins_ * (stack_ + 1); }
  int64_t frame_size() const { return frame_size_; }
  int64_t frame_step() const { return frame_step_; }
  int64_t fft_size() const { return fft_size_; }
  // TensorFlow's linear_to_mel_weight_matrix [fft_size/2 + 1, num_bins] for this frontend.
  const at::Tensor& mel_matrix() const { return mel_; }
  // Frames a signal of n samples gives before stacking.
  int64_t NumFrames(int64_t n) const;

 private:
  int64_t num_bins_, stack_, frame_size_, frame_step_, fft_size_;
  double preemph_, noise_scale_;
  bool window_;
  std::optional<int64_t> random_seed_;
  at::Tensor mel_, mean_, stddev_, hann_;
};

// TensorFlow's tf.signal.linear_to_mel_weight_matrix (float64).
at::Tensor LinearToMelWeightMatrix(int64_t num_mel_bins, int64_t num_spectrogram_bins,
                                   double sample_rate, double lower_edge_hertz,
                                   double upper_edge_hertz);

class SpecAugmentLayer : public BaseLayer {
 public:
  // + freq_mask_max_bins, freq_mask_count, time_mask_max_frames, time_mask_count,
  // time_mask_max_ratio.
  static glossa::Params Params();
  explicit SpecAugmentLayer(const glossa::Params& p);
  // features [B, T, F, C], paddings [B, T]: masked copies in training, the input in eval.
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& features,
                   const at::Tensor& paddings) const;

 private:
  int64_t freq_max_, freq_count_, time_max_, time_count_;
  double time_ratio_;
  std::optional<int64_t> random_seed_;
};

}  // namespace glossa
