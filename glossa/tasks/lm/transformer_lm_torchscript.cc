// `glossa export --torchscript` for the Transformer LM: the network from ids to log-probs as a
// TorchScript module (torch::jit::Module with the weights as parameters and a generated forward),
// which stock PyTorch loads with torch.jit.load. The forward repeats the ATen calls of the layers
// (glossa/layers/) so that it computes what TransformerLmTask::Logits computes; configurations it
// does not cover are Unimplemented naming the setting.
#include <torch/script.h>

#include <cmath>
#include <sstream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "glossa/tasks/lm/transformer_lm.h"

namespace glossa {

namespace {

// Adds "name" as a float32 parameter (a copy) and returns the name.
std::string Param(torch::jit::Module& m, const std::string& name, const at::Tensor& t) {
  m.register_parameter(name, t.detach().to(at::kFloat).clone().contiguous(), false);
  return "self." + name;
}

[[noreturn]] void Unsupported(const BaseLayer& layer, const std::string& what) {
  throw UnimplementedError(StrCat("--torchscript: layer '", layer.path(), "': ", what,
                                  " is not covered by the TorchScript export"));
}

// Python source of a double, exact (17 significant digits round-trip).
std::string Num(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  std::string out = s.str();
  if (out.find_first_of(".en") == std::string::npos) out += ".0";
  return out;
}

// The effective layer-norm weight: Lingvo's (1 + scale) unless direct_scale, computed with the
// same ATen op the layer uses.
std::string LayerNormCall(torch::jit::Module& m, const BaseLayer& layer, const std::string& name,
                          const std::string& x) {
  const auto* ln = dynamic_cast<const LayerNorm*>(&layer);
  if (ln == nullptr) Unsupported(layer, "a normalization other than LayerNorm");
  at::Tensor scale = ln->GetVariable("scale");
  if (!ln->params().GetBool("direct_scale")) scale = scale + 1;
  const std::string w = Param(m, name + "_scale", scale);
  const std::string b = Param(m, name + "_bias", ln->GetVariable("bias"));
  return StrCat("torch.layer_norm(", x, ", [", scale.size(0), "], ", w, ", ", b, ", ",
                Num(ln->params().GetFloat("epsilon")), ")");
}

// x·w + b over the flattened batch (ProjectionLayer / MultiHeadedProjectionLayer / softmax).
void Addmm(std::ostringstream& code, const std::string& out, const std::string& x,
           const std::string& b, const std::string& w, const std::string& w_shape,
           const std::string& out_shape) {
  code << "    " << out << " = torch.addmm(" << b << ", " << x << ".reshape(-1, " << w_shape
       << "[0]), " << w << ").view(" << out_shape << ")\n";
}

// Emits x: the embeddings of ids (times √d where the layer scales so) plus the sinusoidal
// positions (computed in float64, as PositionalEmbeddingLayer does).
void EmitEmbeddings(torch::jit::Module& m, std::ostringstream& code, const EmbeddingLayer& emb,
                    const PositionalEmbeddingLayer& pos) {
  const int64_t d = emb.params().GetInt("embedding_dim");
  code << "    x = torch.embedding(" << Param(m, "emb_var", emb.GetVariable("emb_var"))
       << ", ids.long())\n";
  if (emb.params().GetBool("scale_sqrt_depth")) {
    code << "    x = x * " << Num(std::sqrt(static_cast<double>(d))) << "\n";
  }
  const int64_t num_timescales = pos.params().GetInt("embedding_dim") / 2;
  const double min_ts = pos.params().GetFloat("min_timescale");
  const double max_ts = pos.params().GetFloat("max_timescale");
  const double inc =
      std::log(max_ts / min_ts) / std::max<double>(static_cast<double>(num_timescales) - 1, 1);
  code << "    inv = " << Num(min_ts) << " * torch.exp(torch.arange(" << num_timescales
       << ").double() * " << Num(-inc) << ")\n"
       << "    scaled = torch.arange(t).float().double().unsqueeze(-1) * inv\n"
       << "    signal = torch.cat([torch.sin(scaled), torch.cos(scaled)], -1)\n";
  if (pos.params().GetInt("embedding_dim") % 2 == 1) {
    code << "    signal = torch.constant_pad_nd(signal, [0, 1])\n";
  }
  code << "    x = x + signal.float()\n";
}

// Emits `layer`'s self-attention block (pre-layer-norm, causal) on x, its weights registered
// with the name prefix `l`.
void EmitSelfAttention(torch::jit::Module& m, std::ostringstream& code,
                       const TransformerLayer& layer, const std::string& l) {
  const auto* sa_ptr =
      dynamic_cast<const TransformerAttentionLayer*>(&layer.GetChild("self_atten"));
  if (sa_ptr == nullptr) Unsupported(layer, "self-attention other than TransformerAttentionLayer");
  const TransformerAttentionLayer& sa = *sa_ptr;
  if (!sa.params().GetBool("pre_layer_norm")) Unsupported(sa, "post-layer-norm attention");
  if (!sa.params().GetBool("is_masked")) Unsupported(sa, "non-causal self-attention");
  const auto* mha = dynamic_cast<const MultiHeadedAttention*>(&sa.GetChild("atten"));
  if (mha == nullptr) Unsupported(sa.GetChild("atten"), "attention other than MultiHeadedAttention");
  code << "    h = " << LayerNormCall(m, sa.GetChild("ln"), l + "atten_ln", "x") << "\n";
  for (const char* proj : {"query", "key", "value"}) {
    const auto& pl = mha->GetChild(proj);
    const at::Tensor w = pl.GetVariable("w");  // [D, N, H]
    if (!pl.params().GetBool("use_bias")) Unsupported(pl, "a projection without bias");
    const std::string wn = Param(m, StrCat(l, proj, "_w"), w.reshape({w.size(0), -1}));
    const std::string bn = Param(m, StrCat(l, proj, "_b"), pl.GetVariable("b").reshape({-1}));
    Addmm(code, std::string(1, proj[0]), "h", bn, wn, StrCat("[", w.size(0), "]"),
          StrCat("b, t, ", w.size(1), ", ", w.size(2)));
  }
  if (mha->HasChild("per_dim_scale")) {
    const BaseLayer& pds = mha->GetChild("per_dim_scale");
    const int64_t dim = pds.params().GetInt("dim");
    const at::Tensor scale = at::softplus(pds.GetVariable("per_dim_scale")) *
                             (1.442695041 / std::sqrt(static_cast<double>(dim)));
    code << "    q = q * " << Param(m, l + "q_scale", scale) << "\n";
  } else {
    const int64_t dim = mha->GetChild("query").GetVariable("w").size(2);
    code << "    q = q * " << Num(1.0 / std::sqrt(static_cast<double>(dim))) << "\n";
  }
  code << "    logits = torch.einsum('btnh,bsnh->bnts', [q, k]) + bias\n"
       << "    probs = torch.softmax(logits, -1)\n"
       << "    ctx = torch.einsum('bnts,bsnh->btnh', [probs, v])\n";
  const auto& post = mha->GetChild("post");
  const at::Tensor w = post.GetVariable("w");  // [D, N, H]
  // [D, N·H], used transposed as the layer does (the same GEMM, the same rounding).
  const std::string wn =
      Param(m, l + "post_w", w.reshape({w.size(0), w.size(1) * w.size(2)})) + ".t()";
  const std::string bn = Param(m, l + "post_b", post.GetVariable("b"));
  code << "    x = x + torch.addmm(" << bn << ", ctx.reshape(-1, " << w.size(1) * w.size(2)
       << "), " << wn << ").view(b, t, " << w.size(0) << ")\n";
}

// Emits `layer`'s feed-forward block (pre-layer-norm, padded rows zeroed after each FC layer) on
// x, its weights registered with the name prefix `l`.
void EmitFeedForward(torch::jit::Module& m, std::ostringstream& code,
                     const TransformerLayer& layer, const std::string& l) {
  const auto* ff = dynamic_cast<const TransformerFeedForwardLayer*>(&layer.GetChild("fflayer"));
  if (ff == nullptr) Unsupported(layer.GetChild("fflayer"), "a feed-forward layer other than "
                                                            "TransformerFeedForwardLayer");
  if (!ff->params().GetBool("pre_layer_norm")) Unsupported(*ff, "post-layer-norm feed-forward");
  code << "    h = " << LayerNormCall(m, ff->GetChild("ln"), l + "ff_ln", "x") << "\n";
  for (const char* fc : {"fc0", "fc1"}) {
    const BaseLayer& f = ff->GetChild(fc);
    const at::Tensor w = f.GetVariable("w");
    const std::string wn = Param(m, StrCat(l, fc, "_w"), w);
    const std::string bn = Param(m, StrCat(l, fc, "_b"), f.GetVariable("b"));
    Addmm(code, "h", "h", bn, wn, StrCat("[", w.size(0), "]"), StrCat("b, t, ", w.size(1)));
    const std::string act = f.params().GetString("activation");
    if (act == "RELU") {
      code << "    h = torch.relu(h)\n";
    } else if (act != "NONE") {
      Unsupported(f, StrCat("activation ", act));
    }
    code << "    if any_pad:\n        h = h * (1 - pad)\n";
  }
  const double rw = ff->params().GetFloat("residual_weight");
  code << "    x = torch.add(x, h, alpha=" << Num(rw) << ")\n";
}

}  // namespace

std::vector<std::string> TransformerLmTask::ExportTorchScript(const std::string& dir) const {
  torch::jit::Module m("__torch__.glossa.TransformerLm");
  std::ostringstream code;
  code << "def forward(self, ids: Tensor, paddings: Tensor) -> Tensor:\n"
       << "    b = ids.size(0)\n    t = ids.size(1)\n";
  EmitEmbeddings(m, code, *emb_, *position_emb_);
  // The attention mask: padded keys and the future, as a bias of the float32 lowest value.
  code << "    mask = (paddings > 0.5).view(b, 1, 1, t) | "
          "(torch.ones([t, t]).triu(1) > 0.5).view(1, 1, t, t)\n"
       << "    bias = torch.zeros(mask.size()).masked_fill(mask, "
       << Num(std::numeric_limits<float>::lowest()) << ")\n"
       << "    pad = paddings.float().unsqueeze(-1)\n"
       << "    any_pad = bool(torch.any(paddings != 0))\n";
  const TransformerStack& stack = *stack_;
  const auto layers = stack.GetChildren("x_layers");
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto* layer = dynamic_cast<const TransformerLayer*>(layers[i]);
    if (layer == nullptr) Unsupported(*layers[i], "a stack layer other than TransformerLayer");
    if (layer->params().GetBool("has_aux_atten")) Unsupported(*layer, "cross-attention");
    const std::string l = StrCat("l", i, "_");
    EmitSelfAttention(m, code, *layer, l);
    EmitFeedForward(m, code, *layer, l);
  }
  if (stack.HasChild("final_ln")) {
    code << "    x = " << LayerNormCall(m, stack.GetChild("final_ln"), "final_ln", "x") << "\n";
  }
  const SimpleFullSoftmax& sm = *softmax_;
  if (!sm.params().Get("logits_abs_max").is_none()) Unsupported(sm, "logits_abs_max");
  const at::Tensor w = sm.GetVariable("weight_0");
  Addmm(code, "logits", "x", Param(m, "softmax_b", sm.GetVariable("bias_0")),
        Param(m, "softmax_w", w), StrCat("[", w.size(0), "]"), StrCat("b, t, ", w.size(1)));
  code << "    return torch.log_softmax(logits, -1)\n";
  try {
    m.define(code.str());
  } catch (const c10::Error& e) {
    throw InternalError(StrCat("--torchscript: the generated forward does not compile: ",
                               e.what_without_backtrace(), "\n", code.str()));
  }
  CreateDirectories(dir);
  std::ostringstream bytes;
  m.save(bytes);
  AtomicWriteFile(JoinPath(dir, "network.pt"), bytes.str());
  return {"network.pt"};
}

}  // namespace glossa
