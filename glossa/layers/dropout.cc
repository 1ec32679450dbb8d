#include "glossa/layers/dropout.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/mesh.h"

namespace glossa {
namespace {

void CheckKeepProb(double keep_prob) {
  if (!(keep_prob > 0.0 && keep_prob <= 1.0)) {
    throw InvalidArgumentError(
        StrCat("dropout keep_prob must be in (0, 1], got ", PyFloatRepr(keep_prob)));
  }
}

std::vector<int64_t> IntList(const ParamValue& v) {
  std::vector<int64_t> out;
  for (const auto& x : v.AsList()) out.push_back(x.AsInt());
  return out;
}

}  // namespace

namespace {

// SplitMix64's finalizer: a bijective mix of 64 bits.
inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

at::Tensor StatelessUniformBlock(std::array<int64_t, 2> seeds, const std::vector<int64_t>& whole,
                                 const std::vector<int64_t>& offsets,
                                 const std::vector<int64_t>& sizes) {
  const size_t n = whole.size();
  if (n == 0) throw InvalidArgumentError("StatelessUniform: a scalar shape");
  bool ok = offsets.size() == n && sizes.size() == n;
  for (size_t i = 0; ok && i < n; ++i) {
    ok = offsets[i] >= 0 && sizes[i] >= 0 && offsets[i] + sizes[i] <= whole[i];
  }
  if (!ok) {
    throw InvalidArgumentError(StrCat("StatelessUniform: block at ", at::IntArrayRef(offsets),
                                      " of size ", at::IntArrayRef(sizes), " of ",
                                      at::IntArrayRef(whole)));
  }
  // Row-major strides of the whole; the block is drawn in runs along its last dim.
  std::vector<int64_t> stride(n, 1);
  for (size_t i = n - 1; i-- > 0;) stride[i] = stride[i + 1] * whole[i + 1];
  const int64_t run = sizes.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < n; ++i) rows *= sizes[i];
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  const uint64_t key = Mix(static_cast<uint64_t>(seeds[0]) ^ Mix(static_cast<uint64_t>(seeds[1]) +
                                                                  0x632be59bd9b4e019ULL));
  at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, run)),
                   [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      // Element k of the whole (row-major) for the block's run r.
      int64_t base = offsets.back(), rest = r;
      for (size_t i = n - 1; i-- > 0;) {
        base += (offsets[i] + rest % sizes[i]) * stride[i];
        rest /= sizes[i];
      }
      float* dst = o + r * run;
      for (int64_t i = 0; i < run; ++i) {
        const uint64_t z = Mix(key + static_cast<uint64_t>(base + i) * 0x9e3779b97f4a7c15ULL);
        dst[i] = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
      }
    }
  });
  return out;
}

at::Tensor StatelessUniform(std::array<int64_t, 2> seeds, const std::vector<int64_t>& whole,
                            int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
  if (whole.empty()) throw InvalidArgumentError("StatelessUniform: a scalar shape");
  std::vector<int64_t> offsets(whole.size(), 0), sizes = whole;
  offsets[0] = row0;
  sizes[0] = rows;
  if (whole.size() > 1) {
    offsets[1] = col0;
    sizes[1] = cols;
  } else if (col0 != 0 || cols != 1) {
    throw InvalidArgumentError(StrCat("StatelessUniform: cols [", col0, ", ", col0 + cols,
                                      ") of a rank-1 shape"));
  }
  return StatelessUniformBlock(seeds, whole, offsets, sizes);
}

at::Tensor DeterministicDropout(const at::Tensor& x, double keep_prob, std::array<int64_t, 2> seeds,
                                const std::optional<std::vector<int64_t>>& noise_shape,
                                const std::optional<DimBlock>& block) {
  CheckKeepProb(keep_prob);
  if (keep_prob == 1.0) return x;
  std::vector<int64_t> shape = noise_shape ? *noise_shape : x.sizes().vec();
  if (shape.empty()) shape = {1};  // a scalar: one draw
  // A rank's rows of a batch split over ranks: its block of the whole batch's draw, drawn alone
  // (core/step_seed.h: BatchShard; and its dim-1 block when one is set). A mask broadcast over
  // a split dim is the same for every block.
  const BatchShard shard = CurrentBatchShard();
  std::vector<int64_t> whole = shape, offsets(shape.size(), 0);
  auto split = [&](size_t d, int64_t index, int64_t count) {
    if (count <= 1 || d >= shape.size() || static_cast<int64_t>(d) >= x.dim() ||
        shape[d] != x.size(static_cast<int64_t>(d)) || (noise_shape && shape[d] == 1)) {
      return;
    }
    whole[d] = shape[d] * count;
    offsets[d] = index * shape[d];
  };
  split(0, shard.index, shard.count);
  split(1, shard.index1, shard.count1);
  if (block) split(static_cast<size_t>(block->dim), block->index, block->count);
  at::Tensor u = StatelessUniformBlock(seeds, whole, offsets, shape);
  if (noise_shape && noise_shape->empty()) u = u.view({});
  if (!noise_shape && x.dim() == 0) u = u.view({});
  at::Tensor mask = at::floor(u + static_cast<float>(keep_prob)).to(x.options());
  return (x / keep_prob) * mask;
}

glossa::Params DropoutLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<DropoutLayer>());
  p.Define("keep_prob", 1.0, "Keep probability.");
  p.Define("noise_shape", nullptr,
           "A 1-D list of ints: the shape of the keep/drop flags, broadcast against the input.");
  p.Define("noise_shape_broadcast_dims", nullptr,
           "A list of dims set to 1 in the noise shape, e.g. [-1] drops whole last-dim vectors.");
  p.Define("dropout_at_eval", false, "Whether or not to also perform dropout at eval time.");
  p.Define("activation_split_dims_mapping", nullptr,
           "Tensor parallelism: per trailing dim of the input, None or the mesh axis it is split "
           "over (e.g. [None, None, \"model\"] for a [B, T, H] input whose H is split). A "
           "seeded dropout then draws this rank's block of the whole input's mask.");
  return p;
}

DropoutLayer::DropoutLayer(const glossa::Params& p) : BaseLayer(p) {
  keep_prob_ = params().GetFloat("keep_prob");
  CheckKeepProb(keep_prob_);
  dropout_at_eval_ = params().GetBool("dropout_at_eval");
  if (params().IsSet("noise_shape")) noise_shape_ = IntList(params().Get("noise_shape"));
  if (params().IsSet("noise_shape_broadcast_dims")) {
    noise_shape_broadcast_dims_ = IntList(params().Get("noise_shape_broadcast_dims"));
  }
  model_axis_ = build_context().axis("model");
  const ParamValue& mapping = params().Get("activation_split_dims_mapping");
  if (!mapping.is_none()) {
    const int64_t rank = mapping.is_list() ? static_cast<int64_t>(mapping.AsList().size()) : 0;
    const WeightSplit split = ParseWeightSplit(mapping, rank, StrCat("layer '", path(),
                                                                     "' (activation mapping)"));
    split_axis_ = split.Resolve(build_context());
    split_from_end_ = rank - split.dim;
  }
}

std::optional<DimBlock> DropoutLayer::SplitBlock(const at::Tensor& x) const {
  if (split_axis_ == nullptr) return std::nullopt;
  const int64_t dim = x.dim() - split_from_end_;
  if (dim < 0) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': input ", x.sizes(), " has fewer dims "
                                      "than its activation_split_dims_mapping"));
  }
  return DimBlock{dim, split_axis_->index(), split_axis_->size()};
}

bool DropoutLayer::IsIdentity() const {
  return (IsEvalMode() && !dropout_at_eval_) || is_inference() || keep_prob_ == 1.0;
}

at::Tensor DropoutLayer::FProp(const NestedMap&, const at::Tensor& x) const {
  if ((IsEvalMode() && !dropout_at_eval_) || is_inference()) return x;
  if (keep_prob_ == 1.0) return x;
  std::optional<std::vector<int64_t>> ns = noise_shape_;
  if (!noise_shape_broadcast_dims_.empty()) {
    std::vector<int64_t> shape = ns ? *ns : x.sizes().vec();
    for (int64_t d : noise_shape_broadcast_dims_) {
      const int64_t n = static_cast<int64_t>(shape.size());
      if (d >= n || d < -n) {
        throw InvalidArgumentError(StrCat("layer '", path(), "': invalid broadcast dim ", d,
                                          " for a noise shape of rank ", n));
      }
      shape[d < 0 ? d + n : d] = 1;
    }
    ns = shape;
  }
  return Dropout(x, keep_prob_, ns, SplitBlock(x));
}

at::Tensor DropoutLayer::Dropout(const at::Tensor& x, double keep_prob,
                                 const std::optional<std::vector<int64_t>>& noise_shape,
                                 const std::optional<DimBlock>&) const {
  if (model_axis_ != nullptr) {
    throw FailedPreconditionError(StrCat(
        "layer '", path(), "': DropoutLayer draws its masks from each process's generator, so on "
        "the ", model_axis_->size(), " ranks of a 'model' axis, which hold activations alike, it "
        "would drop different units on each: use DeterministicDropoutLayer (the layers' "
        "dropout_tpl default), whose masks are one process's"));
  }
  const std::vector<int64_t> shape = noise_shape ? *noise_shape : x.sizes().vec();
  at::Tensor keep = (at::rand(shape, x.options().dtype(at::kFloat)) >= (1.0 - keep_prob));
  return x * (1.0 / keep_prob) * keep.to(x.scalar_type());
}

glossa::Params DeterministicDropoutLayer::Params() {
  glossa::Params p = DropoutLayer::Params();
  p.Set("cls", ClsOf<DeterministicDropoutLayer>());
  return p;
}

DeterministicDropoutLayer::DeterministicDropoutLayer(const glossa::Params& p) : DropoutLayer(p) {
  const ParamValue& seed = params().Get("random_seed");
  if (!seed.is_none()) random_seed_ = seed.AsInt();
}

at::Tensor DeterministicDropoutLayer::Dropout(
    const at::Tensor& x, double keep_prob,
    const std::optional<std::vector<int64_t>>& noise_shape,
    const std::optional<DimBlock>& block) const {
  auto seeds = GenerateStepSeedPair(random_seed_, std::nullopt, is_inference());
  return DeterministicDropout(x, keep_prob, seeds, noise_shape, block);
}

GLOSSA_REGISTER_CLASS(DropoutLayer, "glossa.layers.DropoutLayer");
GLOSSA_REGISTER_CLASS(DeterministicDropoutLayer, "glossa.layers.DeterministicDropoutLayer");

glossa::Params DropoutParams(const glossa::Params& p, const char* prob_key) {
  glossa::Params out = p.GetParams("dropout_tpl").Copy();
  out.Set("keep_prob", 1.0 - p.GetFloat(prob_key));
  return out;
}

}  // namespace glossa
