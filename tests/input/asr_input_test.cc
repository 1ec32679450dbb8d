// AsrInput: manifests of WAVs into padded {src, tgt} batches; bad lines and WAVs name the file.
#include "glossa/input/asr_input.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/io/wav.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

std::string Dir() {
  static int n = 0;
  const std::string d = StrCat(::glossa::testing::TestRoot().string(), "/asr_input_", n++);
  std::filesystem::create_directories(d);
  return d;
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

Params Input(const std::string& dir) {
  Params p = AsrInput::Params();
  p.Set("file_pattern", StrCat("text:", dir, "/m.tsv")).Set("audio_root", dir);
  p.Set("repeat_count", 1).Set("require_sequential_order", true).Set("file_parallelism", 1);
  p.Set("bucket_upper_bound", ParamValue::List{1000}).Set("bucket_batch_limit", ParamValue::List{8});
  return p;
}

TEST(AsrInputTest, ManifestToPaddedBatches) {
  const std::string d = Dir();
  Write(d + "/a.wav", EncodeWav16(at::full({1600}, 100.0), 16000));  // 0.1 s
  Write(d + "/b.wav", EncodeWav16(at::full({3200}, -7.0), 16000));   // 0.2 s
  Write(d + "/long.wav", EncodeWav16(at::zeros({16000 * 3}), 16000));
  Write(d + "/m.tsv", StrCat("a.wav\tab\n\n", d, "/b.wav\tabc\nlong.wav\ttoo long\n"));
  Params p = Input(d);
  p.Set("max_audio_seconds", 1.0);
  auto in = p.Instantiate<AsrInput>();
  const NestedMap b = in->GetPreprocessedInputBatch();
  EXPECT_EQ(b.GetTensor("src.src_inputs").sizes(), (std::vector<int64_t>{2, 3200}));
  EXPECT_EQ(b.GetTensor("src.src_inputs")[0][0].item<float>(), 100.0f);
  EXPECT_EQ(b.GetTensor("src.src_inputs")[1][3199].item<float>(), -7.0f);
  EXPECT_EQ(b.GetTensor("src.paddings")[0].sum().item<float>(), 1600.0f);  // a.wav padded
  EXPECT_EQ(b.GetTensor("src.paddings")[1].sum().item<float>(), 0.0f);
  // Targets: <s> + chars, chars + </s>; "ab" is one shorter than "abc".
  EXPECT_EQ(b.GetTensor("tgt.ids").size(1), 4);
  EXPECT_EQ(b.GetTensor("tgt.paddings")[0].sum().item<float>(), 1.0f);
  EXPECT_EQ(b.GetTensor("tgt.weights")[1].sum().item<float>(), 4.0f);
  EXPECT_THROW(in->GetPreprocessedInputBatch(), OutOfRangeError);  // long.wav was dropped
}

TEST(AsrInputTest, BadLinesAndWavsNameTheFile) {
  const std::string d = Dir();
  Write(d + "/m.tsv", "no tab on this line\n");
  EXPECT_ERROR_CONTAINS(Input(d).Instantiate<AsrInput>()->GetPreprocessedInputBatch(),
                        InvalidArgumentError, "a manifest line has no tab");
  Write(d + "/8k.wav", EncodeWav16(at::zeros({800}), 8000));
  Write(d + "/m.tsv", "8k.wav\thello\n");
  EXPECT_ERROR_CONTAINS(Input(d).Instantiate<AsrInput>()->GetPreprocessedInputBatch(),
                        InvalidArgumentError, "8k.wav: 8000 Hz, but the input reads 16000 Hz");
  Write(d + "/cut.wav", EncodeWav16(at::zeros({800}), 16000).substr(0, 60));
  Write(d + "/m.tsv", "cut.wav\thello\n");
  EXPECT_ERROR_CONTAINS(Input(d).Instantiate<AsrInput>()->GetPreprocessedInputBatch(),
                        DataLossError, "cut.wav: truncated data chunk at byte 36");
  // skip_corrupt_records drops the bad file and goes on to the next.
  Write(d + "/ok.wav", EncodeWav16(at::zeros({800}), 16000));
  Write(d + "/m.tsv", "cut.wav\thello\nok.wav\thi\n");
  Params p = Input(d);
  p.Set("skip_corrupt_records", true);
  EXPECT_EQ(p.Instantiate<AsrInput>()->GetPreprocessedInputBatch().GetTensor("src.src_inputs").size(0), 1);
}

}  // namespace
}  // namespace glossa
