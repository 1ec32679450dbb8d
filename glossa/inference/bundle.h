// Inference bundles: what `glossa export` writes from a trained checkpoint, and what serving
// loads, with no logdir, training data, registry of datasets or source tree.
//
//   <bundle>/MANIFEST.json         format, format_version, created, source_checkpoint,
//                                  global_step, dtype, and every other file with its size and
//                                  SHA-256
//   <bundle>/model_params.pb       the model's Params (Lingvo's Hyperparam proto), the tasks'
//                                  training inputs removed
//   <bundle>/model_params.txt      the same as params text, for people
//   <bundle>/inference_graph.pbtxt the task's inference subgraphs with their typed feeds and
//                                  fetches, and the params text (Lingvo's InferenceGraph,
//                                  glossa/inference/inference_graph.proto, text format)
//   <bundle>/tokenizer_params.pb   the main task's tokenizer Params (when its input had one),
//                                  file paths rewritten to assets/<name>
//   <bundle>/weights.safetensors   the variables (their EMA averages when the model keeps an
//                                  EMA; no optimizer slots), in the exported dtype
//   <bundle>/assets/...            the tokenizer's files (e.g. the SentencePiece model)
//   <bundle>/torchscript/*.pt      with --torchscript: the networks as TorchScript modules
//
// LoadBundle verifies every file against the manifest before using any: a missing file, a size
// or hash mismatch (a truncated or edited file), an unknown format version or a malformed
// manifest is DataLoss (InvalidArgument for a version this build cannot read) naming the file.
// Weights with NaN or Inf values are refused by both (DataLoss naming the weight).
//
//   ExportBundle({.model_params = p, .checkpoint = "/logdir/train/ckpt-00001200",
//                 .out_dir = "/models/lm"});
//   LoadedBundle b = LoadBundle("/models/lm");   // b.model in inference mode, b.tokenizer
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <functional>
#include <string>

#include "glossa/core/params.h"
#include "glossa/input/tokenizers.h"
#include "glossa/model/base_model.h"
#include "glossa/model/inference_spec.h"

namespace glossa {

inline constexpr int64_t kBundleFormatVersion = 1;

// The SHA-256 of a file's bytes, as lowercase hex (the manifest's checksums).
std::string Sha256File(const std::string& path);

// DataLoss naming `where` and the first floating-point weight holding a NaN or Inf.
void CheckFiniteWeights(const std::map<std::string, at::Tensor>& weights, const std::string& where);

struct ExportOptions {
  Params model_params;      // as trained (GetModelParams(key, dataset, overrides))
  std::string checkpoint;   // a checkpoint prefix, e.g. <logdir>/train/ckpt-00001200
  std::string out_dir;      // created; must not exist or be empty
  std::string dtype = "float32";  // float32 or bfloat16 (the weights and fprop_dtype)
  std::vector<std::string> subgraphs;  // the subgraphs to export (empty: all the task declares)
  // Also write torchscript/<name>.pt, the task's TorchScript modules (BaseTask::ExportTorchScript;
  // float32, from the float32 weights).
  bool torchscript = false;
  // Also write onnx/<name>.onnx, the task's networks with a static graph as ONNX models
  // (BaseTask::ExportOnnx; float32, opset 17, checked by onnx's checker).
  bool onnx = false;
  // "int8": the Predictor runs the projections (x·w through Affine) in int8, weights quantized
  // per output channel and activations per row at run time (glossa/kernels/int8_gemm.h); the
  // manifest records it ("quantize"). Needs dtype float32. The weights file keeps float32 (the
  // Predictor quantizes each weight on its first use), and the TorchScript and ONNX networks stay
  // float32. "none": float arithmetic throughout.
  std::string quantize = "none";
  // A line before each long phase (after the inputs are checked): null says nothing.
  std::function<void(const std::string&)> log;
};
// Writes the bundle (files first, the manifest last and atomically, so a bundle without a
// manifest is incomplete). Returns the bundle's global step.
int64_t ExportBundle(const ExportOptions& options);

struct LoadedBundle {
  std::string dir;
  Params model_params;
  std::unique_ptr<BaseModel> model;          // weights loaded, is_inference set
  std::unique_ptr<BaseTokenizer> tokenizer;  // null when the model has none
  std::map<std::string, std::string> manifest;  // the manifest's scalar fields
  // The exported subgraphs, from inference_graph.pbtxt.
  std::map<std::string, InferenceSubgraphSpec> subgraphs;
  int64_t global_step = 0;
  // Params the bundle's classes define now and its model_params.pb lacks (a bundle exported by
  // an earlier build): they take their defaults, and LoadBundle names them on stderr.
  std::vector<std::string> defaulted_params;
};
LoadedBundle LoadBundle(const std::string& dir);

// Verifies `dir` against its manifest (LoadBundle does this first). Returns the manifest's
// scalar fields.
std::map<std::string, std::string> VerifyBundle(const std::string& dir);

}  // namespace glossa
