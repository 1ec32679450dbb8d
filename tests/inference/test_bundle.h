// The trained checkpoint and exported bundle the inference tests share (built once per binary).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "glossa/inference/bundle.h"
#include "tests/test_util.h"
#include "glossa/model/model_registry.h"
#include "glossa/runtime/executor.h"
#include "glossa/checkpoint/saver.h"

namespace glossa {

namespace fs = std::filesystem;

inline std::string Dir(const std::string& name) {
  fs::path dir = ::glossa::testing::TestRoot() / "bundle" / name;
  fs::remove_all(dir);
  return dir.string();
}

inline const char* kSmall =
    "task.emb.embedding_dim : 16\ntask.position_emb.embedding_dim : 16\n"
    "task.softmax.input_dim : 16\ntask.stack.num_layers : 1\ntask.stack.mdl_dim : 16\n"
    "task.stack.hidden_dim : 32\ntask.stack.num_atten_heads : 2\ntask.train.steps_per_loop : 3\n"
    "task.train.max_steps : 3\ntask.train.ema_decay : 0.9\nrandom_seed : 7\ntask.random_seed : 7\n";

// A checkpoint of the small Austen LM (with an EMA), trained 3 steps once per test binary.
inline const std::string& TrainedLogdir() {
  static const std::string logdir = [] {
    const std::string d = Dir("trained");
    Executor(GetModelParams("lm.austen.TransformerLmTiny", "Train", kSmall),
             {.logdir = d, .log = [](const std::string&) {}})
        .Run();
    return d;
  }();
  return logdir;
}

inline const std::string& ExportedBundle() {
  static const std::string dir = [] {
    const std::string d = Dir("predictor");
    ExportBundle({.model_params = GetModelParams("lm.austen.TransformerLmTiny", "Dev", kSmall),
                  .checkpoint = *Saver::LatestCheckpoint(TrainedLogdir() + "/train"),
                  .out_dir = d});
    return d;
  }();
  return dir;
}

inline const std::vector<std::string> kTexts = {"It is a truth universally acknowledged",
                                         "that a single man in possession of a good fortune",
                                         "must be in want of a wife."};

}  // namespace glossa
