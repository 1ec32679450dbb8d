// Inference bundles: export from a trained checkpoint, load with nothing else, and refuse
// damaged bundles naming the file.
#include "glossa/inference/bundle.h"

#include <thread>

#include "glossa/inference/predictor.h"

#include <ATen/ATen.h>
#include <torch/script.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "glossa/base/file.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/parallel.h"
#include "glossa/base/strings.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/checkpoint/checkpointer.h"
#include "glossa/runtime/executor.h"
#include "glossa/checkpoint/saver.h"
#include "tests/inference/onnx_runtime.h"
#include "tests/inference/test_bundle.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(Bundle, ExportedModelScoresExactlyAsTheEvalModel) {
  const Params p = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall);
  const std::string ckpt = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  const std::string out = Dir("lm");
  EXPECT_EQ(ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = out}), 3);
  // The evaluation model: the checkpoint with its EMA, in eval mode.
  auto eval_model = InstantiateLayer<BaseModel>(p);
  auto ema = MakeModelEma(*eval_model);
  RestoreForEval(LoadCheckpoint(ckpt), *eval_model, ema.get());
  const NestedMap batch = eval_model->task().input().GetPreprocessedInputBatch();
  auto& lm = dynamic_cast<TransformerLmTask&>(eval_model->task());
  at::Tensor want;
  {
    EvalModeScope eval;
    at::NoGradGuard no_grad;
    want = lm.Logits(lm.theta(), batch.GetTensor("ids"), batch.GetTensor("paddings"));
  }
  // The bundle, loaded from a copy elsewhere (nothing points back at the logdir or data/).
  const std::string moved = Dir("moved");
  fs::copy(out, moved, fs::copy_options::recursive);
  fs::remove_all(out);
  LoadedBundle b = LoadBundle(moved);
  EXPECT_EQ(b.global_step, 3);
  EXPECT_EQ(b.manifest.at("dtype"), "float32");
  EXPECT_FALSE(b.model_params.IsSet("task.input"));
  auto& exported = dynamic_cast<TransformerLmTask&>(b.model->task());
  at::NoGradGuard no_grad;
  const at::Tensor got =
      exported.Logits(exported.theta(), batch.GetTensor("ids"), batch.GetTensor("paddings"));
  EXPECT_TRUE(at::equal(got, want));  // bit-identical in fp32: the EMA weights, eval mode
  // The tokenizer came with it, as an asset.
  ASSERT_TRUE(b.tokenizer);
  EXPECT_EQ(b.tokenizer->StringToIds("It is a truth universally acknowledged"),
            eval_model->task().input().params().GetParams("tokenizer").Instantiate<BaseTokenizer>()
                ->StringToIds("It is a truth universally acknowledged"));
  EXPECT_TRUE(FileExists(moved + "/assets/spm_2k.model"));
  // The inference graph lists the task's subgraphs with their specs.
  ASSERT_EQ(b.subgraphs.size(), 2u);
  EXPECT_EQ(b.subgraphs.at("default").feeds.at("text").dtype, "string");
  EXPECT_EQ(b.subgraphs.at("generate").feeds.at("seed").rank, 0);
  EXPECT_TRUE(b.subgraphs.at("generate").feeds.at("seed").optional);
  EXPECT_NE(ReadFileToString(moved + "/inference_graph.pbtxt").find("key: \"default\""),
            std::string::npos);
  // Exports never overwrite.
  EXPECT_ERROR_CONTAINS(ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = moved}),
                        InvalidArgumentError, "exists and is not empty");
  // bfloat16 weights: close to the fp32 scores.
  const std::string bf = Dir("bf16");
  ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = bf, .dtype = "bfloat16"});
  LoadedBundle b16 = LoadBundle(bf);
  auto& lm16 = dynamic_cast<TransformerLmTask&>(b16.model->task());
  const at::Tensor got16 =
      lm16.Logits(lm16.theta(), batch.GetTensor("ids"), batch.GetTensor("paddings"));
  EXPECT_TRUE(at::allclose(got16.to(at::kFloat), want, 0.05, 0.1));
}

// --quantize=int8: the manifest says so, the Predictor runs the projections in int8 (the scores
// move, a little), activations are float32 whatever the model trained in, and bad settings are
// refused naming them.
TEST(Bundle, Int8ExportRunsTheProjectionsInInt8CloseToFloat) {
  Params p = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall);
  p.Set("task.fprop_dtype", DType::kBFloat16);
  const std::string ckpt = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  const std::string out = Dir("int8");
  ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = out, .quantize = "int8"});
  Predictor int8(out);
  EXPECT_EQ(int8.manifest().at("quantize"), "int8");
  EXPECT_TRUE(LoadBundle(out).model_params.Get("task.fprop_dtype").is_none());
  Predictor fp32(ExportedBundle());
  EXPECT_EQ(fp32.manifest().at("quantize"), "none");
  const InferenceMap want = fp32.Run("default", {{"text", InferenceValue::Strings(kTexts)}});
  const InferenceMap got = int8.Run("default", {{"text", InferenceValue::Strings(kTexts)}});
  const at::Tensor a = want.at("log_probs").tensor, b = got.at("log_probs").tensor;
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_FALSE(at::equal(a, b));  // int8 ran
  EXPECT_LT((a - b).abs().max().item<double>(), 0.05);
  // Each sentence alone gets its batched scores: int8's rows do not depend on the others here.
  // (The projections: per-row activation scales; the rest of the LM runs ATen's kernels, so the
  // comparison is within float rounding, not bits.)
  for (size_t i = 0; i < kTexts.size(); ++i) {
    const InferenceMap one = int8.Run("default", {{"text", InferenceValue::Strings({kTexts[i]})}});
    const at::Tensor row = one.at("log_probs").tensor[0];
    const int64_t n = one.at("lengths").tensor[0].item<int64_t>();
    EXPECT_LT((row.narrow(0, 0, n) - b[i].narrow(0, 0, n)).abs().max().item<double>(), 1e-4) << i;
  }
  EXPECT_ERROR_CONTAINS(
      ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = Dir("q4"), .quantize = "int4"}),
      InvalidArgumentError, "quantize must be none, int8 or bf16, got 'int4'");
  EXPECT_ERROR_CONTAINS(ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = Dir("qbf"),
                                      .dtype = "bfloat16", .quantize = "int8"}),
                        InvalidArgumentError, "quantize int8 needs dtype float32");
  // A manifest that says something else is refused naming the field.
  const std::string manifest = out + "/MANIFEST.json";
  nlohmann::json m = nlohmann::json::parse(ReadFileToString(manifest));
  m["quantize"] = "int4";
  AtomicWriteFile(manifest, m.dump());
  EXPECT_ERROR_CONTAINS(Predictor{out}, DataLossError, "quantize must be");
}

// --quantize=bf16: the manifest says so, and the Predictor's plan runs every projection on the
// weights rounded to bf16 (what --precision=bf16 does for a float bundle at load), activations in
// float32 whatever the model trained in.
TEST(Bundle, Bf16ExportRunsTheProjectionsOnBf16Weights) {
  Params p = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall);
  p.Set("task.fprop_dtype", DType::kBFloat16);
  const std::string ckpt = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  const std::string out = Dir("bf16w");
  ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = out, .quantize = "bf16"});
  Predictor bf16(out);
  EXPECT_EQ(bf16.manifest().at("quantize"), "bf16");
  EXPECT_TRUE(LoadBundle(out).model_params.Get("task.fprop_dtype").is_none());
  PredictorOptions po;
  po.precision = "bf16";
  Predictor flag(ExportedBundle(), po);  // a float32 bundle, bf16 weights by the flag
  Predictor fp32(ExportedBundle());
  const auto run = [](Predictor& pr) {
    return pr.Run("default", {{"text", InferenceValue::Strings(kTexts)}}).at("log_probs").tensor;
  };
  const at::Tensor a = run(fp32), b = run(bf16), c = run(flag);
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_FALSE(at::equal(a, b));  // the rounded weights ran
  EXPECT_LT((a - b).abs().max().item<double>(), 0.05);
  EXPECT_TRUE(at::equal(b, c));   // the same plan either way
  EXPECT_ERROR_CONTAINS(ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = Dir("qbb"),
                                      .dtype = "bfloat16", .quantize = "bf16"}),
                        InvalidArgumentError, "quantize bf16 needs dtype float32");
  // On a bundle whose layers compute in bf16 on float32 variables, bf16 weights are refused, not
  // silently skipped.
  const std::string b16 = Dir("bf16act");
  ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = b16});
  EXPECT_ERROR_CONTAINS(Predictor(b16, po), FailedPreconditionError,
                        "bf16 needs float32 activations (export the bundle with --quantize=bf16");
}

// An edited manifest made consistent again, as an export would have written it (manifest_sha256
// is the SHA-256 of the compact JSON without it).
void RehashManifest(nlohmann::json& m, const std::string& scratch_file) {
  m.erase("manifest_sha256");
  AtomicWriteFile(scratch_file, m.dump());
  m["manifest_sha256"] = Sha256File(scratch_file);
}

TEST(Bundle, DamagedBundlesAreRefusedNamingTheFile) {
  const Params p = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall);
  const std::string ckpt = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  const std::string good = Dir("good");
  ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = good});
  auto fresh = [&](const std::string& name) {
    const std::string d = Dir(name);
    fs::copy(good, d, fs::copy_options::recursive);
    return d;
  };
  // A flipped byte in the weights.
  std::string d = fresh("flipped");
  std::string w = ReadFileToString(d + "/weights.safetensors");
  w[w.size() / 2] ^= 0x01;
  AtomicWriteFile(d + "/weights.safetensors", w);
  EXPECT_ERROR_CONTAINS(LoadBundle(d), DataLossError,
                        "weights.safetensors does not match its SHA-256 in the manifest");
  // Truncated.
  d = fresh("truncated");
  AtomicWriteFile(d + "/weights.safetensors", w.substr(0, w.size() / 3));
  EXPECT_ERROR_CONTAINS(LoadBundle(d), DataLossError, "weights.safetensors is ");
  // A missing file.
  d = fresh("missing");
  fs::remove(d + "/assets/spm_2k.model");
  EXPECT_ERROR_CONTAINS(LoadBundle(d), DataLossError, "assets/spm_2k.model is missing");
  // No manifest (an export that did not finish), a manifest that is not JSON, a newer version.
  d = fresh("no_manifest");
  fs::remove(d + "/MANIFEST.json");
  EXPECT_ERROR_CONTAINS(LoadBundle(d), DataLossError, "has no MANIFEST.json");
  d = fresh("bad_json");
  AtomicWriteFile(d + "/MANIFEST.json", "{\"format\": ");
  EXPECT_ERROR_CONTAINS(LoadBundle(d), DataLossError, "MANIFEST.json' is not valid JSON");
  d = fresh("version");
  auto m = nlohmann::json::parse(ReadFileToString(d + "/MANIFEST.json"));
  m["format_version"] = 99;
  AtomicWriteFile(d + "/MANIFEST.json", m.dump());
  EXPECT_ERROR_CONTAINS(LoadBundle(d), InvalidArgumentError,
                        "has format_version 99; this Glossa reads version 1");
  m["format_version"] = 1;
  m["files"]["../escape"] = {{"bytes", 1}, {"sha256", "x"}};
  AtomicWriteFile(d + "/MANIFEST.json", m.dump());
  EXPECT_ERROR_CONTAINS(LoadBundle(d), DataLossError, "bad file name '../escape'");
  // A directory that is not a bundle, and a path that does not exist (a typo, not a damaged bundle).
  const std::string empty_dir = Dir("nothing");
  fs::create_directories(empty_dir);
  EXPECT_ERROR_CONTAINS(LoadBundle(empty_dir), DataLossError, "has no MANIFEST.json");
  EXPECT_ERROR_CONTAINS(LoadBundle(Dir("no_such_bundle")), NotFoundError, "does not exist");
  // A manifest field of the wrong JSON type is DataLoss naming the entry, not a JSON exception.
  d = fresh("bytes_string");
  m = nlohmann::json::parse(ReadFileToString(d + "/MANIFEST.json"));
  m["files"]["model_params.pb"]["bytes"] = "12";
  AtomicWriteFile(d + "/MANIFEST.json", m.dump());
  EXPECT_ERROR_CONTAINS(LoadBundle(d), DataLossError, "entry 'model_params.pb' is malformed");
  // Garbage params files (the manifest updated to match them) name the file.
  for (const char* name : {"model_params.pb", "tokenizer_params.pb"}) {
    d = fresh(StrCat("garbage_", name));
    AtomicWriteFile(StrCat(d, "/", name), "\x08\xff\xff garbage that is no proto");
    m = nlohmann::json::parse(ReadFileToString(d + "/MANIFEST.json"));
    m["files"][name] = {{"bytes", FileSize(StrCat(d, "/", name))},
                        {"sha256", Sha256File(StrCat(d, "/", name))}};
    RehashManifest(m, d + "/manifest.scratch");
    AtomicWriteFile(d + "/MANIFEST.json", m.dump());
    EXPECT_ERROR_CONTAINS(LoadBundle(d), DataLossError, StrCat(name, " does not load"));
  }
  // The manifest's own fields are covered: "quantize": "none" -> "int8" would switch the
  // arithmetic, a changed global_step would misreport the model; without the hash, the manifest
  // is refused as altered (or too old).
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"quantize", "int8"}, {"global_step", 12345}, {"dtype", "bfloat16"}}) {
    d = fresh(StrCat("edited_", field));
    m = nlohmann::json::parse(ReadFileToString(d + "/MANIFEST.json"));
    ASSERT_TRUE(m.contains("manifest_sha256"));
    m[field] = value;
    AtomicWriteFile(d + "/MANIFEST.json", m.dump(2));
    EXPECT_ERROR_CONTAINS(LoadBundle(d), DataLossError,
                          "MANIFEST.json' does not match its manifest_sha256");
  }
  d = fresh("no_manifest_hash");
  m = nlohmann::json::parse(ReadFileToString(d + "/MANIFEST.json"));
  m.erase("manifest_sha256");
  AtomicWriteFile(d + "/MANIFEST.json", m.dump());
  EXPECT_ERROR_CONTAINS(LoadBundle(d), DataLossError, "MANIFEST.json' has no manifest_sha256");
  // Formatting is not content: the same fields re-indented load.
  d = fresh("reformatted");
  m = nlohmann::json::parse(ReadFileToString(d + "/MANIFEST.json"));
  AtomicWriteFile(d + "/MANIFEST.json", m.dump(8));
  EXPECT_NO_THROW(LoadBundle(d));
}

// A bundle exported before a param was added (its model_params.pb lacks it) loads with the
// param's default and names it.
TEST(Bundle, AnOlderBundleGetsTheDefaultsOfParamsAddedSince) {
  const Params p = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall);
  const std::string ckpt = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  const std::string d = Dir("older");
  ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = d});
  EXPECT_TRUE(LoadBundle(d).defaulted_params.empty());
  Params old = Params::FromProtoBytes(ReadFileToString(d + "/model_params.pb"));
  const ParamValue want = old.Get("task.softmax.fused_xent");
  old.Delete("task.softmax.fused_xent");
  old.Delete("task.skip_lp_regularization");
  AtomicWriteFile(d + "/model_params.pb", old.ToProtoBytes());
  auto m = nlohmann::json::parse(ReadFileToString(d + "/MANIFEST.json"));
  m["files"]["model_params.pb"] = {{"bytes", FileSize(d + "/model_params.pb")},
                                   {"sha256", Sha256File(d + "/model_params.pb")}};
  RehashManifest(m, d + "/manifest.scratch");
  AtomicWriteFile(d + "/MANIFEST.json", m.dump());
  const LoadedBundle b = LoadBundle(d);
  EXPECT_EQ(b.defaulted_params,
            (std::vector<std::string>{"task.skip_lp_regularization",
                                      "task.softmax.fused_xent"}));
  EXPECT_EQ(b.model_params.Get("task.softmax.fused_xent"), want);
}

TEST(Bundle, NonFiniteWeightsAreRefusedByExportAndTheLoader) {
  const Params p = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall);
  const std::string ckpt = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  // A checkpoint whose weights (and their averages) hold a NaN, with valid checksums.
  SafetensorsContents c = LoadCheckpoint(ckpt);
  std::string victim;  // the first variable that has an average
  for (const auto& [name, t] : c.tensors) {
    const std::string suffix = "/ExponentialMovingAverage";
    if (victim.empty() && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      victim = name.substr(0, name.size() - suffix.size());
    }
  }
  ASSERT_FALSE(victim.empty());
  for (auto& [name, t] : c.tensors) {
    if (name.rfind(victim, 0) == 0 && t.is_floating_point()) t.view({-1})[0] = NAN;
  }
  const std::string dir = Dir("nan_ckpt");
  fs::create_directories(dir);
  Saver({.dir = dir, .async = false}).Save(3, c.tensors, c.metadata);
  EXPECT_ERROR_CONTAINS(
      ExportBundle({.model_params = p, .checkpoint = dir + "/ckpt-00000003", .out_dir = Dir("nan")}),
      DataLossError, "weight '" + victim + "' has 1 NaN or Inf value(s)");
  EXPECT_FALSE(fs::exists(Dir("nan") + "/MANIFEST.json"));
  // The Predictor refuses such a checkpoint on reload and keeps serving the old weights.
  Predictor predictor(ExportedBundle());
  EXPECT_ERROR_CONTAINS(predictor.Load(dir + "/ckpt-00000003"), DataLossError,
                        "weight '" + victim + "' has 1 NaN");
  const InferenceMap out = predictor.Run("default", {{"text", InferenceValue::Strings({kTexts[0]})}});
  EXPECT_TRUE(at::isfinite(out.at("total_log_prob").tensor).all().item<bool>());
}

TEST(Bundle, TorchScriptNetworkComputesTheLmsLogProbs) {
  const Params p = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall);
  const std::string out = Dir("torchscript");
  ExportBundle({.model_params = p,
                .checkpoint = *Saver::LatestCheckpoint(TrainedLogdir() + "/train"),
                .out_dir = out,
                .torchscript = true});
  LoadedBundle b = LoadBundle(out);  // the manifest lists and hashes torchscript/network.pt
  torch::jit::Module net = torch::jit::load(out + "/torchscript/network.pt");
  // Two sentences of different lengths: the second padded.
  const NestedMap batch = b.tokenizer->StringsToIds(kTexts, 64, /*pad_to_longest=*/true);
  const at::Tensor ids = batch.GetTensor("ids"), paddings = batch.GetTensor("paddings");
  at::Tensor want;
  {
    at::NoGradGuard no_grad;
    EvalModeScope eval;
    auto& lm = dynamic_cast<TransformerLmTask&>(b.model->task());
    want = at::log_softmax(lm.Logits(lm.theta(), ids, paddings), -1);
  }
  const at::Tensor got = net.forward({ids, paddings}).toTensor();
  ASSERT_EQ(got.sizes(), want.sizes());
  const at::Tensor real = (paddings < 0.5).unsqueeze(-1).expand_as(want);
  // Bit for bit where OpenBLAS gives a row the same bits whatever the GEMM's shape (its SkylakeX
  // kernels on a Xeon); with other kernel sets the fused kernels' GEMM pieces round differently.
  const at::Tensor w = want.masked_select(real).to(at::kDouble);
  const double err = (got.masked_select(real).to(at::kDouble) - w).abs().max().item<double>();
  EXPECT_LE(err, 1e-6 * w.abs().max().item<double>()) << "largest difference " << err;
}

TEST(Bundle, TorchScriptExportNamesWhatItDoesNotCover) {
  // GELU feed-forward layers: the same variables, an activation the export does not write.
  const Params p = GetModelParams(
      "lm.austen.TransformerLmTiny", "Dev",
      std::string(kSmall) + "task.stack.transformer_layer_params_tpl.tr_fflayer_tpl.activation : "
                            "'GELU'\n");
  const std::string ckpt = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  const std::string out = Dir("gelu");
  EXPECT_ERROR_CONTAINS(
      ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = out, .torchscript = true}),
      UnimplementedError, "fc0': activation GELU is not covered by the TorchScript export");
  // Nothing is left behind: no bundle, no staging directory.
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path())) {
    EXPECT_EQ(e.path().filename().string().find("gelu"), std::string::npos) << e.path();
  }
  // Without --torchscript the same model exports.
  EXPECT_EQ(ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = out}), 3);
}

TEST(Bundle, OnnxNetworkInOnnxRuntimeGivesThePredictorsScores) {
  const Params p = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall);
  const std::string out = Dir("onnx");
  ExportBundle({.model_params = p,
                .checkpoint = *Saver::LatestCheckpoint(TrainedLogdir() + "/train"),
                .out_dir = out,
                .onnx = true});
  LoadedBundle b = LoadBundle(out);  // the manifest lists and hashes onnx/lm_score.onnx
  EXPECT_TRUE(std::filesystem::exists(out + "/onnx/lm_score.onnx"));
  Predictor predictor(out);
  // Three sentences of different lengths (two padded), and one alone (no padding at all).
  const std::vector<std::string> texts = {kTexts[0], kTexts[1], "Mr. Darcy"};
  for (const auto& batch : {texts, std::vector<std::string>{kTexts[1]}}) {
    const InferenceMap want = predictor.Run("default", {{"text", InferenceValue::Strings(batch)}});
    int64_t longest = 0;
    for (const auto& t : batch) longest = std::max<int64_t>(longest, static_cast<int64_t>(t.size()));
    const NestedMap in = b.tokenizer->StringsToIds(batch, longest + 1, /*pad_to_longest=*/true);
    const auto got = RunOnnxRuntime(out + "/onnx/lm_score.onnx",
                                    {{"ids", in.GetTensor("ids")},
                                     {"labels", in.GetTensor("labels")},
                                     {"paddings", in.GetTensor("paddings").to(at::kFloat)}},
                                    Dir("onnx_feeds.json"));
    ASSERT_EQ(got.count("log_probs"), 1u);
    for (const char* name : {"log_probs", "total_log_prob"}) {
      const at::Tensor w = want.at(name).tensor.to(at::kDouble);
      ASSERT_EQ(got.at(name).sizes(), w.sizes()) << name;
      const double err = (got.at(name) - w).abs().max().item<double>();
      EXPECT_LE(err, 1e-4 * std::max(1.0, w.abs().max().item<double>()))
          << name << ": largest difference " << err;
    }
    // The scores are real: far from zero where the tokens are.
    EXPECT_LT(want.at("total_log_prob").tensor.max().item<double>(), -1.0);
  }
}

TEST(Bundle, OnnxExportNamesWhatItDoesNotCover) {
  const Params p = GetModelParams(
      "lm.austen.TransformerLmTiny", "Dev",
      std::string(kSmall) + "task.stack.transformer_layer_params_tpl.tr_fflayer_tpl.activation : "
                            "'GELU'\n");
  const std::string ckpt = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  const std::string out = Dir("onnx_gelu");
  EXPECT_ERROR_CONTAINS(
      ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = out, .onnx = true}),
      UnimplementedError, "fc0': activation GELU is not covered by the ONNX export");
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(Predictor, ScoresAsTheEvalModelDoes) {
  Predictor predictor(ExportedBundle());
  EXPECT_EQ(predictor.global_step(), 3);
  const auto specs = predictor.ListSubgraphs();
  ASSERT_TRUE(specs.count("default"));
  ASSERT_TRUE(specs.count("generate"));
  EXPECT_EQ(specs.at("default").feeds.at("text").dtype, "string");
  InferenceMap out = predictor.Run("default", {{"text", InferenceValue::Strings(kTexts)}});
  // The eval model on the same tokens.
  const Params p = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall);
  auto model = InstantiateLayer<BaseModel>(p);
  auto ema = MakeModelEma(*model);
  RestoreForEval(LoadCheckpoint(*Saver::LatestCheckpoint(TrainedLogdir() + "/train")), *model,
                 ema.get());
  auto tok = model->task().input().params().GetParams("tokenizer").Instantiate<BaseTokenizer>();
  int64_t longest = 0;
  for (const auto& t : kTexts) longest = std::max<int64_t>(longest, tok->StringToIds(t).size());
  const NestedMap b = tok->StringsToIds(kTexts, longest + 1);
  auto& lm = dynamic_cast<TransformerLmTask&>(model->task());
  at::Tensor want, composed;
  {
    EvalModeScope eval;
    at::NoGradGuard no_grad;
    const at::Tensor pad = b.GetTensor("paddings").to(at::kFloat);
    const at::Tensor labels = b.GetTensor("labels");
    want = (lm.LabelLogProbs(lm.theta(), b.GetTensor("ids"), labels, pad) * (1 - pad))
               .cumsum(1)
               .select(1, -1);  // summed in position order
    // The ATen composition the label log-probs stand for: log_softmax of the logits, gathered.
    composed = (at::log_softmax(lm.Logits(lm.theta(), b.GetTensor("ids"), pad), -1)
                    .gather(-1, labels.unsqueeze(-1))
                    .squeeze(-1) *
                (1 - pad))
                   .sum(1);
  }
  EXPECT_TRUE(at::equal(out.at("total_log_prob").tensor, want));
  // The fused kernel's exponential and sums round differently from ATen's (float32 rounding).
  EXPECT_TRUE(at::allclose(out.at("total_log_prob").tensor, composed, 1e-5, 1e-5))
      << out.at("total_log_prob").tensor << " against " << composed;
  EXPECT_TRUE(at::equal(out.at("ids").tensor, b.GetTensor("labels")));
  EXPECT_EQ(out.at("lengths").tensor[0].item<int64_t>(),
            static_cast<int64_t>(tok->StringToIds(kTexts[0]).size()) + 1);
  // Generation: strings in, strings out; the same seed gives the same text.
  InferenceMap g1 = predictor.Run(
      "generate", {{"prompt", InferenceValue::Strings({"Elizabeth", "Mr. Darcy"})},
                   {"max_new_tokens", InferenceValue::Of(at::scalar_tensor(8, at::kLong))},
                   {"seed", InferenceValue::Of(at::scalar_tensor(5, at::kLong))}});
  InferenceMap g2 = predictor.Run(
      "generate", {{"prompt", InferenceValue::Strings({"Elizabeth", "Mr. Darcy"})},
                   {"max_new_tokens", InferenceValue::Of(at::scalar_tensor(8, at::kLong))},
                   {"seed", InferenceValue::Of(at::scalar_tensor(5, at::kLong))}});
  ASSERT_EQ(g1.at("text").strings.size(), 2u);
  EXPECT_EQ(g1.at("text").strings, g2.at("text").strings);
  EXPECT_LE(g1.at("ids").tensor.size(1), 8);
  // fetch_keys select.
  InferenceMap only = predictor.Run("default", {{"text", InferenceValue::Strings(kTexts)}},
                                    {"total_log_prob"});
  EXPECT_EQ(only.size(), 1u);
}

// `generate` decodes all its prompts together (one stack step for every row), and each row's
// continuation is what it is alone: each draws with its own generator, and under a batch-invariant
// plan the logits have the same bits.
TEST(Predictor, GenerateDecodesPromptsTogetherAsEachAlone) {
  if (KernelsForcedToReference()) {
    GTEST_SKIP() << "GLOSSA_KERNELS=reference: ATen's kernels are not batch-invariant";
  }
  Predictor predictor(ExportedBundle(), {.batch_invariant = true});
  const std::vector<std::string> prompts = {"Elizabeth", "It is a truth universally", "Mr."};
  for (double temperature : {0.0, 1.0}) {
    auto run = [&](const std::vector<std::string>& p) {
      return predictor.Run(
          "generate", {{"prompt", InferenceValue::Strings(p)},
                       {"max_new_tokens", InferenceValue::Of(at::scalar_tensor(12, at::kLong))},
                       {"temperature", InferenceValue::Of(at::scalar_tensor(temperature, at::kFloat))},
                       {"seed", InferenceValue::Of(at::scalar_tensor(7, at::kLong))}});
    };
    const InferenceMap together = run(prompts);
    ASSERT_EQ(together.at("text").strings.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const InferenceMap alone = run({prompts[i]});
      EXPECT_EQ(together.at("text").strings[i], alone.at("text").strings[0])
          << "'" << prompts[i] << "' at temperature " << temperature;
      EXPECT_EQ(together.at("lengths").tensor[static_cast<int64_t>(i)].item<int64_t>(),
                alone.at("lengths").tensor[0].item<int64_t>());
    }
  }
}

// The same request gives the same bits alone and at any place in batches of 2-16 with shorter
// and longer companions (kernels whose reduction order per row does not depend on the other rows
// or on the padded length), at one and at two threads.
TEST(Predictor, ScoresAreTheSameBitsAloneOrInAnyBatch) {
  if (KernelsForcedToReference()) {
    GTEST_SKIP() << "GLOSSA_KERNELS=reference: ATen's kernels are not batch-invariant (OpenBLAS "
                    "picks its kernels by the whole matrix's shape); the native ones are";
  }
  Predictor predictor(ExportedBundle(), {.batch_invariant = true});
  const int threads = KernelThreads();
  const std::vector<std::string> pool = {
      kTexts[0], "a", kTexts[2], "Mr. Darcy said nothing at all, and Elizabeth said less",
      "It is", kTexts[1] + " " + kTexts[0] + " " + kTexts[2]};
  for (const std::string& me : {kTexts[1], std::string("Elizabeth")}) {
    SetKernelThreads(1);
    const InferenceMap alone = predictor.Run("default", {{"text", InferenceValue::Strings({me})}});
    SetKernelThreads(2);
    const at::Tensor want_lp = alone.at("log_probs").tensor[0].contiguous();
    const float want_total = alone.at("total_log_prob").tensor[0].item<float>();
    for (int64_t n : {2, 3, 5, 8, 16}) {
      std::vector<std::string> batch;
      for (int64_t i = 0; i < n; ++i) batch.push_back(pool[(i * 7 + n) % pool.size()]);
      const int64_t at_row = (n * 5) % n;
      batch[at_row] = me;
      const InferenceMap got = predictor.Run("default", {{"text", InferenceValue::Strings(batch)}});
      const at::Tensor lp = got.at("log_probs").tensor[at_row].contiguous();
      ASSERT_GE(lp.size(0), want_lp.size(0));
      EXPECT_EQ(0, std::memcmp(lp.data_ptr<float>(), want_lp.data_ptr<float>(),
                               want_lp.numel() * sizeof(float)))
          << "'" << me << "' in a batch of " << n << ": largest difference "
          << (lp.narrow(0, 0, want_lp.size(0)) - want_lp).abs().max().item<float>();
      EXPECT_EQ(got.at("total_log_prob").tensor[at_row].item<float>(), want_total)
          << "'" << me << "' in a batch of " << n;
    }
  }
  SetKernelThreads(threads);
}

TEST(Predictor, ServesTheSubgraphsTheBundleExported) {
  const Params p = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall);
  const std::string ckpt = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
  const std::string out = Dir("generate_only");
  ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = out, .subgraphs = {"generate"}});
  Predictor predictor(out);
  EXPECT_EQ(predictor.ListSubgraphs().size(), 1u);
  EXPECT_ERROR_CONTAINS(predictor.Run("default", {}), NotFoundError,
                        "no subgraph 'default' (subgraphs: generate)");
  EXPECT_ERROR_CONTAINS(ExportBundle({.model_params = p, .checkpoint = ckpt,
                                      .out_dir = Dir("nope"), .subgraphs = {"translate"}}),
                        NotFoundError, "the task has no subgraph 'translate'");
}

TEST(Predictor, BadFeedsAreInvalidArgumentsNamingTheFeed) {
  PredictorOptions o;
  o.max_input_tokens = 6;
  o.max_batch_size = 2;
  Predictor predictor(ExportedBundle(), o);
  auto text = [](std::vector<std::string> s) { return InferenceValue::Strings(std::move(s)); };
  EXPECT_ERROR_CONTAINS(predictor.Run("scores", {}), NotFoundError,
                        "no subgraph 'scores' (subgraphs: default, generate)");
  EXPECT_ERROR_CONTAINS(predictor.Run("default", {{"txt", text({"a"})}}), InvalidArgumentError,
                        "unknown feed 'txt' (its feeds: text)");
  EXPECT_ERROR_CONTAINS(predictor.Run("default", {}), InvalidArgumentError,
                        "missing feed 'text' (string, rank 1)");
  EXPECT_ERROR_CONTAINS(
      predictor.Run("default", {{"text", InferenceValue::Of(at::ones({2}, at::kLong))}}),
      InvalidArgumentError, "feed 'text' must be strings, got a tensor");
  EXPECT_ERROR_CONTAINS(predictor.Run("default", {{"text", text({})}}), InvalidArgumentError,
                        "feed 'text' is an empty batch");
  EXPECT_ERROR_CONTAINS(predictor.Run("default", {{"text", text({"a", "b", "c"})}}),
                        InvalidArgumentError, "has 3 examples, more than max_batch_size 2");
  EXPECT_ERROR_CONTAINS(predictor.Run("default", {{"text", text({kTexts[1]})}}),
                        InvalidArgumentError, "feed 'text'[0] is ");
  EXPECT_ERROR_CONTAINS(predictor.Run("default", {{"text", text({kTexts[1]})}}),
                        InvalidArgumentError, "more than max_input_tokens 6");
  EXPECT_ERROR_CONTAINS(
      predictor.Run("generate", {{"prompt", text({"a"})},
                                 {"max_new_tokens", InferenceValue::Of(at::tensor(2.5))}}),
      InvalidArgumentError, "feed 'max_new_tokens' must be int64, got Double");
  EXPECT_ERROR_CONTAINS(
      predictor.Run("generate", {{"prompt", text({"a"})},
                                 {"seed", InferenceValue::Of(at::ones({2}, at::kLong))}}),
      InvalidArgumentError, "feed 'seed' must have rank 0, got shape [2]");
  EXPECT_ERROR_CONTAINS(predictor.Run("default", {{"text", text({"a"})}}, {"logits"}),
                        InvalidArgumentError, "unknown fetch 'logits'");
  EXPECT_EQ(predictor.Run("default", {{"text", text({"a"})}}, {"logits"}, false).size(), 0u);
  PredictorOptions only;
  only.subgraphs = {"generate"};
  Predictor gen_only(ExportedBundle(), only);
  EXPECT_EQ(gen_only.ListSubgraphs().size(), 1u);
  only.subgraphs = {"translate"};
  EXPECT_ERROR_CONTAINS(Predictor(ExportedBundle(), only), NotFoundError,
                        "has no subgraph 'translate' (it has: default, generate)");
}

TEST(Predictor, ThreadsGetTheSequentialResultsWhileWeightsReload) {
  Predictor predictor(ExportedBundle());
  // Mixed requests: scoring each text, and generation with per-request seeds.
  auto request = [&](int i) {
    if (i % 2 == 0) {
      return predictor.Run("default", {{"text", InferenceValue::Strings({kTexts[i % 3]})}})
          .at("total_log_prob")
          .tensor[0]
          .item<double>();
    }
    InferenceMap g = predictor.Run(
        "generate", {{"prompt", InferenceValue::Strings({kTexts[i % 3]})},
                     {"max_new_tokens", InferenceValue::Of(at::scalar_tensor(4, at::kLong))},
                     {"temperature", InferenceValue::Of(at::scalar_tensor(1.0, at::kFloat))},
                     {"seed", InferenceValue::Of(at::scalar_tensor(static_cast<int64_t>(i), at::kLong))}});
    return static_cast<double>(g.at("ids").tensor.sum().item<int64_t>());
  };
  constexpr int kRequests = 200, kThreads = 8;
  std::vector<double> sequential(kRequests);
  for (int i = 0; i < kRequests; ++i) sequential[i] = request(i);
  std::vector<double> parallel(kRequests);
  std::atomic<int> next{0};
  std::atomic<bool> done{false};
  // A reloader swaps in the same checkpoint's weights again and again: no request may fail or
  // see a half-loaded model.
  std::thread reloader([&] {
    const std::string ckpt = *Saver::LatestCheckpoint(TrainedLogdir() + "/train");
    while (!done.load()) predictor.Load(ckpt);
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < kRequests; i = next++) parallel[i] = request(i);
    });
  }
  for (auto& th : threads) th.join();
  done.store(true);
  reloader.join();
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(parallel[i], sequential[i]) << i;
}

}  // namespace
}  // namespace glossa
