// What the Transformer LM writes for people and for other runtimes, beside training:
// - `glossa report`: the evaluation against the unigram baseline (unigram_baseline.h);
// - `glossa export --onnx`: the scoring network of the "default" subgraph (ids, labels, paddings ->
//   each label's log-prob and the sum) as an ONNX model, the export room adding each layer's
//   nodes by its class (glossa/layers/onnx_export.h) and the task the masks and the scoring;
// - `glossa export --torchscript`: the network from ids to log-probs as a TorchScript module that
//   stock PyTorch loads with torch.jit.load, each layer's piece of the forward written with the
//   ATen calls of its FProp (glossa/layers/torchscript_export.h).
// A layer or setting an export does not cover is Unimplemented naming it.
#include "glossa/tasks/lm/transformer_lm.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <torch/script.h>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/progress.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/core/step_seed.h"
#include "glossa/input/tokenizers.h"
#include "glossa/input/vocabulary_check.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/moe.h"
#include "glossa/layers/onnx_export.h"
#include "glossa/layers/onnx_graph.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/torchscript.h"
#include "glossa/layers/torchscript_export.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"
#include "glossa/tasks/lm/unigram_baseline.h"

namespace glossa {

std::string TransformerLmTask::Report(const ReportInputs& in) {
  for (const char* metric : {"log_pplx", "fraction_of_correct_next_step_preds"}) {
    if (!in.eval_metrics.count(metric))
      throw InvalidArgumentError(StrCat("report: the eval metrics lack ", metric));
  }
  if (!in.train_input) throw FailedPreconditionError("report: no Train input for the unigram");
  // The unigram baseline: token counts over one pass of Train, scored on the same split.
  std::unique_ptr<BaseInputGenerator> train_input = in.train_input();
  UnigramBaseline unigram(vocab_size_);
  CountProgress progress(stderr, "counting unigrams over Train", "batches");
  while (true) {
    try {
      unigram.Count(train_input->GetPreprocessedInputBatch());
    } catch (const OutOfRangeError&) {
      break;
    }
    progress.Add();
  }
  progress.Done(StrCat(", ", WithCommas(static_cast<int64_t>(
                                 unigram.total - static_cast<double>(unigram.counts.size()))),
                       " tokens"));
  input().Reset();
  double nll = 0, n = 0;
  while (true) {
    try {
      auto [a, b] = unigram.Score(input().GetPreprocessedInputBatch());
      nll += a;
      n += b;
    } catch (const OutOfRangeError&) {
      break;
    }
  }
  const double model_pplx = in.eval_metrics.at("log_pplx").first;
  const double unigram_pplx = nll / std::max(n, 1.0);
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof(buf), "%s step %lld on %s (%.0f tokens):\n", in.model_key.c_str(),
                static_cast<long long>(in.global_step), in.dataset.c_str(), n);
  out += buf;
  std::snprintf(buf, sizeof(buf),
                "  model   log_pplx: %.4f  (fraction_of_correct_next_step_preds: %.4f)\n",
                model_pplx, in.eval_metrics.at("fraction_of_correct_next_step_preds").first);
  out += buf;
  std::snprintf(buf, sizeof(buf), "  unigram log_pplx: %.4f\n  ratio model/unigram: %.3f\n",
                unigram_pplx, model_pplx / unigram_pplx);
  out += buf;
  out += "sampled continuations (prompt ||| sample):\n";
  for (int64_t i = 0; i < in.num_samples && i < static_cast<int64_t>(in.decode_lines.size()); ++i) {
    out += StrCat("  ", in.decode_lines[static_cast<size_t>(i)], "\n");
  }
  return out;
}

std::vector<std::string> TransformerLmTask::ExportOnnx(const std::string& dir) const {
  OnnxGraph g("lm_score");
  const std::string ids = g.Input("ids", at::kLong, {"B", "T"});
  const std::string labels = g.Input("labels", at::kLong, {"B", "T"});
  const std::string paddings = g.Input("paddings", at::kFloat, {"B", "T"});
  const std::string t = g.Op("Gather", {g.Op("Shape", {ids}), g.Const(at::scalar_tensor(1, at::kLong))});
  const std::string nonpad2 = g.SetPaddings(paddings);  // the attention biases, 1 - paddings

  std::string x = EmitOnnx(*emb_, g, ids, "emb.");
  x = g.Op("Add", {x, EmitOnnx(*position_emb_, g, t, "position_emb.")});
  x = EmitOnnx(*stack_, g, x, "stack.");
  const std::string log_probs =
      g.Op("LogSoftmax", {EmitOnnx(*softmax_, g, x, "softmax.")}, {OnnxAttr::Int("axis", -1)});
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

std::vector<std::string> TransformerLmTask::ExportTorchScript(const std::string& dir) const {
  // The forward, written by the export room for each layer's class: ids to log-probs.
  TorchScriptWriter w;
  w.Line("b = ids.size(0)");
  w.Line("t = ids.size(1)");
  EmitTorchScript(*emb_, w, "ids", "x", "");
  EmitTorchScript(*position_emb_, w, "t", "signal", "");
  w.Line("x = x + signal.float()");
  // The attention mask: padded keys and the future, as a bias of the float32 lowest value.
  w.Line("mask = (paddings > 0.5).view(b, 1, 1, t) | "
         "(torch.ones([t, t]).triu(1) > 0.5).view(1, 1, t, t)");
  w.Line(StrCat("bias = torch.zeros(mask.size()).masked_fill(mask, ",
                TorchScriptWriter::Num(std::numeric_limits<float>::lowest()), ")"));
  w.Line("pad = paddings.float().unsqueeze(-1)");
  w.Line("any_pad = bool(torch.any(paddings != 0))");
  EmitTorchScript(*stack_, w, "x", "x", "");
  EmitTorchScript(*softmax_, w, "x", "logits", "");
  w.Line("return torch.log_softmax(logits, -1)");

  torch::jit::Module m("__torch__.glossa.TransformerLm");
  for (const auto& [name, t] : w.params()) m.register_parameter(name, t, false);
  const std::string code =
      "def forward(self, ids: Tensor, paddings: Tensor) -> Tensor:\n" + w.code();
  try {
    m.define(code);
  } catch (const c10::Error& e) {
    throw InternalError(StrCat("--torchscript: the generated forward does not compile: ",
                               e.what_without_backtrace(), "\n", code));
  }
  CreateDirectories(dir);
  std::ostringstream bytes;
  m.save(bytes);
  AtomicWriteFile(JoinPath(dir, "network.pt"), bytes.str());
  return {"network.pt"};
}

}  // namespace glossa
