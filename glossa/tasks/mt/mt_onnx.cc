// `glossa export --onnx` for machine translation: the encoder (with every decoder layer's
// cross-attention keys and values, computed once per source) and one decoder step whose k/v
// caches are explicit inputs and outputs, as ONNX models. Each layer adds its own nodes
// (glossa/layers/onnx_export.h, by each layer's class, with the decoding pieces); a layer or setting
// the export does not cover is Unimplemented naming it.
#include <ATen/ATen.h>

#include <limits>

#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/onnx_export.h"
#include "glossa/layers/onnx_graph.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/tasks/mt/mt.h"
#include "glossa/tasks/mt/mt_decoder.h"
#include "glossa/tasks/mt/mt_encoder.h"

namespace glossa {
namespace mt {

std::string TransformerEncoder::EmitOnnxEncode(OnnxGraph& g, const std::string& ids,
                                               const std::string& paddings) const {
  const std::string s =
      g.Op("Gather", {g.Op("Shape", {ids}), g.Const(at::scalar_tensor(1, at::kLong))});
  g.SetPaddings(paddings);
  const std::string x = g.Op("Add", {EmitOnnx(*token_emb_, g, ids, "enc.token_emb."),
                                     EmitOnnx(*position_emb_, g, s, "enc.position_emb.")});
  return EmitOnnx(*stack_, g, x, "enc.stack.");
}

std::vector<std::string> TransformerDecoder::EmitOnnxSource(OnnxGraph& g,
                                                            const std::string& encoded) const {
  return EmitOnnxStackSource(*stack_, g, encoded, "dec.stack.");
}

void TransformerDecoder::WriteOnnxStep(const std::string& path) const {
  OnnxGraph g("mt_decoder_step");
  const std::string ids = g.Input("ids", at::kLong, {"N"});
  const std::string step = g.Input("step", at::kLong, {});
  const std::string source_paddings = g.Input("source_paddings", at::kFloat, {"N", "S"});
  std::vector<std::string> caches, sources;
  const int64_t layers = stack_->num_layers();
  for (int64_t i = 0; i < layers; ++i) {
    const at::Tensor w =
        stack_->GetDescendant(StrCat("x_layers[", i, "].self_atten.atten.query")).GetVariable("w");
    const std::vector<std::string> cache = {"N", "P", std::to_string(w.size(1)),
                                            std::to_string(w.size(2))};
    const std::vector<std::string> source = {"N", "S", std::to_string(w.size(1)),
                                             std::to_string(w.size(2))};
    caches.push_back(g.Input(StrCat("cache_k", i), at::kFloat, cache));
    caches.push_back(g.Input(StrCat("cache_v", i), at::kFloat, cache));
    sources.push_back(g.Input(StrCat("source_k", i), at::kFloat, source));
    sources.push_back(g.Input(StrCat("source_v", i), at::kFloat, source));
  }
  const std::string pad_keys =
      g.Op("Unsqueeze", {g.Op("Greater", {source_paddings, g.ConstScalar(0.5f)}),
                         g.ConstInts({1, 2})});  // [N, 1, 1, S]
  g.Set("source_bias", g.Op("Where", {pad_keys, g.ConstScalar(std::numeric_limits<float>::lowest()),
                                      g.ConstScalar(0.0f)}));
  // The token at position `step`: its embedding plus that row of the position table.
  const std::string x = EmitOnnx(*token_emb_, g, g.Op("Unsqueeze", {ids, g.ConstInts({1})}),
                                 "dec.token_emb.");  // [N, 1, D]
  const std::string positions =
      EmitOnnx(*position_emb_, g, g.Op("Add", {step, g.Const(at::scalar_tensor(1, at::kLong))}),
               "dec.position_emb.");
  const std::string row = g.Op("Gather", {positions, step}, {OnnxAttr::Int("axis", 0)});
  std::vector<std::string> new_caches;
  const std::string y = EmitOnnxStackStep(*stack_, g, g.Op("Add", {x, row}), "dec.stack.",
                                          caches, sources, &new_caches);
  const std::string h = g.Op("Squeeze", {y, g.ConstInts({1})});  // [N, D]
  const std::string logits =
      shared_emb_
          ? g.Affine(h, g.Weight("dec.softmax_w", token_emb_->GetVariable("emb_var").t().contiguous()),
                     g.Weight("dec.softmax_bias", GetVariable("softmax_bias")))
          : EmitOnnx(*softmax_, g, h, "dec.softmax.");
  g.Output(g.Op("LogSoftmax", {logits}, {OnnxAttr::Int("axis", -1)}), "log_probs", at::kFloat,
           {"N", std::to_string(vocab_size_)});
  for (int64_t i = 0; i < layers; ++i) {
    for (int kv = 0; kv < 2; ++kv) {
      const at::Tensor w =
          stack_->GetDescendant(StrCat("x_layers[", i, "].self_atten.atten.query")).GetVariable("w");
      g.Output(new_caches[2 * i + kv], StrCat(kv == 0 ? "new_cache_k" : "new_cache_v", i),
               at::kFloat, {"N", "P1", std::to_string(w.size(1)), std::to_string(w.size(2))});
    }
  }
  g.Save(path);
}

std::vector<std::string> TransformerModel::ExportOnnx(const std::string& dir) const {
  CreateDirectories(dir);
  {
    OnnxGraph g("mt_encoder");
    const std::string ids = g.Input("src_ids", at::kLong, {"B", "S"});
    const std::string paddings = g.Input("src_paddings", at::kFloat, {"B", "S"});
    const std::string encoded = encoder_->EmitOnnxEncode(g, ids, paddings);
    g.Output(encoded, "encoded", at::kFloat, {"B", "S", std::to_string(encoder_->model_dim())});
    const std::vector<std::string> kv = decoder_->EmitOnnxSource(g, encoded);
    for (size_t i = 0; i < kv.size(); ++i) {
      const at::Tensor w = decoder_->GetDescendant(StrCat("decoder_trans.x_layers[", i / 2,
                                                          "].cross_atten.atten.key"))
                               .GetVariable("w");  // [D, heads, dim]
      g.Output(kv[i], StrCat(i % 2 == 0 ? "source_k" : "source_v", i / 2), at::kFloat,
               {"B", "S", std::to_string(w.size(1)), std::to_string(w.size(2))});
    }
    g.Save(JoinPath(dir, "mt_encoder.onnx"));
  }
  decoder_->WriteOnnxStep(JoinPath(dir, "mt_decoder_step.onnx"));
  return {"mt_encoder.onnx", "mt_decoder_step.onnx"};
}

}  // namespace mt
}  // namespace glossa
