// `glossa export --torchscript` for the Transformer LM: the network from ids to log-probs as a
// TorchScript module (torch::jit::Module with the weights as parameters and a forward), which
// stock PyTorch loads with torch.jit.load. Each layer writes its own piece of the forward
// (BaseLayer::EmitTorchScript, glossa/layers/torchscript.h) with the ATen calls of its FProp, so
// the module computes what TransformerLmTask::Logits computes; a layer or setting the export does
// not cover is Unimplemented naming it.
#include <torch/script.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/torchscript.h"
#include "glossa/layers/transformer.h"
#include "glossa/tasks/lm/transformer_lm.h"

namespace glossa {

std::vector<std::string> TransformerLmTask::ExportTorchScript(const std::string& dir) const {
  // The forward, written by the layers themselves (BaseLayer::EmitTorchScript): ids to log-probs.
  TorchScriptWriter w;
  w.Line("b = ids.size(0)");
  w.Line("t = ids.size(1)");
  emb_->EmitTorchScript(w, "ids", "x", "");
  position_emb_->EmitTorchScript(w, "t", "signal", "");
  w.Line("x = x + signal.float()");
  // The attention mask: padded keys and the future, as a bias of the float32 lowest value.
  w.Line("mask = (paddings > 0.5).view(b, 1, 1, t) | "
         "(torch.ones([t, t]).triu(1) > 0.5).view(1, 1, t, t)");
  w.Line(StrCat("bias = torch.zeros(mask.size()).masked_fill(mask, ",
                TorchScriptWriter::Num(std::numeric_limits<float>::lowest()), ")"));
  w.Line("pad = paddings.float().unsqueeze(-1)");
  w.Line("any_pad = bool(torch.any(paddings != 0))");
  stack_->EmitTorchScript(w, "x", "x", "");
  softmax_->EmitTorchScript(w, "x", "logits", "");
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
