#include "glossa/layers/onnx_export.h"

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
#include "glossa/layers/onnx_graph.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "glossa/layers/transformer_stack.h"

namespace glossa {
namespace {

// `l` itself when its class is exactly T (the pieces of a decoding step are written for T's
// forward); else refused naming its class.
template <typename T>
const T& Exactly(const T& l) {
  if (typeid(l) != typeid(T)) OnnxGraph::Unsupported(l, StrCat("its class ", Demangle(typeid(l).name())));
  return l;
}

}  // namespace

// A friend of the classes it exports: their emitters, by class.
class OnnxExport {
 public:
  static std::string Projection(const ProjectionLayer& l, OnnxGraph& g, const std::string& in,
                                const std::string& prefix) {
    if (!l.has_bias_) OnnxGraph::Unsupported(l, "a projection without bias");
    std::string y = g.Affine(in, g.Weight(prefix + "_w", l.GetVariable("w")),
                             g.Weight(prefix + "_b", l.GetVariable("b")));
    if (l.activation_ == "RELU") {
      y = g.Op("Relu", {y});
    } else if (l.activation_ != "NONE") {
      OnnxGraph::Unsupported(l, StrCat("activation ", l.activation_));
    }
    return y;
  }

  // The effective weight: Lingvo's (1 + scale) unless direct_scale, as FProp computes it.
  static std::string Norm(const LayerNorm& l, OnnxGraph& g, const std::string& in,
                          const std::string& prefix) {
    at::Tensor scale = l.GetVariable("scale");
    if (!l.direct_scale_) scale = scale + 1;
    return g.Op("LayerNormalization",
                {in, g.Weight(prefix + "_scale", scale),
                 g.Weight(prefix + "_bias", l.GetVariable("bias"))},
                {OnnxAttr::Int("axis", -1), OnnxAttr::Float("epsilon", static_cast<float>(l.epsilon_))});
  }

  static std::string Embedding(const EmbeddingLayer& l, OnnxGraph& g, const std::string& in,
                               const std::string& prefix) {
    std::string x = g.Op("Gather", {g.Weight(prefix + "emb_var", l.GetVariable("emb_var")), in},
                         {OnnxAttr::Int("axis", 0)});
    if (l.scale_sqrt_depth_) {
      x = g.Op("Mul", {x, g.ConstScalar(static_cast<float>(
                               std::sqrt(static_cast<double>(l.embedding_dim_))))});
    }
    return x;
  }

  // `in` is the length T (an int64 scalar). The signal of positions 0..kOnnxMaxPositions-1 is a
  // constant table computed by FPropWithPosition (float64 sines, then float32: the same bits), of
  // which the graph takes the first T rows; longer sequences fail in the runtime's Add.
  static std::string Positions(const PositionalEmbeddingLayer& l, OnnxGraph& g,
                               const std::string& in, const std::string& prefix) {
    const at::Tensor table =
        l.FPropWithPosition(NestedMap(), at::arange(PositionalEmbeddingLayer::kOnnxMaxPositions,
                                                    at::kFloat)).to(at::kFloat);
    const std::string t = g.Op("Unsqueeze", {in, g.ConstInts({0})});
    return g.Op("Slice", {g.Weight(prefix + "position_table", table), g.ConstInts({0}), t,
                          g.ConstInts({0})});
  }

  static std::string Softmax(const SimpleFullSoftmax& l, OnnxGraph& g, const std::string& in,
                             const std::string& prefix) {
    if (l.logits_abs_max_) OnnxGraph::Unsupported(l, "logits_abs_max");
    return g.Affine(in, g.Weight(prefix + "softmax_w", l.GetVariable("weight_0")),
                    g.Weight(prefix + "softmax_b", l.GetVariable("bias_0")));
  }

  // The projection of x [B, T, D] by the "query", "key" or "value" projection (also its weights'
  // names) to [B, T, N, H].
  static std::string HeadsProjection(const MultiHeadedAttention& a, OnnxGraph& g,
                                     const std::string& x, const char* which,
                                     const std::string& prefix) {
    const MultiHeadedProjectionLayer& pl = *(which[0] == 'q' ? a.query_
                                             : which[0] == 'k' ? a.key_ : a.value_);
    if (!pl.use_bias_) OnnxGraph::Unsupported(pl, "a projection without bias");
    const at::Tensor wt = pl.GetVariable("w");  // [D, N, H]
    const std::string y =
        g.Affine(x, g.Weight(StrCat(prefix, which, "_w"), wt.reshape({wt.size(0), -1})),
                 g.Weight(StrCat(prefix, which, "_b"), pl.GetVariable("b").reshape({-1})));
    return g.Op("Reshape", {y, g.ConstInts({0, 0, a.num_heads_, a.dim_per_head_})});
  }

  // Scaled queries, the softmax over keys with `bias` added, the output projection -> [B, T, D].
  static std::string AttentionCore(const MultiHeadedAttention& a, OnnxGraph& g,
                                   const std::string& q, const std::string& k,
                                   const std::string& v, const std::string& bias,
                                   const std::string& prefix) {
    std::string scale;
    if (a.per_dim_scale_) {  // the per-dim scale layer's dim is dim_per_head
      scale = g.Weight(prefix + "q_scale",
                       at::softplus(a.per_dim_scale_layer_->GetVariable("per_dim_scale")) *
                           (1.442695041 / std::sqrt(static_cast<double>(a.dim_per_head_))));
    } else {
      scale = g.ConstScalar(static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.dim_per_head_))));
    }
    const std::string qs = g.Op("Transpose", {g.Op("Mul", {q, scale})},
                                {OnnxAttr::Ints("perm", {0, 2, 1, 3})});    // [B, N, T, H]
    const std::string kt = g.Op("Transpose", {k}, {OnnxAttr::Ints("perm", {0, 2, 3, 1})});
    const std::string vt = g.Op("Transpose", {v}, {OnnxAttr::Ints("perm", {0, 2, 1, 3})});
    const std::string logits = g.Op("Add", {g.Op("MatMul", {qs, kt}), bias});  // [B, N, T, S]
    const std::string probs = g.Op("Softmax", {logits}, {OnnxAttr::Int("axis", -1)});
    const std::string ctx = g.Op("Transpose", {g.Op("MatMul", {probs, vt})},
                                 {OnnxAttr::Ints("perm", {0, 2, 1, 3})});  // [B, T, N, H]
    const at::Tensor pw = a.post_->GetVariable("w");  // [D, N, H]
    const std::string flat = g.Op("Reshape", {ctx, g.ConstInts({0, 0, pw.size(1) * pw.size(2)})});
    return g.Affine(flat,
                    g.Weight(prefix + "post_w", pw.reshape({pw.size(0), -1}).t().contiguous()),
                    g.Weight(prefix + "post_b", a.post_->GetVariable("b")));
  }

  // Self-attention of `in` with the additive bias g.Get("atten_bias").
  static std::string Attention(const MultiHeadedAttention& a, OnnxGraph& g, const std::string& in,
                               const std::string& prefix) {
    return AttentionCore(a, g, HeadsProjection(a, g, in, "query", prefix),
                         HeadsProjection(a, g, in, "key", prefix),
                         HeadsProjection(a, g, in, "value", prefix), g.Get("atten_bias"), prefix);
  }

  static std::string AttentionBlock(const TransformerAttentionLayer& l, OnnxGraph& g,
                                    const std::string& in, const std::string& prefix) {
    if (!l.pre_layer_norm_) OnnxGraph::Unsupported(l, "post-layer-norm attention");
    g.Set("atten_bias", g.Get(l.is_masked_ ? "causal_bias" : "self_bias"));
    const std::string h = EmitOnnx(*l.ln_, g, in, prefix + "atten_ln");
    return g.Op("Add", {in, EmitOnnx(*l.atten_, g, h, prefix)});
  }

  static std::string FeedForward(const TransformerFeedForwardLayer& l, OnnxGraph& g,
                                 const std::string& in, const std::string& prefix) {
    if (!l.pre_layer_norm_) OnnxGraph::Unsupported(l, "post-layer-norm feed-forward");
    const std::string nonpad = g.Get("nonpad");
    std::string h = EmitOnnx(*l.ln_, g, in, prefix + "ff_ln");
    h = g.Op("Mul", {EmitOnnx(*l.fc0_, g, h, prefix + "fc0"), nonpad});
    h = g.Op("Mul", {EmitOnnx(*l.fc1_, g, h, prefix + "fc1"), nonpad});
    if (l.residual_weight_ != 1.0) {
      h = g.Op("Mul", {h, g.ConstScalar(static_cast<float>(l.residual_weight_))});
    }
    return g.Op("Add", {in, h});
  }

  static std::string Layer(const TransformerLayer& l, OnnxGraph& g, const std::string& in,
                           const std::string& prefix) {
    if (l.cross_atten_) OnnxGraph::Unsupported(l, "cross-attention outside the decoder step");
    return EmitOnnx(*l.fflayer_, g, EmitOnnx(*l.self_atten_, g, in, prefix), prefix);
  }

  static std::string Stack(const TransformerStack& s, OnnxGraph& g, const std::string& in,
                           const std::string& prefix) {
    s.CheckWhole("ONNX export");
    std::string x = in;
    for (size_t i = 0; i < s.layers_.size(); ++i) {
      x = EmitOnnx(*s.layers_[i], g, x, StrCat(prefix, "l", i, "_"));
    }
    return s.final_ln_ ? EmitOnnx(*s.final_ln_, g, x, prefix + "final_ln") : x;
  }

  static std::vector<std::string> StackSource(const TransformerStack& s, OnnxGraph& g,
                                              const std::string& source,
                                              const std::string& prefix) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.layers_.size(); ++i) {
      const TransformerLayer& layer = Exactly(*s.layers_[i]);
      if (!layer.cross_atten_) OnnxGraph::Unsupported(layer, "a decoder layer without cross-attention");
      const MultiHeadedAttention& a = Exactly(*Exactly(*layer.cross_atten_).atten_);
      const std::string p = StrCat(prefix, "l", i, "_cross_");
      out.push_back(HeadsProjection(a, g, source, "key", p));
      out.push_back(HeadsProjection(a, g, source, "value", p));
    }
    return out;
  }

  // long function: one decoding step through every layer (self-attention against the caches,
  // cross-attention against the source, feed-forward) reads best as the loop FProp's is.
  static std::string StackStep(const TransformerStack& s, OnnxGraph& g, const std::string& x,
                               const std::string& prefix, const std::vector<std::string>& caches,
                               const std::vector<std::string>& sources,
                               std::vector<std::string>* new_caches) {
    // A step has no padded position: the feed-forward blocks' mask is 1.
    const std::string nonpad = g.Has("nonpad") ? g.Get("nonpad") : "";
    g.Set("nonpad", g.ConstScalar(1.0f));
    const std::vector<OnnxAttr> axis1 = {OnnxAttr::Int("axis", 1)};
    std::string y = x;
    for (size_t i = 0; i < s.layers_.size(); ++i) {
      const TransformerLayer& layer = Exactly(*s.layers_[i]);
      const std::string p = StrCat(prefix, "l", i, "_");
      const TransformerAttentionLayer& self = Exactly(*layer.self_atten_);
      const MultiHeadedAttention& sa = Exactly(*self.atten_);
      if (!self.pre_layer_norm_) OnnxGraph::Unsupported(self, "post-layer-norm attention");
      if (!self.is_masked_) {
        OnnxGraph::Unsupported(self, "a decoding step of non-causal self-attention");
      }
      std::string h = EmitOnnx(*self.ln_, g, y, p + "atten_ln");
      const std::string k =
          g.Op("Concat", {caches.at(2 * i), HeadsProjection(sa, g, h, "key", p)}, axis1);
      const std::string v =
          g.Op("Concat", {caches.at(2 * i + 1), HeadsProjection(sa, g, h, "value", p)}, axis1);
      new_caches->push_back(k);
      new_caches->push_back(v);
      // Every earlier step is visible: no bias.
      y = g.Op("Add", {y, AttentionCore(sa, g, HeadsProjection(sa, g, h, "query", p), k, v,
                                        g.ConstScalar(0.0f), p)});
      if (layer.cross_atten_) {
        const TransformerAttentionLayer& cross = Exactly(*layer.cross_atten_);
        const MultiHeadedAttention& ca = Exactly(*cross.atten_);
        if (!cross.pre_layer_norm_) OnnxGraph::Unsupported(cross, "post-layer-norm attention");
        const std::string pc = p + "cross_";
        h = EmitOnnx(*cross.ln_, g, y, pc + "atten_ln");
        y = g.Op("Add", {y, AttentionCore(ca, g, HeadsProjection(ca, g, h, "query", pc),
                                          sources.at(2 * i), sources.at(2 * i + 1),
                                          g.Get("source_bias"), pc)});
      }
      y = EmitOnnx(*layer.fflayer_, g, y, p);
    }
    if (!nonpad.empty()) g.Set("nonpad", nonpad);
    return s.final_ln_ ? EmitOnnx(*s.final_ln_, g, y, prefix + "final_ln") : y;
  }
};

namespace {

using Emitter = std::string (*)(const BaseLayer&, OnnxGraph&, const std::string&,
                                const std::string&);

template <typename T, std::string (*F)(const T&, OnnxGraph&, const std::string&,
                                       const std::string&)>
std::string Call(const BaseLayer& l, OnnxGraph& g, const std::string& in,
                 const std::string& prefix) {
  return F(static_cast<const T&>(l), g, in, prefix);
}

// By exact class: a subclass may change the forward its base's emitter writes.
const std::unordered_map<std::type_index, Emitter>& Emitters() {
  static const auto* m = new std::unordered_map<std::type_index, Emitter>{
      {typeid(ProjectionLayer), &Call<ProjectionLayer, &OnnxExport::Projection>},
      {typeid(FCLayer), &Call<ProjectionLayer, &OnnxExport::Projection>},
      {typeid(LayerNorm), &Call<LayerNorm, &OnnxExport::Norm>},
      {typeid(EmbeddingLayer), &Call<EmbeddingLayer, &OnnxExport::Embedding>},
      {typeid(PositionalEmbeddingLayer),
       &Call<PositionalEmbeddingLayer, &OnnxExport::Positions>},
      {typeid(SimpleFullSoftmax), &Call<SimpleFullSoftmax, &OnnxExport::Softmax>},
      {typeid(MultiHeadedAttention), &Call<MultiHeadedAttention, &OnnxExport::Attention>},
      {typeid(TransformerAttentionLayer),
       &Call<TransformerAttentionLayer, &OnnxExport::AttentionBlock>},
      {typeid(TransformerFeedForwardLayer),
       &Call<TransformerFeedForwardLayer, &OnnxExport::FeedForward>},
      {typeid(TransformerLayer), &Call<TransformerLayer, &OnnxExport::Layer>},
      {typeid(TransformerStack), &Call<TransformerStack, &OnnxExport::Stack>},
      {typeid(TransformerEncoder), &Call<TransformerStack, &OnnxExport::Stack>},
      {typeid(TransformerDecoder), &Call<TransformerStack, &OnnxExport::Stack>},
  };
  return *m;
}

}  // namespace

std::string EmitOnnx(const BaseLayer& layer, OnnxGraph& g, const std::string& in,
                     const std::string& prefix) {
  const auto it = Emitters().find(typeid(layer));
  if (it == Emitters().end()) {
    OnnxGraph::Unsupported(layer, StrCat("its class ", Demangle(typeid(layer).name())));
  }
  return it->second(layer, g, in, prefix);
}

std::vector<std::string> EmitOnnxStackSource(const TransformerStack& stack, OnnxGraph& g,
                                             const std::string& source,
                                             const std::string& prefix) {
  return OnnxExport::StackSource(stack, g, source, prefix);
}

std::string EmitOnnxStackStep(const TransformerStack& stack, OnnxGraph& g, const std::string& x,
                              const std::string& prefix, const std::vector<std::string>& caches,
                              const std::vector<std::string>& sources,
                              std::vector<std::string>* new_caches) {
  return OnnxExport::StackStep(stack, g, x, prefix, caches, sources, new_caches);
}

}  // namespace glossa
