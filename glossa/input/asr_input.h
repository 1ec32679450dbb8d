// Speech input (Lingvo's tasks/asr input generator, reading WAV files instead of tf.Examples of
// features): manifest lines "<wav path><TAB><transcript>" (file_pattern "text:<manifest>.tsv";
// relative paths are under audio_root), 16 kHz PCM read with glossa/io/wav.h, transcripts through
// the tokenizer (characters by default: AsciiTokenizer), bucketed by length in 10 ms frames.
//
//   batch.src {src_inputs [B, N] float32 (int16 scale), paddings [B, N]}
//   batch.tgt {ids, labels, paddings, weights} [B, T] (ids start with <s>, labels end with </s>)
//   batch.transcript [B] (the text, for WER)
//
// A WAV that cannot be read, or whose rate is not sample_rate, is an error naming the file (or,
// with skip_corrupt_records, skipped and counted); utterances over max_audio_seconds or transcripts
// over target_max_length are dropped.
#pragma once

#include "glossa/input/input_generator.h"

namespace glossa {

class AsrInput : public BaseSequenceInputGenerator {
 public:
  // + audio_root, sample_rate (16000), max_audio_seconds (20).
  static glossa::Params Params();
  explicit AsrInput(const glossa::Params& p);
  ~AsrInput() override { StopReading(); }
  std::optional<std::pair<NestedMap, int64_t>> ProcessRecord(const Record& record) const override;

 private:
  std::string audio_root_;
  int64_t sample_rate_;
  double max_seconds_;
  bool skip_corrupt_;
};

}  // namespace glossa
