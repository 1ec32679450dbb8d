// ONNX from the layers' own definitions, as TorchScript is (glossa/layers/torchscript.h): the
// export room (glossa/layers/onnx_export.h) appends each exportable layer's nodes, by its class,
// to an ONNX graph with its weights as initializers, and a task strings the pieces into a model
// (`glossa export --onnx`: the LM's scoring network, the MT encoder and the MT decoder's step).
// The model is built on Debian's libonnx (its protobuf schema), checked with onnx::checker and
// onnx's strict shape inference, opset 17.
//
//   OnnxGraph g("lm_score");
//   const std::string ids = g.Input("ids", at::kLong, {"B", "T"});
//   std::string x = EmitOnnx(emb, g, ids, "emb");      // every layer in turn
//   g.Output(x, "log_probs", at::kFloat, {"B", "T"});
//   g.Save(dir + "/lm_score.onnx");
//
// Values the layers read, set by the task with Set(): "self_bias" and "causal_bias" (additive
// attention biases [B or 1, 1, T or 1, S], float32), "nonpad" ([B, T, 1], 1 = a real position),
// and for cross-attention "source", "source_bias".
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace glossa {

class BaseLayer;

// An attribute of an ONNX node.
struct OnnxAttr {
  enum class Kind { kInt, kInts, kFloat, kString };
  static OnnxAttr Int(std::string name, int64_t v);
  static OnnxAttr Ints(std::string name, std::vector<int64_t> v);
  static OnnxAttr Float(std::string name, float v);
  static OnnxAttr String(std::string name, std::string v);
  std::string name;
  Kind kind = Kind::kInt;
  int64_t i = 0;
  std::vector<int64_t> ints;
  float f = 0;
  std::string s;
};

class OnnxGraph {
 public:
  static constexpr int64_t kOpset = 17;
  explicit OnnxGraph(std::string name);
  ~OnnxGraph();
  OnnxGraph(const OnnxGraph&) = delete;
  OnnxGraph& operator=(const OnnxGraph&) = delete;

  // A graph input; dims are numbers ("4") or symbolic names ("B"). Returns its value name.
  std::string Input(const std::string& name, at::ScalarType type,
                    const std::vector<std::string>& dims);
  // Declares `value` a graph output named `name` (an Identity node when the names differ).
  void Output(const std::string& value, const std::string& name, at::ScalarType type,
              const std::vector<std::string>& dims);
  // A weight as an initializer named `name` (float32, a copy). Returns its value name.
  std::string Weight(const std::string& name, const at::Tensor& t);
  // A constant initializer (any dtype; copied), under a fresh name.
  std::string Const(const at::Tensor& t);
  std::string ConstInts(const std::vector<int64_t>& v);  // int64 [n]
  std::string ConstScalar(float v);                      // float32 []
  // One node; returns its (first) output, a fresh value name.
  std::string Op(const std::string& type, const std::vector<std::string>& inputs,
                 const std::vector<OnnxAttr>& attrs = {});
  // One node with n outputs.
  std::vector<std::string> Ops(const std::string& type, const std::vector<std::string>& inputs,
                               int n_outputs, const std::vector<OnnxAttr>& attrs = {});
  // MatMul(x, w) + b (w [in, out]; b "" for none).
  std::string Affine(const std::string& x, const std::string& w, const std::string& b);

  // From paddings [B, T] (float32, 1 = padded): sets "self_bias" (padded keys, [B, 1, 1, T]),
  // "causal_bias" (also the future, [B, 1, T, T]) at float32's lowest value as the layers mask,
  // and "nonpad" ([B, T, 1]). Returns 1 - paddings [B, T].
  std::string SetPaddings(const std::string& paddings);
  // Named values the task sets for its layers (Get of a name not set: InternalError).
  void Set(const std::string& key, const std::string& value) { named_[key] = value; }
  const std::string& Get(const std::string& key) const;
  bool Has(const std::string& key) const { return named_.count(key) != 0; }

  // Checks the model (onnx::checker, strict shape inference) and writes it atomically. A model the
  // checker refuses is InternalError with the checker's words (an exporter bug, never the user's).
  void Save(const std::string& path) const;
  // The serialized ModelProto, checked as Save checks it.
  std::string SerializeChecked() const;
  int64_t num_nodes() const;

  // `what` is not something the ONNX export covers: UnimplementedError naming the layer.
  [[noreturn]] static void Unsupported(const BaseLayer& layer, const std::string& what);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::map<std::string, std::string> named_;
};

}  // namespace glossa
