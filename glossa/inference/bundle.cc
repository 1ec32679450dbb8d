#include "glossa/inference/bundle.h"

#include <ATen/ATen.h>
#include <openssl/evp.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <google/protobuf/text_format.h>

#include "glossa/model/params_passes.h"
#include "glossa/base/errors.h"
#include "glossa/inference/inference_graph.pb.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/io/safetensors.h"
#include "glossa/optim/ema.h"
#include "glossa/checkpoint/checkpointer.h"
#include "glossa/checkpoint/saver.h"

namespace glossa {
namespace {

using json = nlohmann::json;
constexpr const char* kFormat = "glossa-inference-bundle";
constexpr const char* kManifest = "MANIFEST.json";

// The SHA-256 (hex) of what `feed` passes to its argument, in pieces.
template <typename Feed>
std::string Sha256Of(Feed feed) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  feed([ctx](const char* data, size_t n) { EVP_DigestUpdate(ctx, data, n); });
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

std::string Sha256FileImpl(const std::string& path) {
  CheckRegularFile(path, "bundle file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFoundError(StrCat("cannot open '", path, "'"));
  return Sha256Of([&](const auto& update) {
    std::vector<char> buf(1 << 20);
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      if (in.gcount() > 0) update(buf.data(), static_cast<size_t>(in.gcount()));
    }
  });
}

// The manifest's own fields (quantize, dtype, global_step, the file list, ...) are covered too:
// manifest_sha256 is the SHA-256 of the manifest without it, as compact JSON (sorted keys), so
// an edit such as "quantize": "none" -> "int8" is DataLoss, not other arithmetic.
constexpr const char* kManifestHashKey = "manifest_sha256";
std::string ManifestHash(json m) {
  m.erase(kManifestHashKey);
  const std::string text = m.dump();
  return Sha256Of([&](const auto& update) { update(text.data(), text.size()); });
}

std::string NowIso8601() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

namespace {

// Throws unless the options name a supported dtype and an output directory that is missing or
// empty.
void CheckExportOptions(const ExportOptions& o) {
  if (o.dtype != "float32" && o.dtype != "bfloat16") {
    throw InvalidArgumentError(
        StrCat("export: dtype must be float32 or bfloat16, got '", o.dtype, "'"));
  }
  if (o.quantize != "none" && o.quantize != "int8" && o.quantize != "bf16") {
    throw InvalidArgumentError(
        StrCat("export: quantize must be none, int8 or bf16, got '", o.quantize, "'"));
  }
  if (o.quantize != "none" && o.dtype != "float32") {
    throw InvalidArgumentError(StrCat("export: quantize ", o.quantize, " needs dtype float32 (it "
                                      "quantizes the float32 weights at load), got '", o.dtype,
                                      "'"));
  }
  if (o.out_dir.empty()) throw InvalidArgumentError("export: the output directory is not set");
  if (FileExists(o.out_dir) && !ListDirectory(o.out_dir).empty()) {
    throw InvalidArgumentError(StrCat("export: '", o.out_dir,
                                      "' exists and is not empty; bundles are never overwritten"));
  }
}

// The main task's tokenizer Params (a copy), when its input sets one (p non-const: the mutable
// GetParams overload, as before the split).
std::optional<Params> MainTokenizer(Params& p) {
  std::optional<Params> tokenizer;
  const std::string main_input = MainTaskPath(p) + ".input";
  if (p.IsSet(main_input) && p.GetParams(main_input).Contains("tokenizer") &&
      p.IsSet(main_input + ".tokenizer")) {
    tokenizer = p.GetParams(main_input + ".tokenizer").Copy();
  }
  return tokenizer;
}

// The weights: EMA averages when the model keeps them (what evaluation uses), else the variables,
// in o.dtype; throws on a non-finite weight.
std::map<std::string, at::Tensor> ExportedWeights(const BaseModel& model,
                                                  const ExponentialMovingAverage* ema,
                                                  const ExportOptions& o) {
  std::map<std::string, at::Tensor> weights;
  const auto shadows = ema ? ema->Shadows() : std::map<std::string, at::Tensor>{};
  for (const auto& [info, t] : model.AllVariables()) {
    auto s = shadows.find(info.full_name + ExponentialMovingAverage::kSuffix);
    at::Tensor w = s != shadows.end() ? s->second : t;
    if (o.dtype == "bfloat16" && w.is_floating_point()) w = w.to(at::kBFloat16);
    weights[info.full_name] = w.detach();
  }
  CheckFiniteWeights(weights, StrCat("export: checkpoint '", o.checkpoint, "'"));
  return weights;
}

// Removes the staging directory when the export does not get to rename it into place.
struct StagingCleanup {
  std::string dir;
  bool armed = true;
  ~StagingCleanup() {
    std::error_code ec;
    if (armed) std::filesystem::remove_all(dir, ec);
  }
};

// The staging directory of an export and the MANIFEST's "files" written into it so far.
struct BundleFiles {
  std::string dir;
  json files = json::object();
  // Records the written file `name` (relative to dir) with its size and SHA-256.
  void Add(const std::string& name) {
    const std::string path = JoinPath(dir, name);
    files[name] = {{"bytes", FileSize(path)}, {"sha256", Sha256File(path)}};
  }
};

// Writes the tokenizer's Params, the files it reads becoming assets/<name> (found relative to
// the bundle).
void WriteTokenizer(BundleFiles& bundle, Params& tokenizer) {
  const std::string& dir = bundle.dir;
  for (const auto& key : tokenizer.Keys()) {
    const ParamValue& v = tokenizer.Get(key);
    if (v.kind() != ParamValue::Kind::kString || v.AsString().empty()) continue;
    const std::string src = v.AsString();
    if (!FileExists(src) || std::filesystem::is_directory(src)) continue;
    const std::string name = "assets/" + std::filesystem::path(src).filename().string();
    CreateDirectories(JoinPath(dir, "assets"));
    AtomicWriteFile(JoinPath(dir, name), ReadFileToString(src, uint64_t{1} << 32));
    tokenizer.Set(key, name);
    bundle.Add(name);
  }
  AtomicWriteFile(JoinPath(dir, "tokenizer_params.pb"), tokenizer.ToProtoBytes());
  bundle.Add("tokenizer_params.pb");
}

// Copies the files the main task reads at inference (BaseTask::AssetParams, e.g. a lexicon) to
// assets/, pointing p at them.
void WriteTaskAssets(BundleFiles& bundle, const BaseModel& model, Params& p) {
  const std::string& dir = bundle.dir;
  for (const auto& key : model.task().AssetParams()) {
    const std::string full = StrCat(MainTaskPath(p), ".", key);
    if (!p.GetParams(MainTaskPath(p)).Contains(key) ||
        p.Get(full).kind() != ParamValue::Kind::kString) {
      continue;
    }
    const std::string src = p.GetString(full);
    if (src.empty()) continue;
    std::string name = "assets/" + std::filesystem::path(src).filename().string();
    if (bundle.files.contains(name)) {
      name = StrCat("assets/", key, "_", std::filesystem::path(src).filename().string());
    }
    CreateDirectories(JoinPath(dir, "assets"));
    AtomicWriteFile(JoinPath(dir, name), ReadFileToString(src, uint64_t{1} << 32));
    p.Set(full, name);
    bundle.Add(name);
  }
}

// A feed's or fetch's spec in the inference graph proto.
void ToProto(const TensorSpec& s, proto::TensorSpec* out) {
  out->set_dtype(s.dtype);
  out->set_rank(s.rank);
  out->set_optional(s.optional);
  out->set_bytes(s.bytes);
  out->set_doc(s.doc);
  if (s.min) out->set_min(*s.min);
  if (s.max) out->set_max(*s.max);
}

// The inference graph: the task's subgraphs (those asked for: all when `wanted` is empty) and
// the params text.
void WriteInferenceGraph(BundleFiles& bundle, const BaseModel& model, const Params& p,
                         std::vector<std::string> wanted) {
  const auto declared = model.task().Inference();
  if (declared.empty()) {
    throw FailedPreconditionError(
        StrCat("export: the task of this model (", model.task().params().ClsKey(),
               ") declares no inference subgraphs. A task exports what it declares: override "
               "Inference() (each subgraph's feeds and fetches) and RunInference() (computes "
               "them), as TransformerLmTask does in glossa/tasks/lm/transformer_lm.cc, or derive "
               "your task from a task that has them (TransformerLmTask, mt::TransformerModel) "
               "and keep its subgraphs; docs/inference.md"));
  }
  proto::InferenceGraph graph;
  graph.set_model_params(p.ToText());
  if (wanted.empty()) {
    for (const auto& [name, spec] : declared) wanted.push_back(name);
  }
  for (const auto& name : wanted) {
    auto it = declared.find(name);
    if (it == declared.end()) {
      std::vector<std::string> names;
      for (const auto& [n, s] : declared) names.push_back(n);
      throw NotFoundError(StrCat("export: the task has no subgraph '", name, "' (it has: ",
                                 Join(names, ", "), ")"));
    }
    proto::InferenceSubgraph& sg = (*graph.mutable_subgraphs())[name];
    sg.set_doc(it->second.doc);
    for (const auto& [k, s] : it->second.feeds) ToProto(s, &(*sg.mutable_feeds())[k]);
    for (const auto& [k, s] : it->second.fetches) ToProto(s, &(*sg.mutable_fetches())[k]);
  }
  std::string graph_text;
  google::protobuf::TextFormat::PrintToString(graph, &graph_text);
  AtomicWriteFile(JoinPath(bundle.dir, "inference_graph.pbtxt"), graph_text);
  bundle.Add("inference_graph.pbtxt");
}

// Reports a line of progress through o.log, when set.
void Say(const ExportOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// Copies the exported (EMA) weights into the model's variables, for the exports that read them.
void LoadExportedWeights(const BaseModel& model, const std::map<std::string, at::Tensor>& weights) {
  at::NoGradGuard no_grad;
  for (const auto& [info, t] : model.AllVariables()) {
    auto it = weights.find(info.full_name);
    if (it != weights.end()) const_cast<at::Tensor&>(t).copy_(it->second.to(t.scalar_type()));
  }
}

// The task's networks (--torchscript: BaseTask::ExportTorchScript under torchscript/; --onnx:
// BaseTask::ExportOnnx under onnx/), exported from its variables, which get the exported (EMA)
// weights in float32 first, once for both.
void WriteNetworks(BundleFiles& bundle, const BaseModel& model,
                   const std::map<std::string, at::Tensor>& weights, const ExportOptions& o) {
  if (!o.torchscript && !o.onnx) return;
  LoadExportedWeights(model, weights);
  auto write = [&](const char* what, const std::string& sub, const auto& exporter) {
    Say(o, StrCat("export: writing the ", what));
    for (const auto& name : exporter(JoinPath(bundle.dir, sub))) bundle.Add(sub + "/" + name);
  };
  if (o.torchscript) {
    write("TorchScript network", "torchscript",
          [&](const std::string& dir) { return model.task().ExportTorchScript(dir); });
  }
  if (o.onnx) {
    write("ONNX networks", "onnx", [&](const std::string& dir) { return model.task().ExportOnnx(dir); });
  }
}

// weights.safetensors, with the step as its global_step.
void WriteWeights(BundleFiles& bundle, const std::map<std::string, at::Tensor>& weights,
                  int64_t step, const ExportOptions& o) {
  int64_t bytes = 0;
  for (const auto& [name, t] : weights) bytes += static_cast<int64_t>(t.nbytes());
  char mb[32];
  std::snprintf(mb, sizeof(mb), "%.1f", bytes / 1e6);
  Say(o, StrCat("export: writing ", weights.size(), " weights (", mb, " MB, ", o.dtype,
                ") of step ", step));
  SaveSafetensors(JoinPath(bundle.dir, "weights.safetensors"), weights,
                  {{"global_step", std::to_string(step)}});
  bundle.Add("weights.safetensors");
}

}  // namespace

int64_t ExportBundle(const ExportOptions& o) {
  CheckExportOptions(o);
  // The model without its training inputs; the main task's tokenizer kept apart.
  Params p = o.model_params.Copy();
  std::optional<Params> tokenizer = MainTokenizer(p);
  for (const auto& task : TaskPaths(p)) p.Set(task + ".input", nullptr);
  // (Seeded only to build it: the checkpoint overwrites every variable.)
  auto model = InstantiateLayer<BaseModel>(
      p.IsSet("random_seed") ? p : p.Copy().Set("random_seed", 0));
  const std::shared_ptr<ExponentialMovingAverage> ema = MakeModelEma(*model);
  const SafetensorsContents ckpt = LoadCheckpoint(o.checkpoint);
  const std::optional<int64_t> step = RestoreForEval(ckpt, *model, ema.get());
  if (!step) throw DataLossError(StrCat("export: checkpoint '", o.checkpoint, "' has no global_step"));
  std::map<std::string, at::Tensor> weights = ExportedWeights(*model, ema.get(), o);
  if (o.dtype == "bfloat16") p.Set("dtype", DType::kBFloat16);
  if (o.quantize != "none") FloatActivations(p);  // int8 and bf16 weights take float32 inputs
  // Everything is written to a staging directory beside out_dir and renamed into place at the end:
  // an export that fails leaves nothing under out_dir (one that is killed, a "<out_dir>.partial-
  // <pid>" directory beside it).
  std::string target = o.out_dir;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  const std::string dir = StrCat(target, ".partial-", ::getpid());
  std::filesystem::remove_all(dir);
  CreateDirectories(dir);
  StagingCleanup cleanup{dir};
  BundleFiles bundle{dir};
  if (tokenizer) WriteTokenizer(bundle, *tokenizer);
  WriteTaskAssets(bundle, *model, p);
  WriteInferenceGraph(bundle, *model, p, o.subgraphs);
  AtomicWriteFile(JoinPath(dir, "model_params.pb"), p.ToProtoBytes());
  bundle.Add("model_params.pb");
  AtomicWriteFile(JoinPath(dir, "model_params.txt"), p.ToText());
  bundle.Add("model_params.txt");
  WriteNetworks(bundle, *model, weights, o);
  WriteWeights(bundle, weights, *step, o);
  json manifest = {{"format", kFormat},
                   {"format_version", kBundleFormatVersion},
                   {"created", NowIso8601()},
                   {"source_checkpoint", o.checkpoint},
                   {"global_step", *step},
                   {"dtype", o.dtype},
                   {"quantize", o.quantize},
                   {"files", bundle.files}};
  manifest[kManifestHashKey] = ManifestHash(manifest);
  AtomicWriteFile(JoinPath(dir, kManifest), manifest.dump(2) + "\n");
  // The target was missing or empty when the export began; another export (or anyone) may have
  // filled it meanwhile: then this one fails and its staging directory goes (cleanup), never
  // touching what is there.
  std::error_code ec;
  if (FileExists(target)) std::filesystem::remove(target, ec);  // only removes an empty directory
  if (ec || (std::filesystem::rename(dir, target, ec), ec)) {
    throw AbortedError(StrCat("export: '", o.out_dir, "' was filled by something else while this "
                              "export ran (", ec.message(), "); nothing of this export was kept"));
  }
  cleanup.armed = false;
  return *step;
}

void CheckFiniteWeights(const std::map<std::string, at::Tensor>& weights,
                        const std::string& where) {
  for (const auto& [name, t] : weights) {
    if (!t.is_floating_point() || t.numel() == 0) continue;
    const int64_t bad = (~at::isfinite(t)).sum().item<int64_t>();
    if (bad > 0) {
      throw DataLossError(StrCat(where, ": weight '", name, "' has ", bad, " NaN or Inf value(s) of ",
                                 t.numel(), "; a model with non-finite weights gives no answers "
                                 "(export an earlier checkpoint, e.g. train/healthy_checkpoint)"));
    }
  }
}

std::string Sha256File(const std::string& path) { return Sha256FileImpl(path); }

namespace {

void CheckManifestHash(const json& m, const std::string& path) {
  if (!m.contains(kManifestHashKey) || !m[kManifestHashKey].is_string()) {
    throw DataLossError(StrCat("bundle manifest '", path, "' has no ", kManifestHashKey,
                               ": it was altered, or exported by a Glossa from before 2026-12-05 "
                               "(export the checkpoint again)"));
  }
  if (m[kManifestHashKey].get<std::string>() != ManifestHash(m)) {
    throw DataLossError(StrCat("bundle manifest '", path, "' does not match its ", kManifestHashKey,
                               ": a field of it (quantize, dtype, global_step, files, ...) was "
                               "altered"));
  }
}

}  // namespace

std::map<std::string, std::string> VerifyBundle(const std::string& dir) {
  const std::string path = JoinPath(dir, kManifest);
  if (!FileExists(dir)) {
    throw NotFoundError(StrCat("bundle '", dir, "' does not exist (make one with glossa export)"));
  }
  if (!FileExists(path)) {
    throw DataLossError(StrCat("bundle '", dir, "' has no ", kManifest,
                               " (not a bundle, or its export did not finish)"));
  }
  json m;
  try {
    m = json::parse(ReadFileToString(path, 16 << 20));
  } catch (const json::exception& e) {
    throw DataLossError(StrCat("bundle manifest '", path, "' is not valid JSON: ", e.what()));
  }
  auto field = [&](const char* key, bool (json::*is)() const noexcept) -> const json& {
    if (!m.is_object() || !m.contains(key) || !(m[key].*is)()) {
      throw DataLossError(StrCat("bundle manifest '", path, "': missing or malformed '", key, "'"));
    }
    return m[key];
  };
  if (field("format", &json::is_string).get<std::string>() != kFormat) {
    throw DataLossError(StrCat("bundle manifest '", path, "': format is not '", kFormat, "'"));
  }
  const int64_t version = field("format_version", &json::is_number_integer).get<int64_t>();
  if (version != kBundleFormatVersion) {
    throw InvalidArgumentError(StrCat("bundle '", dir, "' has format_version ", version,
                                      "; this Glossa reads version ", kBundleFormatVersion));
  }
  if (field("global_step", &json::is_number_integer).get<int64_t>() < 0) {
    throw DataLossError(StrCat("bundle manifest '", path, "': global_step is negative"));
  }
  // Absent in bundles from before int8 export: none.
  const json quantize = m.contains("quantize") ? m["quantize"] : json("none");
  if (!quantize.is_string() || (quantize != "none" && quantize != "int8" && quantize != "bf16")) {
    throw DataLossError(StrCat("bundle manifest '", path, "': quantize must be \"none\", "
                               "\"int8\" or \"bf16\", got ", quantize.dump()));
  }
  const json& files = field("files", &json::is_object);
  for (const char* required : {"model_params.pb", "weights.safetensors", "inference_graph.pbtxt"}) {
    if (!files.contains(required)) {
      throw DataLossError(StrCat("bundle manifest '", path, "' lists no ", required));
    }
  }
  for (auto it = files.begin(); it != files.end(); ++it) {
    const std::string name = it.key();
    if (name.find("..") != std::string::npos || name.empty() || name[0] == '/') {
      throw DataLossError(StrCat("bundle manifest '", path, "': bad file name '", name, "'"));
    }
    const std::string file = JoinPath(dir, name);
    if (!FileExists(file)) {
      throw DataLossError(StrCat("bundle '", dir, "': ", name, " is missing"));
    }
    if (!it.value().is_object() || !it.value().contains("bytes") ||
        !it.value().contains("sha256") || !it.value()["bytes"].is_number_unsigned() ||
        !it.value()["sha256"].is_string()) {
      throw DataLossError(StrCat("bundle manifest '", path, "': entry '", name,
                                 "' is malformed (it needs \"bytes\": a non-negative integer "
                                 "and \"sha256\": a string)"));
    }
    const uint64_t bytes = it.value()["bytes"].get<uint64_t>();
    if (FileSize(file) != bytes) {
      throw DataLossError(StrCat("bundle '", dir, "': ", name, " is ", FileSize(file),
                                 " bytes, the manifest says ", bytes, " (truncated or replaced)"));
    }
    if (Sha256File(file) != it.value()["sha256"].get<std::string>()) {
      throw DataLossError(
          StrCat("bundle '", dir, "': ", name, " does not match its SHA-256 in the manifest"));
    }
  }
  // Last, so that a field that is wrong by itself is named as such.
  CheckManifestHash(m, path);
  std::map<std::string, std::string> out;
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (it.key() == kManifestHashKey) continue;
    if (it.value().is_string()) out[it.key()] = it.value().get<std::string>();
    if (it.value().is_number_integer()) out[it.key()] = std::to_string(it.value().get<int64_t>());
  }
  return out;
}

namespace {

// Completes Params a bundle was written with by the params its classes define today and it
// lacks (a bundle exported before a param was added loads with that param's default), listing
// each added key in `added`.
void AddNewDefaults(Params& p, const std::string& prefix, std::vector<std::string>* added) {
  if (p.Contains("cls") && p.Get("cls").kind() == ParamValue::Kind::kClass) {
    const std::string& key = p.Get("cls").AsClass().key;
    if (ClassRegistry::Contains(key) && ClassRegistry::Get(key).default_params) {
      const Params defaults = ClassRegistry::Get(key).default_params();
      for (const auto& e : defaults) {
        if (p.Contains(e.name)) continue;
        p.Define(e.name, e.value, e.doc);
        added->push_back(prefix + e.name);
      }
    }
  }
  for (const std::string& name : p.Keys()) {
    if (p.Get(name).is_params()) AddNewDefaults(p.GetParams(name), prefix + name + ".", added);
  }
}

Params ParamsFromBundleFile(const std::string& dir, const char* name) {
  try {
    return Params::FromProtoBytes(ReadFileToString(JoinPath(dir, name)));
  } catch (const Error& e) {
    throw DataLossError(StrCat("bundle '", dir, "': ", name, " does not load: ", e.message()));
  }
}

}  // namespace

LoadedBundle LoadBundle(const std::string& dir) {
  LoadedBundle b;
  b.dir = dir;
  b.manifest = VerifyBundle(dir);
  b.global_step = std::stoll(b.manifest.at("global_step"));
  b.model_params = ParamsFromBundleFile(dir, "model_params.pb");
  AddNewDefaults(b.model_params, "", &b.defaulted_params);
  if (!b.defaulted_params.empty()) {
    std::fprintf(stderr, "glossa: bundle '%s' predates %zu param(s) of its classes; using their "
                 "defaults: %s\n", dir.c_str(), b.defaulted_params.size(),
                 Join(b.defaulted_params, ", ").c_str());
  }
  proto::InferenceGraph graph;
  if (!google::protobuf::TextFormat::ParseFromString(
          ReadFileToString(JoinPath(dir, "inference_graph.pbtxt")), &graph)) {
    throw DataLossError(StrCat("bundle '", dir, "': inference_graph.pbtxt does not parse"));
  }
  auto from_proto = [](const proto::TensorSpec& s) {
    TensorSpec t{s.dtype(), s.rank(), s.optional(), s.doc(), s.bytes()};
    if (s.has_min()) t.min = s.min();
    if (s.has_max()) t.max = s.max();
    return t;
  };
  for (const auto& [name, sg] : graph.subgraphs()) {
    InferenceSubgraphSpec& spec = b.subgraphs[name];
    spec.doc = sg.doc();
    for (const auto& [k, s] : sg.feeds()) spec.feeds[k] = from_proto(s);
    for (const auto& [k, s] : sg.fetches()) spec.fetches[k] = from_proto(s);
  }
  b.model_params.Set("is_inference", true);
  // The main task's asset files (ExportBundle) are found relative to the bundle.
  {
    Params& task = b.model_params.GetParams(MainTaskPath(b.model_params));
    for (const auto& key : task.Keys()) {
      const ParamValue& v = task.Get(key);
      if (v.kind() == ParamValue::Kind::kString && v.AsString().rfind("assets/", 0) == 0) {
        task.Set(key, JoinPath(dir, v.AsString()));
      }
    }
  }
  // Initial values are overwritten by the weights: a fixed seed spares the "no random_seed" note.
  if (!b.model_params.IsSet("random_seed")) b.model_params.Set("random_seed", 0);
  b.model = InstantiateLayer<BaseModel>(b.model_params);
  std::map<std::string, at::Tensor> vars;
  for (const auto& [info, t] : b.model->AllVariables()) vars[info.full_name] = t;
  const SafetensorsContents weights = LoadSafetensors(JoinPath(dir, "weights.safetensors"));
  CheckFiniteWeights(weights.tensors, StrCat("bundle '", dir, "': weights.safetensors"));
  RestoreVariables(weights, vars);
  const std::string tok = JoinPath(dir, "tokenizer_params.pb");
  if (FileExists(tok)) {
    Params tp = ParamsFromBundleFile(dir, "tokenizer_params.pb");
    for (const auto& key : tp.Keys()) {
      const ParamValue& v = tp.Get(key);
      if (v.kind() == ParamValue::Kind::kString && v.AsString().rfind("assets/", 0) == 0) {
        tp.Set(key, JoinPath(dir, v.AsString()));
      }
    }
    b.tokenizer = InstantiateLayer<BaseTokenizer>(tp);
  }
  return b;
}

}  // namespace glossa
