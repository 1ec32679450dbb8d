// Speech input: the WAV reader (formats, channels, every malformed-file error) and the log-mel
// frontend against tests/reference/asr_frontend_reference.json (torch.stft-based features from
// tests/reference/asr_frontend_reference.py), TensorFlow's mel matrix, and SpecAugment.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/io/wav.h"
#include "glossa/layers/asr_frontend.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

using json = nlohmann::json;

std::string Le(uint32_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return s;
}

// A WAV with a fmt chunk of `format`, `channels`, `bits`, and `data` as the data chunk's bytes.
std::string Wave(int format, int channels, int bits, const std::string& data, int rate = 16000) {
  const int align = channels * bits / 8;
  std::string fmt = Le(format, 2) + Le(channels, 2) + Le(rate, 4) + Le(rate * align, 4) +
                    Le(align, 2) + Le(bits, 2);
  std::string body = "WAVEfmt " + Le(16, 4) + fmt + "LIST" + Le(3, 4) + "abc" + std::string(1, '\0') +
                     "data" + Le(static_cast<uint32_t>(data.size()), 4) + data;
  return "RIFF" + Le(static_cast<uint32_t>(body.size()), 4) + body;
}

TEST(WavTest, ReadsPcmFormatsAndChannels) {
  const at::Tensor s = at::tensor({0.f, 1000.f, -32768.f, 32767.f, -5.f});
  const Wav a = ParseWav(EncodeWav16(s, 16000), "a.wav");
  EXPECT_EQ(a.sample_rate, 16000);
  EXPECT_EQ(a.bits, 16);
  EXPECT_TRUE(at::equal(a.samples, s));
  // Stereo 16-bit: the mean of the channels; an odd-sized chunk before data is skipped.
  const Wav st = ParseWav(Wave(1, 2, 16, Le(100, 2) + Le(300, 2) + Le(0xFFFF, 2) + Le(0xFFFD, 2)), "st");
  EXPECT_EQ(st.channels, 2);
  EXPECT_TRUE(at::equal(st.samples, at::tensor({200.f, -2.f})));
  // 8-bit unsigned (128 = 0), 24-bit and 32-bit signed, scaled to int16 units.
  EXPECT_TRUE(at::equal(ParseWav(Wave(1, 1, 8, std::string("\x80\xff\x00", 3)), "u8").samples,
                        at::tensor({0.f, 127 * 256.f, -128 * 256.f})));
  EXPECT_TRUE(at::equal(ParseWav(Wave(1, 1, 24, Le(0x000100, 3) + Le(0xFFFF00, 3)), "s24").samples,
                        at::tensor({1.f, -1.f})));
  EXPECT_TRUE(at::equal(ParseWav(Wave(1, 1, 32, Le(0x00010000, 4)), "s32").samples, at::tensor({1.f})));
  // WAVE_FORMAT_EXTENSIBLE with the PCM subformat.
  std::string ext = Wave(1, 1, 16, Le(7, 2));
  const std::string fmt_ext = Le(0xFFFE, 2) + Le(1, 2) + Le(16000, 4) + Le(32000, 4) + Le(2, 2) +
                              Le(16, 2) + Le(22, 2) + Le(16, 2) + Le(4, 4) + Le(1, 2) +
                              std::string(14, '\x01');
  const std::string body = "WAVEfmt " + Le(40, 4) + fmt_ext + "data" + Le(2, 4) + Le(7, 2);
  EXPECT_TRUE(at::equal(ParseWav("RIFF" + Le(body.size(), 4) + body, "ext").samples, at::tensor({7.f})));
}

TEST(WavTest, BadFilesNameTheFileAndOffset) {
  EXPECT_ERROR_CONTAINS(ParseWav("ID3\x03 mp3 bytes here", "song.mp3"), DataLossError,
                        "song.mp3: not a RIFF/WAVE file (byte 0)");
  EXPECT_ERROR_CONTAINS(ParseWav(Wave(3, 1, 32, Le(0, 4)), "float.wav"), InvalidArgumentError,
                        "float.wav: byte 20: WAV format 3 (IEEE float) is not integer PCM");
  EXPECT_ERROR_CONTAINS(ParseWav(Wave(6, 1, 8, "x"), "alaw.wav"), InvalidArgumentError,
                        "WAV format 6 (A-law)");
  const std::string good = EncodeWav16(at::ones({100}), 16000);
  EXPECT_ERROR_CONTAINS(ParseWav(good.substr(0, good.size() - 11), "cut.wav"), DataLossError,
                        "cut.wav: truncated data chunk at byte 36: it declares 200 bytes, the file has 189");
  EXPECT_ERROR_CONTAINS(ParseWav(good.substr(0, 30), "head.wav"), DataLossError,
                        "head.wav: truncated fmt chunk at byte 12");
  EXPECT_ERROR_CONTAINS(ParseWav(good.substr(0, 36), "nodata.wav"), DataLossError,
                        "nodata.wav: no data chunk (the file ends at byte 36)");
  EXPECT_ERROR_CONTAINS(ParseWav(Wave(1, 1, 16, "abc"), "odd.wav"), DataLossError,
                        "holds 3 bytes, not a whole number of 2-byte frames");
  EXPECT_ERROR_CONTAINS(ReadWav("/nonexistent/a.wav"), NotFoundError, "/nonexistent/a.wav");
}

TEST(MelAsrFrontendTest, MelMatrixIsTensorFlows) {
  // Spot values of tf.signal.linear_to_mel_weight_matrix(80, 513, 16000, 125, 7600): each column
  // is a triangle in mel with peak <= 1, the DC row is 0, and the triangles tile (neighbouring
  // columns sum to 1 between their centres).
  const at::Tensor w = LinearToMelWeightMatrix(80, 513, 16000, 125, 7600);
  EXPECT_EQ(w[0].abs().sum().item<double>(), 0.0);
  EXPECT_LE(w.max().item<double>(), 1.0);
  const at::Tensor col_sums = w.sum(1);
  // Bins strictly inside [centre of band 0, centre of band 79] are covered exactly once in total.
  int inside = 0;
  for (int k = 20; k < 480; ++k) {
    if (w[k][0].item<double>() < 1 && w[k][79].item<double>() < 1 && w[k].sum().item<double>() > 0 &&
        w.select(0, k).slice(0, 1, 79).sum().item<double>() > 0) {
      EXPECT_NEAR(col_sums[k].item<double>(), 1.0, 1e-9) << k;
      ++inside;
    }
  }
  EXPECT_GT(inside, 300);
  EXPECT_THROW(LinearToMelWeightMatrix(80, 513, 16000, 125, 9000), InvalidArgumentError);
}

TEST(MelAsrFrontendTest, FeaturesEqualTheTorchStftReference) {
  const json ref = json::parse(testing::ReadSourceFile("tests/reference/asr_frontend_reference.json"));
  const std::vector<float> sig = ref["signal"].get<std::vector<float>>();
  const at::Tensor pcm = at::tensor(sig).unsqueeze(0);
  for (const auto& c : ref["cases"]) {
    Params p = MelAsrFrontend::Params();
    p.Set("noise_scale", 0.0).Set("num_bins", c["num_bins"].get<int64_t>());
    p.Set("stack_left_context", c["stack_left_context"].get<int64_t>());
    if (!c["per_bin_mean"].is_null()) {
      ParamValue::List m, s;
      for (double v : c["per_bin_mean"]) m.emplace_back(v);
      for (double v : c["per_bin_stddev"]) s.emplace_back(v);
      p.Set("per_bin_mean", m).Set("per_bin_stddev", s);
    }
    auto fe = p.Instantiate<MelAsrFrontend>();
    at::Tensor paddings;
    if (!c["pad_from"].is_null()) {
      paddings = at::zeros({1, pcm.size(1)});
      paddings.slice(1, c["pad_from"].get<int64_t>()).fill_(1);
    }
    auto [feats, pad] = fe->FProp(fe->theta(), pcm, paddings);
    std::vector<double> flat;
    for (const auto& r : c["features"]) {
      for (double v : r) flat.push_back(v);
    }
    const at::Tensor expected = at::tensor(flat, at::kDouble);
    const int64_t t = static_cast<int64_t>(c["features"].size());
    ASSERT_EQ(feats.sizes(), (std::vector<int64_t>{1, t, fe->output_dim(), 1})) << c["name"];
    const at::Tensor got = feats.reshape({-1}).to(at::kDouble);
    const double err = (got - expected).abs().max().item<double>();
    EXPECT_LT(err, 2e-3) << c["name"] << ": max |glossa - torch.stft reference| = " << err;
    EXPECT_GT(expected.abs().max().item<double>(), 5.0) << "the reference has signal";
    const at::Tensor ref_pad = at::tensor(c["paddings"].get<std::vector<double>>()).to(at::kFloat);
    EXPECT_TRUE(at::equal(pad.squeeze(0), ref_pad)) << c["name"];
  }
  auto fe = MelAsrFrontend::Params().Instantiate<MelAsrFrontend>();
  EXPECT_EQ(fe->frame_size(), 401);
  EXPECT_EQ(fe->frame_step(), 160);
  EXPECT_EQ(fe->fft_size(), 1024);
  EXPECT_ERROR_CONTAINS(fe->FProp(fe->theta(), at::zeros({1, 300})), InvalidArgumentError,
                        "300 samples are shorter than one frame (401 samples)");
}

TEST(MelAsrFrontendTest, NoiseOnlyInTraining) {
  auto fe = MelAsrFrontend::Params().Set("random_seed", 3).Instantiate<MelAsrFrontend>();
  const at::Tensor pcm = at::zeros({1, 2000});
  {
    EvalModeScope eval;
    EXPECT_EQ(fe->FProp(fe->theta(), pcm).first.abs().max().item<double>(), 0.0);
  }
  // Training: 8-LSB noise lifts the log-mel above its floor (log 1 = 0) somewhere.
  EXPECT_GT(fe->FProp(fe->theta(), pcm).first.max().item<double>(), 0.0);
}

TEST(SpecAugmentTest, MasksWithinBoundsInTrainingOnly) {
  Params p = SpecAugmentLayer::Params();
  p.Set("freq_mask_max_bins", 5).Set("freq_mask_count", 1).Set("time_mask_max_frames", 10);
  p.Set("time_mask_count", 1).Set("time_mask_max_ratio", 1.0).Set("random_seed", 9);
  auto sa = p.Instantiate<SpecAugmentLayer>();
  const at::Tensor x = at::ones({4, 50, 20, 1});
  {
    EvalModeScope eval;
    EXPECT_TRUE(at::equal(sa->FProp(sa->theta(), x, at::zeros({4, 50})), x));
  }
  SetGlobalStep(11);
  ResetStepSeed();
  const at::Tensor y = sa->FProp(sa->theta(), x, at::zeros({4, 50}));
  ResetStepSeed();
  EXPECT_TRUE(at::equal(sa->FProp(sa->theta(), x, at::zeros({4, 50})), y)) << "same step, same masks";
  EXPECT_FALSE(at::equal(sa->FProp(sa->theta(), x, at::zeros({4, 50})), y)) << "next op, new masks";
  EXPECT_FALSE(at::equal(y, x));
  for (int64_t i = 0; i < 4; ++i) {
    // Masked bins are whole columns (<= 5) and masked frames whole rows (<= 10).
    const at::Tensor m = y[i].squeeze(-1);
    const int64_t zero_cols = (m.sum(0) == 0).sum().item<int64_t>();
    const int64_t zero_rows = (m.sum(1) == 0).sum().item<int64_t>();
    EXPECT_LE(zero_cols, 5);
    EXPECT_LE(zero_rows, 10);
    EXPECT_EQ((m == 0).sum().item<int64_t>(), zero_cols * 50 + zero_rows * 20 - zero_cols * zero_rows);
  }
  SetGlobalStep(0);
}

}  // namespace
}  // namespace glossa
