#include "glossa/input/asr_input.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/io/wav.h"

namespace glossa {

glossa::Params AsrInput::Params() {
  glossa::Params p = BaseSequenceInputGenerator::Params();
  p.Set("cls", ClsOf<AsrInput>());
  p.Set("tokenizer", AsciiTokenizer::Params());
  p.Set("bucket_upper_bound", ParamValue::List{200, 400, 800, 1600});
  p.Set("bucket_batch_limit", ParamValue::List{64, 32, 16, 8});
  p.Set("target_max_length", 300);
  p.Define("audio_root", "", "Directory of the manifest's relative WAV paths.");
  p.Define("sample_rate", 16000, "The WAVs' sample rate (others are an error).");
  p.Define("max_audio_seconds", 20.0, "Longer utterances are dropped.");
  return p;
}

AsrInput::AsrInput(const glossa::Params& p) : BaseSequenceInputGenerator(p) {
  audio_root_ = p.GetString("audio_root");
  sample_rate_ = p.GetInt("sample_rate");
  max_seconds_ = p.GetFloat("max_audio_seconds");
  skip_corrupt_ = p.GetBool("skip_corrupt_records");
  pad_values_["src_inputs"] = 0.0;
}

std::optional<std::pair<NestedMap, int64_t>> AsrInput::ProcessRecord(const Record& record) const {
  std::string_view line = record.value;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (Strip(line).empty()) return std::nullopt;
  const size_t tab = line.find('\t');
  if (tab == std::string_view::npos) {
    throw InvalidArgumentError(StrCat("input '", path(), "': a manifest line has no tab (want "
                                      "<wav path><TAB><transcript>): '", line.substr(0, 80), "'"));
  }
  std::string file(Strip(line.substr(0, tab)));
  const std::string text(Strip(line.substr(tab + 1)));
  if (!audio_root_.empty() && !file.empty() && file[0] != '/') file = JoinPath(audio_root_, file);
  Wav wav;
  try {
    wav = ReadWav(file);
    if (wav.sample_rate != sample_rate_) {
      throw InvalidArgumentError(StrCat(file, ": ", wav.sample_rate, " Hz, but the input reads ",
                                        sample_rate_, " Hz audio (resample it: sox in.wav -r ",
                                        sample_rate_, " out.wav)"));
    }
  } catch (const Error&) {
    if (skip_corrupt_) return std::nullopt;
    throw;
  }
  const int64_t n = wav.samples.numel();
  if (n == 0 || static_cast<double>(n) > max_seconds_ * static_cast<double>(sample_rate_)) {
    return std::nullopt;
  }
  const BaseTokenizer& tok = tokenizer();
  std::vector<int64_t> tgt = tok.StringToIds(text);
  if (tgt.empty()) return std::nullopt;
  const int64_t t = static_cast<int64_t>(tgt.size()) + 1;
  if (t > params().GetInt("target_max_length")) return std::nullopt;
  std::vector<int64_t> ids{tok.sos_id()};
  ids.insert(ids.end(), tgt.begin(), tgt.end());
  tgt.push_back(tok.eos_id());
  NestedMap ex;
  ex.Set("src.src_inputs", wav.samples);
  ex.Set("src.paddings", at::zeros({n}, at::kFloat));
  ex.Set("tgt.ids", at::tensor(ids, at::kLong));
  ex.Set("tgt.labels", at::tensor(tgt, at::kLong));
  ex.Set("tgt.paddings", at::zeros({t}, at::kFloat));
  ex.Set("tgt.weights", at::ones({t}, at::kFloat));
  return std::make_pair(std::move(ex), n * 100 / sample_rate_);  // 10 ms frames
}

GLOSSA_REGISTER_CLASS(AsrInput, "glossa.input.AsrInput");

}  // namespace glossa
