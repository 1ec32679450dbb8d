// Inference bundles: export from a trained checkpoint, load with nothing else, and refuse
// damaged bundles naming the file.
#include "glossa/inference/bundle.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/model/model_registry.h"
#include "glossa/models/transformer_lm.h"
#include "glossa/runtime/checkpointer.h"
#include "glossa/runtime/executor.h"
#include "glossa/runtime/saver.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

std::string Dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("glossa_bundle_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  return dir.string();
}

const char* kSmall =
    "task.emb.embedding_dim : 16\ntask.position_emb.embedding_dim : 16\n"
    "task.softmax.input_dim : 16\ntask.stack.num_layers : 1\ntask.stack.mdl_dim : 16\n"
    "task.stack.hidden_dim : 32\ntask.stack.num_atten_heads : 2\ntask.train.steps_per_loop : 3\n"
    "task.train.max_steps : 3\ntask.train.ema_decay : 0.9\nrandom_seed : 7\ntask.random_seed : 7\n";

// A checkpoint of the small Austen LM (with an EMA), trained 3 steps once per test binary.
const std::string& TrainedLogdir() {
  static const std::string logdir = [] {
    const std::string d = Dir("trained");
    Executor(GetModelParams("lm.austen.TransformerLmTiny", "Train", kSmall),
             {.logdir = d, .log = [](const std::string&) {}})
        .Run();
    return d;
  }();
  return logdir;
}

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
  EXPECT_ERROR_CONTAINS(LoadBundle(Dir("nothing")), DataLossError, "has no MANIFEST.json");
}

}  // namespace
}  // namespace glossa
