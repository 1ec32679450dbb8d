#include "glossa/layers/dropout.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"

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

at::Tensor StatelessUniform(std::array<int64_t, 2> seeds, const std::vector<int64_t>& whole,
                            int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
  if (whole.empty()) throw InvalidArgumentError("StatelessUniform: a scalar shape");
  const int64_t d0 = whole[0], d1 = whole.size() > 1 ? whole[1] : 1;
  int64_t rest = 1;
  for (size_t i = 2; i < whole.size(); ++i) rest *= whole[i];
  if (row0 < 0 || rows < 0 || row0 + rows > d0 || col0 < 0 || cols < 0 || col0 + cols > d1) {
    throw InvalidArgumentError(StrCat("StatelessUniform: block rows [", row0, ", ", row0 + rows,
                                      ") x cols [", col0, ", ", col0 + cols, ") of ",
                                      at::IntArrayRef(whole)));
  }
  std::vector<int64_t> shape = whole;
  shape[0] = rows;
  if (shape.size() > 1) shape[1] = cols;
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  const uint64_t key = Mix(static_cast<uint64_t>(seeds[0]) ^ Mix(static_cast<uint64_t>(seeds[1]) +
                                                                  0x632be59bd9b4e019ULL));
  const int64_t run = cols * rest;  // contiguous elements of one output row
  at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, run)),
                   [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      // Element (row0 + r, col0 + c, k) of the whole: ((row0 + r) · d1 + col0 + c) · rest + k.
      const uint64_t base = static_cast<uint64_t>(((row0 + r) * d1 + col0) * rest);
      float* dst = o + r * run;
      for (int64_t i = 0; i < run; ++i) {
        const uint64_t z = Mix(key + (base + static_cast<uint64_t>(i)) * 0x9e3779b97f4a7c15ULL);
        dst[i] = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
      }
    }
  });
  return out;
}

at::Tensor DeterministicDropout(const at::Tensor& x, double keep_prob, std::array<int64_t, 2> seeds,
                                const std::optional<std::vector<int64_t>>& noise_shape) {
  CheckKeepProb(keep_prob);
  if (keep_prob == 1.0) return x;
  std::vector<int64_t> shape = noise_shape ? *noise_shape : x.sizes().vec();
  if (shape.empty()) shape = {1};  // a scalar: one draw
  // A rank's rows of a batch split over ranks: its block of the whole batch's draw, drawn alone
  // (core/step_seed.h: BatchShard; and its dim-1 block when one is set). A mask broadcast over
  // a split dim is the same for every block.
  const BatchShard shard = CurrentBatchShard();
  const bool per_row = shard.count > 1 && x.dim() > 0 && shape[0] == x.size(0) &&
                       (!noise_shape || shape[0] != 1);
  const bool per_column = shard.count1 > 1 && shape.size() > 1 && x.dim() > 1 &&
                          shape[1] == x.size(1) && (!noise_shape || shape[1] != 1);
  std::vector<int64_t> whole = shape;
  if (per_row) whole[0] *= shard.count;
  if (per_column) whole[1] *= shard.count1;
  const int64_t cols = shape.size() > 1 ? shape[1] : 1;
  at::Tensor u = StatelessUniform(seeds, whole, per_row ? shard.index * shape[0] : 0, shape[0],
                                  per_column ? shard.index1 * cols : 0, cols);
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
  return Dropout(x, keep_prob_, ns);
}

at::Tensor DropoutLayer::Dropout(const at::Tensor& x, double keep_prob,
                                 const std::optional<std::vector<int64_t>>& noise_shape) const {
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
    const std::optional<std::vector<int64_t>>& noise_shape) const {
  auto seeds = GenerateStepSeedPair(random_seed_, std::nullopt, is_inference());
  return DeterministicDropout(x, keep_prob, seeds, noise_shape);
}

GLOSSA_REGISTER_CLASS(DropoutLayer, "glossa.layers.DropoutLayer");
GLOSSA_REGISTER_CLASS(DeterministicDropoutLayer, "glossa.layers.DeterministicDropoutLayer");

glossa::Params DropoutParams(const glossa::Params& p, const char* prob_key) {
  glossa::Params out = p.GetParams("dropout_tpl").Copy();
  out.Set("keep_prob", 1.0 - p.GetFloat(prob_key));
  return out;
}

}  // namespace glossa
