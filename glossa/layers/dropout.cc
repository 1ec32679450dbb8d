#include "glossa/layers/dropout.h"

#include <ATen/ATen.h>

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

at::Tensor DeterministicDropout(const at::Tensor& x, double keep_prob, std::array<int64_t, 2> seeds,
                                const std::optional<std::vector<int64_t>>& noise_shape) {
  CheckKeepProb(keep_prob);
  if (keep_prob == 1.0) return x;
  at::Generator gen = MakeSeededGenerator(seeds);
  std::vector<int64_t> shape = noise_shape ? *noise_shape : x.sizes().vec();
  // A rank's rows of a batch split over ranks: the whole batch's draw, this block of it
  // (core/step_seed.h: BatchShard; and its dim-1 block when one is set). A mask broadcast over
  // a split dim is the same for every block.
  const BatchShard shard = CurrentBatchShard();
  const bool per_row = shard.count > 1 && !shape.empty() && x.dim() > 0 &&
                       shape[0] == x.size(0) && (!noise_shape || shape[0] != 1);
  const bool per_column = shard.count1 > 1 && shape.size() > 1 && x.dim() > 1 &&
                          shape[1] == x.size(1) && (!noise_shape || shape[1] != 1);
  if (per_row) shape[0] *= shard.count;
  if (per_column) shape[1] *= shard.count1;
  at::Tensor u = at::empty(shape, at::TensorOptions().dtype(at::kFloat)).uniform_(0.0, 1.0, gen);
  if (per_row) u = u.narrow(0, shard.index * x.size(0), x.size(0));
  if (per_column) u = u.narrow(1, shard.index1 * x.size(1), x.size(1));
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
