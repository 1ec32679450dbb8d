#include "glossa/layers/embedding.h"

#include <ATen/ATen.h>

#include <cmath>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/mesh.h"
#include "glossa/layers/weight_init.h"

namespace glossa {

glossa::Params EmbeddingLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<EmbeddingLayer>());
  p.Define("vocab_size", 0, "Number of tokens in the vocabulary.");
  p.Define("embedding_dim", 0, "Depth of the embeddings.");
  p.Define("scale_sqrt_depth", false, "If True, multiply the embeddings by sqrt(embedding_dim).");
  p.Define("weight_split_dims_mapping", nullptr,
           "Tensor parallelism: per dim of emb_var [vocab_size, embedding_dim], None or a mesh "
           "axis name; [\"model\", None] splits the vocabulary over the 'model' axis (each rank "
           "looks up the ids in its block of rows, zeros for the others, and the axis sums). "
           "Built whole without that axis.");
  return p;
}

EmbeddingLayer::EmbeddingLayer(const glossa::Params& p) : BaseLayer(p) {
  vocab_size_ = params().GetInt("vocab_size");
  embedding_dim_ = params().GetInt("embedding_dim");
  scale_sqrt_depth_ = params().GetBool("scale_sqrt_depth");
  if (vocab_size_ <= 0 || embedding_dim_ <= 0) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': vocab_size and embedding_dim must be > 0"));
  }
  WeightParams table({vocab_size_, embedding_dim_},
                     WeightInit::FromParams(params().GetParams("params_init")),
                     params().Get("dtype").AsDType());
  const WeightSplit split = ParseWeightSplit(params().Get("weight_split_dims_mapping"), 2,
                                             StrCat("layer '", path(), "'"));
  if (split.dim == 1) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': weight_split_dims_mapping may split "
                                      "the vocabulary (dim 0) only"));
  }
  axis_ = split.Resolve(build_context());
  if (axis_ != nullptr) {
    const int64_t m = axis_->size();
    if (vocab_size_ % m != 0) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': vocab_size ", vocab_size_,
                                        " does not split over the ", m, " ranks of the '",
                                        split.axis, "' axis"));
    }
    table.shape[0] = vocab_size_ / m;
    table.collections.push_back(kModelShardedCollection);
    table.shard_index = axis_->index();
    table.shard_count = m;
  }
  CreateVariable("emb_var", table);
}

at::Tensor EmbeddingLayer::EmbLookup(const NestedMap& theta, const at::Tensor& ids) const {
  if (at::isFloatingType(ids.scalar_type())) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': ids must be integers"));
  }
  if (ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    if (lo < 0 || hi >= vocab_size_) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': ids must be in [0, ", vocab_size_,
                                        "), found ", lo < 0 ? lo : hi));
    }
  }
  at::Tensor out;
  if (axis_ != nullptr) {
    // This rank's rows [lo, lo + n): their embeddings, zeros for the other ids; summed over the
    // axis, every id's row (its gradient reaches the rank holding it).
    const at::Tensor& table = theta.GetTensor("emb_var");
    const int64_t n = table.size(0), lo = axis_->index() * n;
    const at::Tensor local = ids.to(at::kLong) - lo;
    const at::Tensor mine = (local >= 0) & (local < n);
    out = at::embedding(table, at::where(mine, local, at::zeros_like(local)));
    out = ReduceOverAxis(*axis_, out * mine.unsqueeze(-1).to(out.scalar_type()));
  } else {
    out = at::embedding(theta.GetTensor("emb_var"), ids.to(at::kLong));
  }
  if (scale_sqrt_depth_) out = out * std::sqrt(static_cast<double>(embedding_dim_));
  return out;
}

glossa::Params PositionalEmbeddingLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<PositionalEmbeddingLayer>());
  p.Define("min_timescale", 1.0, "Start of the geometric index.");
  p.Define("max_timescale", 10000.0, "End of the geometric index.");
  p.Define("embedding_dim", 0, "Dimension of the embedding to be generated.");
  return p;
}

PositionalEmbeddingLayer::PositionalEmbeddingLayer(const glossa::Params& p) : BaseLayer(p) {
  embedding_dim_ = params().GetInt("embedding_dim");
  min_timescale_ = params().GetFloat("min_timescale");
  max_timescale_ = params().GetFloat("max_timescale");
  if (embedding_dim_ <= 0) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': embedding_dim must be > 0"));
  }
}

at::Tensor PositionalEmbeddingLayer::FPropWithPosition(const NestedMap&,
                                                       const at::Tensor& position) const {
  // Lingvo's formula: timescales min·(max/min)^(i/(n-1)), n = dim/2; [sin | cos], zero-padded
  // to an odd dim.
  const int64_t num_timescales = embedding_dim_ / 2;
  const double log_increment = std::log(max_timescale_ / min_timescale_) /
                               std::max<double>(static_cast<double>(num_timescales) - 1, 1);
  // Computed in float64, then cast to the fprop dtype.
  auto opts = at::TensorOptions().dtype(at::kDouble).device(position.device());
  at::Tensor inv_timescales =
      min_timescale_ * at::exp(at::arange(num_timescales, opts) * -log_increment);
  at::Tensor scaled = position.to(at::kDouble).unsqueeze(-1) * inv_timescales;
  at::Tensor signal = at::cat({at::sin(scaled), at::cos(scaled)}, -1);
  if (embedding_dim_ % 2 == 1) {
    signal = at::constant_pad_nd(signal, {0, 1});
  }
  return signal.to(fprop_dtype());
}

at::Tensor PositionalEmbeddingLayer::FProp(const NestedMap& theta, int64_t seq_length) const {
  if (seq_length < 0) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': seq_length ", seq_length, " < 0"));
  }
  at::Tensor table;
  {
    std::lock_guard<std::mutex> lock(table_mu_);
    if (!table_.defined() || table_.size(0) < seq_length ||
        table_.scalar_type() != fprop_dtype()) {
      int64_t n = table_.defined() && table_.scalar_type() == fprop_dtype() ? table_.size(0) : 64;
      while (n < seq_length) n *= 2;
      table_ = FPropWithPosition(theta, at::arange(n, at::TensorOptions().dtype(at::kFloat)));
    }
    table = table_;
  }
  return table.narrow(0, 0, seq_length);
}

GLOSSA_REGISTER_CLASS(EmbeddingLayer, "glossa.layers.EmbeddingLayer");
GLOSSA_REGISTER_CLASS(PositionalEmbeddingLayer, "glossa.layers.PositionalEmbeddingLayer");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature EmbeddingLayer::FPropMapSpec() const {
  return {{"ids"}, 1, {"outputs"}, false, "Tensor"};
}

NestedMap EmbeddingLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap out;
  out.Put("outputs", FProp(theta, inputs.GetTensor("ids")));
  return out;
}

BaseLayer::FPropMapSignature PositionalEmbeddingLayer::FPropMapSpec() const {
  return {{"seq_length_or_position"}, 1, {"outputs"}, false, "Tensor"};
}

NestedMap PositionalEmbeddingLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  const NestedValue& x = inputs.at("seq_length_or_position");
  NestedMap out;
  if (x.kind() == NestedValue::Kind::kInt) {
    out.Put("outputs", FProp(theta, x.AsInt()));
  } else {
    out.Put("outputs", FPropWithPosition(theta, x.AsTensor()));
  }
  return out;
}

}  // namespace glossa
