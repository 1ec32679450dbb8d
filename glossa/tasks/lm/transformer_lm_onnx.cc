// `glossa export --onnx` for the Transformer LM: the scoring network of the "default" subgraph
// (ids, labels, paddings -> each label's log-prob and the sum) as an ONNX model. Each layer adds
// its own nodes (BaseLayer::EmitOnnx, glossa/layers/onnx_graph.h); the task adds the masks and
// the scoring. A layer or setting the export does not cover is Unimplemented naming it.
#include <ATen/ATen.h>

#include "glossa/base/file.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/onnx_graph.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "glossa/tasks/lm/transformer_lm.h"

namespace glossa {

std::vector<std::string> TransformerLmTask::ExportOnnx(const std::string& dir) const {
  OnnxGraph g("lm_score");
  const std::string ids = g.Input("ids", at::kLong, {"B", "T"});
  const std::string labels = g.Input("labels", at::kLong, {"B", "T"});
  const std::string paddings = g.Input("paddings", at::kFloat, {"B", "T"});
  const std::string t = g.Op("Gather", {g.Op("Shape", {ids}), g.Const(at::scalar_tensor(1, at::kLong))});
  const std::string nonpad2 = g.SetPaddings(paddings);  // the attention biases, 1 - paddings

  std::string x = emb_->EmitOnnx(g, ids, "emb.");
  x = g.Op("Add", {x, position_emb_->EmitOnnx(g, t, "position_emb.")});
  x = stack_->EmitOnnx(g, x, "stack.");
  const std::string log_probs =
      g.Op("LogSoftmax", {softmax_->EmitOnnx(g, x, "softmax.")}, {OnnxAttr::Int("axis", -1)});
  const std::string picked = g.Op(
      "GatherElements", {log_probs, g.Op("Unsqueeze", {labels, g.ConstInts({2})})},
      {OnnxAttr::Int("axis", 2)});
  const std::string scores =
      g.Op("Mul", {g.Op("Squeeze", {picked, g.ConstInts({2})}), nonpad2});
  g.Output(scores, "log_probs", at::kFloat, {"B", "T"});
  g.Output(g.Op("ReduceSum", {scores, g.ConstInts({1})}, {OnnxAttr::Int("keepdims", 0)}),
           "total_log_prob", at::kFloat, {"B"});
  CreateDirectories(dir);
  g.Save(JoinPath(dir, "lm_score.onnx"));
  return {"lm_score.onnx"};
}

}  // namespace glossa
