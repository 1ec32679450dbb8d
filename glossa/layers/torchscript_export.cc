#include "glossa/layers/torchscript_export.h"

#include <ATen/ATen.h>

#include <cmath>
#include <typeindex>
#include <unordered_map>

#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/torchscript.h"
#include "glossa/layers/transformer.h"
#include "glossa/layers/transformer_stack.h"

namespace glossa {

// A friend of the classes it exports: their emitters, by class. The task sets up b, t, bias, pad
// and any_pad (glossa/layers/torchscript.h).
class TorchScriptExport {
 public:
  using W = TorchScriptWriter;

  // x·w + b over the flattened batch, then the activation (RELU or NONE).
  static void Projection(const ProjectionLayer& l, W& w, const std::string& in,
                         const std::string& out, const std::string& prefix) {
    if (!l.has_bias_) W::Unsupported(l, "a projection without bias");
    const at::Tensor wt = l.GetVariable("w");
    const std::string wn = w.Param(prefix + "_w", wt);
    const std::string bn = w.Param(prefix + "_b", l.GetVariable("b"));
    w.Line(StrCat(out, " = torch.addmm(", bn, ", ", in, ".reshape(-1, [", wt.size(0), "][0]), ",
                  wn, ").view(b, t, ", wt.size(1), ")"));
    if (l.activation_ == "RELU") {
      w.Line(StrCat(out, " = torch.relu(", out, ")"));
    } else if (l.activation_ != "NONE") {
      W::Unsupported(l, StrCat("activation ", l.activation_));
    }
  }

  // The effective weight: Lingvo's (1 + scale) unless direct_scale, computed with the op FProp
  // uses.
  static void Norm(const LayerNorm& l, W& w, const std::string& in, const std::string& out,
                   const std::string& prefix) {
    at::Tensor scale = l.GetVariable("scale");
    if (!l.direct_scale_) scale = scale + 1;
    const std::string ws = w.Param(prefix + "_scale", scale);
    const std::string bs = w.Param(prefix + "_bias", l.GetVariable("bias"));
    w.Line(StrCat(out, " = torch.layer_norm(", in, ", [", scale.size(0), "], ", ws, ", ", bs, ", ",
                  W::Num(l.epsilon_), ")"));
  }

  // `in`: the ids; the embeddings, times √d where the layer scales so.
  static void Embedding(const EmbeddingLayer& l, W& w, const std::string& in,
                        const std::string& out, const std::string& prefix) {
    w.Line(StrCat(out, " = torch.embedding(", w.Param(prefix + "emb_var", l.GetVariable("emb_var")),
                  ", ", in, ".long())"));
    if (l.scale_sqrt_depth_) {
      w.Line(StrCat(out, " = ", out, " * ",
                    W::Num(std::sqrt(static_cast<double>(l.embedding_dim_)))));
    }
  }

  // `in`: the sequence length; `out`: the sinusoidal signal [T, D] in float64, as FProp computes
  // it.
  static void Positions(const PositionalEmbeddingLayer& l, W& w, const std::string& in,
                        const std::string& out, const std::string& /*prefix*/) {
    const int64_t num_timescales = l.embedding_dim_ / 2;
    const double min_ts = l.min_timescale_, max_ts = l.max_timescale_;
    const double inc =
        std::log(max_ts / min_ts) / std::max<double>(static_cast<double>(num_timescales) - 1, 1);
    w.Line(StrCat("inv = ", W::Num(min_ts), " * torch.exp(torch.arange(", num_timescales,
                  ").double() * ", W::Num(-inc), ")"));
    w.Line(StrCat("scaled = torch.arange(", in, ").float().double().unsqueeze(-1) * inv"));
    w.Line(StrCat(out, " = torch.cat([torch.sin(scaled), torch.cos(scaled)], -1)"));
    if (l.embedding_dim_ % 2 == 1) w.Line(StrCat(out, " = torch.constant_pad_nd(", out, ", [0, 1])"));
  }

  // The logits x·w + b (the task applies its log-softmax).
  static void Softmax(const SimpleFullSoftmax& l, W& w, const std::string& in,
                      const std::string& out, const std::string& prefix) {
    if (l.logits_abs_max_) W::Unsupported(l, "logits_abs_max");
    const at::Tensor wt = l.GetVariable("weight_0");
    const std::string bn = w.Param(prefix + "softmax_b", l.GetVariable("bias_0"));
    const std::string wn = w.Param(prefix + "softmax_w", wt);
    w.Line(StrCat(out, " = torch.addmm(", bn, ", ", in, ".reshape(-1, [", wt.size(0), "][0]), ",
                  wn, ").view(b, t, ", wt.size(1), ")"));
  }

  // Self-attention of `in` (q, k and v all from it) under the task's `bias`, through the output
  // projection: `out` [b, t, D].
  static void Attention(const MultiHeadedAttention& a, W& w, const std::string& in,
                        const std::string& out, const std::string& prefix) {
    for (const char* proj : {"query", "key", "value"}) {
      const MultiHeadedProjectionLayer& pl =
          *(proj[0] == 'q' ? a.query_ : proj[0] == 'k' ? a.key_ : a.value_);
      if (!pl.use_bias_) W::Unsupported(pl, "a projection without bias");
      const at::Tensor wt = pl.GetVariable("w");  // [D, N, H]
      const std::string wn = w.Param(StrCat(prefix, proj, "_w"), wt.reshape({wt.size(0), -1}));
      const std::string bn = w.Param(StrCat(prefix, proj, "_b"), pl.GetVariable("b").reshape({-1}));
      w.Line(StrCat(std::string(1, proj[0]), " = torch.addmm(", bn, ", ", in, ".reshape(-1, [",
                    wt.size(0), "][0]), ", wn, ").view(b, t, ", wt.size(1), ", ", wt.size(2), ")"));
    }
    if (a.per_dim_scale_) {  // the per-dim scale layer's dim is dim_per_head
      const at::Tensor scale = at::softplus(a.per_dim_scale_layer_->GetVariable("per_dim_scale")) *
                               (1.442695041 / std::sqrt(static_cast<double>(a.dim_per_head_)));
      w.Line(StrCat("q = q * ", w.Param(prefix + "q_scale", scale)));
    } else {
      w.Line(StrCat("q = q * ", W::Num(1.0 / std::sqrt(static_cast<double>(a.dim_per_head_)))));
    }
    w.Line("logits = torch.einsum('btnh,bsnh->bnts', [q, k]) + bias");
    w.Line("probs = torch.softmax(logits, -1)");
    w.Line("ctx = torch.einsum('bnts,bsnh->btnh', [probs, v])");
    const at::Tensor pw = a.post_->GetVariable("w");  // [D, N, H]
    // [D, N·H], used transposed as the layer does (the same GEMM, the same rounding).
    const std::string wn =
        w.Param(prefix + "post_w", pw.reshape({pw.size(0), pw.size(1) * pw.size(2)})) + ".t()";
    const std::string bn = w.Param(prefix + "post_b", a.post_->GetVariable("b"));
    w.Line(StrCat(out, " = torch.addmm(", bn, ", ctx.reshape(-1, ", pw.size(1) * pw.size(2),
                  "), ", wn, ").view(b, t, ", pw.size(0), ")"));
  }

  // Pre-layer-norm causal self-attention with its residual: out = in + atten(ln(in)).
  static void AttentionBlock(const TransformerAttentionLayer& l, W& w, const std::string& in,
                             const std::string& out, const std::string& prefix) {
    if (!l.pre_layer_norm_) W::Unsupported(l, "post-layer-norm attention");
    if (!l.is_masked_) W::Unsupported(l, "non-causal self-attention");
    EmitTorchScript(*l.ln_, w, in, "h", prefix + "atten_ln");
    EmitTorchScript(*l.atten_, w, "h", "a", prefix);
    w.Line(StrCat(out, " = ", in, " + a"));
  }

  // Pre-layer-norm feed-forward with its residual, padded rows zeroed after each FC layer.
  static void FeedForward(const TransformerFeedForwardLayer& l, W& w, const std::string& in,
                          const std::string& out, const std::string& prefix) {
    if (!l.pre_layer_norm_) W::Unsupported(l, "post-layer-norm feed-forward");
    EmitTorchScript(*l.ln_, w, in, "h", prefix + "ff_ln");
    EmitTorchScript(*l.fc0_, w, "h", "h", prefix + "fc0");
    w.Line("if any_pad:\n        h = h * (1 - pad)");
    EmitTorchScript(*l.fc1_, w, "h", "h", prefix + "fc1");
    w.Line("if any_pad:\n        h = h * (1 - pad)");
    w.Line(StrCat(out, " = torch.add(", in, ", h, alpha=", W::Num(l.residual_weight_), ")"));
  }

  // Self-attention, then the feed-forward block (no cross-attention).
  static void Layer(const TransformerLayer& l, W& w, const std::string& in, const std::string& out,
                    const std::string& prefix) {
    if (l.cross_atten_) W::Unsupported(l, "cross-attention");
    EmitTorchScript(*l.self_atten_, w, in, out, prefix);
    EmitTorchScript(*l.fflayer_, w, out, out, prefix);
  }

  // Every layer in turn (weights prefixed l<i>_), then the final layer norm.
  static void Stack(const TransformerStack& s, W& w, const std::string& in, const std::string& out,
                    const std::string& prefix) {
    s.CheckWhole("TorchScript export");
    std::string x = in;
    for (size_t i = 0; i < s.layers_.size(); ++i) {
      EmitTorchScript(*s.layers_[i], w, x, out, StrCat(prefix, "l", i, "_"));
      x = out;
    }
    if (s.final_ln_) EmitTorchScript(*s.final_ln_, w, x, out, prefix + "final_ln");
  }
};

namespace {

using Emitter = void (*)(const BaseLayer&, TorchScriptWriter&, const std::string&,
                         const std::string&, const std::string&);

template <typename T, void (*F)(const T&, TorchScriptWriter&, const std::string&,
                                const std::string&, const std::string&)>
void Call(const BaseLayer& l, TorchScriptWriter& w, const std::string& in, const std::string& out,
          const std::string& prefix) {
  F(static_cast<const T&>(l), w, in, out, prefix);
}

// By exact class: a subclass may change the forward its base's emitter writes.
const std::unordered_map<std::type_index, Emitter>& Emitters() {
  using E = TorchScriptExport;
  static const auto* m = new std::unordered_map<std::type_index, Emitter>{
      {typeid(ProjectionLayer), &Call<ProjectionLayer, &E::Projection>},
      {typeid(FCLayer), &Call<ProjectionLayer, &E::Projection>},
      {typeid(LayerNorm), &Call<LayerNorm, &E::Norm>},
      {typeid(EmbeddingLayer), &Call<EmbeddingLayer, &E::Embedding>},
      {typeid(PositionalEmbeddingLayer), &Call<PositionalEmbeddingLayer, &E::Positions>},
      {typeid(SimpleFullSoftmax), &Call<SimpleFullSoftmax, &E::Softmax>},
      {typeid(MultiHeadedAttention), &Call<MultiHeadedAttention, &E::Attention>},
      {typeid(TransformerAttentionLayer), &Call<TransformerAttentionLayer, &E::AttentionBlock>},
      {typeid(TransformerFeedForwardLayer), &Call<TransformerFeedForwardLayer, &E::FeedForward>},
      {typeid(TransformerLayer), &Call<TransformerLayer, &E::Layer>},
      {typeid(TransformerStack), &Call<TransformerStack, &E::Stack>},
      {typeid(TransformerEncoder), &Call<TransformerStack, &E::Stack>},
      {typeid(TransformerDecoder), &Call<TransformerStack, &E::Stack>},
  };
  return *m;
}

}  // namespace

void EmitTorchScript(const BaseLayer& layer, TorchScriptWriter& w, const std::string& in,
                     const std::string& out, const std::string& prefix) {
  const auto it = Emitters().find(typeid(layer));
  if (it == Emitters().end()) {
    TorchScriptWriter::Unsupported(layer, StrCat("its class ", Demangle(typeid(layer).name())));
  }
  it->second(layer, w, in, out, prefix);
}

}  // namespace glossa
