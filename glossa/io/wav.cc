#include "glossa/io/wav.h"

#include <ATen/ATen.h>

#include <cstring>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

uint32_t U32(const std::string& b, size_t o) {
  return static_cast<uint32_t>(static_cast<unsigned char>(b[o])) |
         static_cast<uint32_t>(static_cast<unsigned char>(b[o + 1])) << 8 |
         static_cast<uint32_t>(static_cast<unsigned char>(b[o + 2])) << 16 |
         static_cast<uint32_t>(static_cast<unsigned char>(b[o + 3])) << 24;
}
uint16_t U16(const std::string& b, size_t o) {
  return static_cast<uint16_t>(static_cast<unsigned char>(b[o]) |
                               static_cast<unsigned char>(b[o + 1]) << 8);
}

std::string FormatName(uint16_t code) {
  switch (code) {
    case 3: return "IEEE float";
    case 6: return "A-law";
    case 7: return "mu-law";
    case 2: return "ADPCM";
    case 0x55: return "MP3";
    default: return "unknown";
  }
}

// The `frames` interleaved integer-PCM frames at byte `body` of `b`, each the mean of its
// `channels` samples, as a [frames] float32 tensor on the int16 scale.
at::Tensor DecodePcmFrames(const std::string& b, size_t body, int64_t frames, int64_t channels,
                           int64_t bits) {
  at::Tensor out = at::zeros({frames}, at::kFloat);
  float* o = out.data_ptr<float>();
  const int bytes = static_cast<int>(bits / 8);
  for (int64_t f = 0; f < frames; ++f) {
    double sum = 0;
    for (int64_t c = 0; c < channels; ++c) {
      const size_t at = body + static_cast<size_t>((f * channels + c) * bytes);
      const auto* u = reinterpret_cast<const unsigned char*>(b.data() + at);
      double v = 0;
      switch (bytes) {
        case 1: v = (static_cast<int>(u[0]) - 128) * 256.0; break;
        case 2: v = static_cast<int16_t>(u[0] | u[1] << 8); break;
        case 3: {
          int32_t x = u[0] | u[1] << 8 | u[2] << 16;
          if (x & 0x800000) x -= 0x1000000;
          v = x / 256.0;
          break;
        }
        default: v = static_cast<int32_t>(U32(b, at)) / 65536.0; break;
      }
      sum += v;
    }
    o[f] = static_cast<float>(sum / static_cast<double>(channels));
  }
  return out;
}

}  // namespace

Wav ParseWav(const std::string& b, const std::string& what) {
  if (b.size() < 12 || b.compare(0, 4, "RIFF") != 0 || b.compare(8, 4, "WAVE") != 0) {
    throw DataLossError(StrCat(what, ": not a RIFF/WAVE file (byte 0)"));
  }
  Wav w;
  uint16_t block_align = 0;
  bool have_fmt = false;
  size_t pos = 12;
  while (pos + 8 <= b.size()) {
    const std::string id = b.substr(pos, 4);
    const uint64_t size = U32(b, pos + 4);
    const size_t body = pos + 8;
    if (id == "fmt ") {
      if (size < 16 || body + size > b.size()) {
        throw DataLossError(StrCat(what, ": truncated fmt chunk at byte ", pos));
      }
      uint16_t format = U16(b, body);
      if (format == 0xFFFE && size >= 40) format = U16(b, body + 24);  // EXTENSIBLE: subformat
      w.channels = U16(b, body + 2);
      w.sample_rate = U32(b, body + 4);
      block_align = U16(b, body + 12);
      w.bits = U16(b, body + 14);
      if (format != 1) {
        throw InvalidArgumentError(StrCat(what, ": byte ", body, ": WAV format ", format, " (",
                                          FormatName(format),
                                          ") is not integer PCM; convert it, e.g. sox in.wav -e "
                                          "signed-integer -b 16 out.wav"));
      }
      if (w.channels < 1 || (w.bits != 8 && w.bits != 16 && w.bits != 24 && w.bits != 32) ||
          block_align != w.channels * (w.bits / 8) || w.sample_rate <= 0) {
        throw DataLossError(StrCat(what, ": byte ", body, ": inconsistent fmt chunk (", w.channels,
                                   " channels, ", w.bits, " bits, block align ", block_align,
                                   ", rate ", w.sample_rate, ")"));
      }
      have_fmt = true;
    } else if (id == "data") {
      if (!have_fmt) throw DataLossError(StrCat(what, ": data chunk at byte ", pos, " before any fmt chunk"));
      if (body + size > b.size()) {
        throw DataLossError(StrCat(what, ": truncated data chunk at byte ", pos, ": it declares ",
                                   size, " bytes, the file has ", b.size() - body));
      }
      if (size % block_align != 0) {
        throw DataLossError(StrCat(what, ": data chunk at byte ", pos, " holds ", size,
                                   " bytes, not a whole number of ", block_align, "-byte frames"));
      }
      w.samples = DecodePcmFrames(b, body, static_cast<int64_t>(size / block_align), w.channels,
                                  w.bits);
      return w;
    }
    if (body + size > b.size()) {
      throw DataLossError(StrCat(what, ": truncated '", id, "' chunk at byte ", pos));
    }
    pos = body + size + (size & 1);  // chunks are word-aligned
  }
  throw DataLossError(StrCat(what, ": no ", have_fmt ? "data" : "fmt", " chunk (the file ends at byte ",
                             b.size(), ")"));
}

Wav ReadWav(const std::string& path) { return ParseWav(ReadFileToString(path, uint64_t{1} << 32), path); }

std::string EncodeWav16(const at::Tensor& samples, int64_t sample_rate) {
  const at::Tensor s = samples.to(at::kFloat).round().clamp(-32768, 32767).to(at::kShort).contiguous();
  const uint32_t data = static_cast<uint32_t>(s.numel() * 2);
  std::string b = "RIFF";
  auto put32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  };
  auto put16 = [&](uint16_t v) {
    b.push_back(static_cast<char>(v & 0xFF));
    b.push_back(static_cast<char>(v >> 8));
  };
  put32(36 + data);
  b += "WAVEfmt ";
  put32(16);
  put16(1);
  put16(1);
  put32(static_cast<uint32_t>(sample_rate));
  put32(static_cast<uint32_t>(sample_rate * 2));
  put16(2);
  put16(16);
  b += "data";
  put32(data);
  b.append(reinterpret_cast<const char*>(s.data_ptr<int16_t>()), data);
  return b;
}

}  // namespace glossa
