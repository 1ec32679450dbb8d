// WAV files (RIFF/WAVE) with integer PCM samples: 8-bit unsigned, 16-, 24- or 32-bit signed,
// little-endian, any number of channels (averaged to mono), WAVE_FORMAT_PCM or
// WAVE_FORMAT_EXTENSIBLE with the PCM subformat. Samples come back as float32 in int16 units
// (±32768), the scale Lingvo's MelAsrFrontend expects.
//
//   Wav w = ReadWav("utt.wav");   // w.sample_rate == 16000, w.samples [N] float32
//
// Anything else is an error naming the file and the byte offset: not RIFF/WAVE (DataLoss), a
// non-PCM format such as IEEE float, A-law or MP3 (InvalidArgument naming the format code), a
// truncated chunk, no fmt or data chunk (DataLoss).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace glossa {

struct Wav {
  int64_t sample_rate = 0;
  int64_t channels = 0;   // in the file (samples are their mean)
  int64_t bits = 0;       // per sample in the file
  at::Tensor samples;     // [N] float32, int16 scale
};

Wav ReadWav(const std::string& path);
Wav ParseWav(const std::string& bytes, const std::string& what);
// 16-bit mono PCM WAV bytes of `samples` (int16 scale, clipped), for tests and tools.
std::string EncodeWav16(const at::Tensor& samples, int64_t sample_rate);

}  // namespace glossa
