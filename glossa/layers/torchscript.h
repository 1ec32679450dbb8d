// TorchScript from the layers' own definitions: the export room (glossa/layers/torchscript_export.h)
// writes each exportable layer's piece of a TorchScript forward, by its class, with the same ATen
// calls its FProp makes, and registers its weights; a task strings the pieces together into a
// module (the Transformer LM's `glossa export --torchscript`, glossa/tasks/lm/
// transformer_lm_outputs.cc).
//
//   TorchScriptWriter w;
//   w.Line("x = torch.embedding(" + w.Param("emb_var", emb) + ", ids.long())");
//   EmitTorchScript(stack, w, "x", "x", "");   // every layer in turn
//   // w.code() is the forward's body; w.params() the weights to register on the module.
//
// Names the pieces may read, set up by the task: b, t (batch and length), bias (the attention
// mask as an additive float32 bias [B or 1, 1, T, T]), pad ([B, T, 1], 1 = padded) and any_pad
// (whether any position is padded).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace glossa {

class BaseLayer;

class TorchScriptWriter {
 public:
  // Registers `t` (as float32, a copy) under `name` and returns "self.<name>".
  std::string Param(const std::string& name, const at::Tensor& t);
  // One line of the forward's body (indented).
  void Line(const std::string& code);
  // A double as TorchScript source, exact (17 significant digits).
  static std::string Num(double v);
  // `what` is not something the export covers: UnimplementedError naming the layer.
  [[noreturn]] static void Unsupported(const BaseLayer& layer, const std::string& what);

  const std::string& code() const { return code_; }
  const std::vector<std::pair<std::string, at::Tensor>>& params() const { return params_; }

 private:
  std::string code_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
};

}  // namespace glossa
