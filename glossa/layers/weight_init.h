// WeightInit and WeightParams: how a variable is shaped and initialized, with every one of Lingvo's
// initialization methods and its exact formula and fan-in/fan-out rule.
//
//   WeightParams wp{{512, 1024}, WeightInit::Xavier(), DType::kFloat32};
//   at::Tensor w = InitializeWeight(wp, /*seed=*/{random_seed, GenerateSeedFromName("enc/w")});
//
// Methods (U = uniform, N = normal, TN = normal redrawn until |z| < 2, fans per FanInFanOut):
//   gaussian N(0, s); uniform U(-s, s); uniform_positive U(0, s); category floor(U(0, s));
//   xavier s·U(-L, L), L = sqrt(6/(fan_in+fan_out)); geo_mean_xavier s·U(-L, L),
//   L = sqrt(3/sqrt(fan_in·fan_out)); constant: every element s; truncated_gaussian TN(0, s);
//   gaussian_sqrt_dim N(0, s/sqrt(shape[0])); gaussian_sqrt_fanin/fanout N(0, s/sqrt(fan));
//   gaussian_sqrt_fanavg N(0, s·sqrt(2/(fan_in+fan_out))); uniform_sqrt_dim U(±s/sqrt(shape[0]));
//   uniform_unit_scaling U(±sqrt(3/max(1, prod(shape[:-1])))·s);
//   uniform_unit_scaling_fan_avg U(±sqrt(3s/max(1, (fan_in+fan_out)/2)));
//   truncated_gaussian_sqrt_dim/fanin/fanout TN(0, s/sqrt(shape[0] | fan_in | fan_out));
//   kaiming_uniform_fanin_relu U(±sqrt(6/F)); kaiming_uniform_fanin_leakyrelu
//   U(±sqrt(3)·sqrt(2/(1+s²))/sqrt(F)), s the negative slope (default sqrt(5)), F =
//   prod(shape[:-1]).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "glossa/core/dtype.h"
#include "glossa/core/params.h"

namespace glossa {

struct WeightInit {
  std::string method = "xavier";
  double scale = kDefaultXavierScale;
  std::optional<int64_t> seed;

  // Lingvo's marker value for "the default init" (DefaultParamInit).
  static constexpr double kDefaultXavierScale = 1.000001;

  static WeightInit Gaussian(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit Uniform(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit UniformPositive(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit Category(double scale = 2, std::optional<int64_t> seed = {});
  static WeightInit Xavier(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit XavierWithFixupParams(double scale = 1.0, double depth = 1.0,
                                          double layers_per_residual_block = 1.0,
                                          std::optional<int64_t> seed = {});
  static WeightInit GeoMeanXavier(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit Constant(double scale = 1.0);
  static WeightInit TruncatedGaussian(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit GaussianSqrtDim(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit GaussianSqrtFanIn(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit GaussianSqrtFanOut(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit GaussianSqrtFanAvg(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit UniformSqrtDim(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit UniformUnitScaling(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit UniformUnitScalingFanAvg(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit TruncatedGaussianSqrtDim(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit TruncatedGaussianSqrtFanIn(double scale = 1.0,
                                               std::optional<int64_t> seed = {});
  static WeightInit TruncatedGaussianSqrtFanOut(double scale = 1.0,
                                                std::optional<int64_t> seed = {});
  static WeightInit KaimingUniformFanInRelu(double scale = 1.0, std::optional<int64_t> seed = {});
  static WeightInit KaimingUniformFanInLeakyRelu(double scale = 2.23606797749979,
                                                 std::optional<int64_t> seed = {});
  static WeightInit Default() { return Xavier(kDefaultXavierScale); }

  // Lingvo's IsDefaultParamInit: xavier, |scale - 1.000001| < 1e-7, no seed.
  bool IsDefault() const;
  // As a Params with `method`, `scale` and `seed`, so params text can override each field.
  Params ToParams() const;
  // InvalidArgument for an unknown method or a negative scale on a method other than constant.
  static WeightInit FromParams(const Params& p);
  bool operator==(const WeightInit&) const = default;
};

// Every method name, in Lingvo's spelling.
const std::vector<std::string>& WeightInitMethods();

struct WeightParams {
  WeightParams() = default;
  WeightParams(std::vector<int64_t> shape, WeightInit init = WeightInit::Default(),  // NOLINT
               DType dtype = DType::kFloat32, std::vector<std::string> collections = {})
      : shape(std::move(shape)),
        init(std::move(init)),
        dtype(dtype),
        collections(std::move(collections)) {}

  std::vector<int64_t> shape;
  WeightInit init = WeightInit::Default();
  DType dtype = DType::kFloat32;
  // Collection names; "non_trainable" makes the variable non-trainable (no gradient, not given to
  // the optimizer), "skip_lp_regularization" exempts it from L1/L2 penalties.
  std::vector<std::string> collections;
  // A variable split along dim shard_dim over shard_count ranks (GShard's experts along dim 0, a
  // model axis's shards along the dim its layer's weight_split_dims_mapping names) holds block
  // shard_index: `shape` is the block's, and its initial value is that block of the whole
  // variable's (shape[shard_dim] · shard_count) initial value, so any split starts as one process.
  int64_t shard_index = 0;
  int64_t shard_count = 1;
  int64_t shard_dim = 0;
};

inline constexpr const char* kNonTrainableCollection = "non_trainable";
inline constexpr const char* kSkipLpRegularizationCollection = "skip_lp_regularization";
// A variable that holds this rank's share only (GShard's experts on the mesh's expert axis,
// glossa/layers/mesh.h): data parallelism neither averages its gradient nor broadcasts its value,
// and the global gradient norm sums its squares over the ranks.
inline constexpr const char* kExpertShardedCollection = "expert_sharded";
// A variable of a pipeline stage's cells built on this rank alone (glossa/layers/gpipe.h, stages
// on a 'pipe' mesh axis): whole, not split; data parallelism does not average its gradient nor
// broadcast its value, and the global gradient norm sums its squares over the ranks.
inline constexpr const char* kPipelineStageCollection = "pipeline_stage";
// A variable split over the ranks of a 'model' mesh axis (tensor parallelism: a block of heads or
// hidden units, WeightParams::shard_dim): data parallelism averages its gradient over the ranks
// holding the same block only, and the global gradient norm counts every block once.
inline constexpr const char* kModelShardedCollection = "model_sharded";
// Non-trainable statistics that exponential moving averages also track (batch-norm moving stats).
inline constexpr const char* kMovingVarsCollection = "moving_vars";

// Lingvo's GetFanInFanOut: nullopt for a scalar; (d, d) for rank 1; otherwise
// (shape[-2]·rf, shape[-1]·rf) with rf the product of the other dims.
std::optional<std::pair<int64_t, int64_t>> FanInFanOut(const std::vector<int64_t>& shape);

// Draws the initial value of a variable on the CPU, deterministically from `seed` (a pair, as
// Lingvo's stateless initializers use: (user seed, GenerateSeedFromName(full name))).
// InvalidArgument names the problem (unknown method, negative scale, zero dims, xavier on a scalar,
// a random method on an integer dtype).
at::Tensor InitializeWeight(const WeightParams& wp, std::array<int64_t, 2> seed);

// A CPU generator keyed by a seed pair; the same pair gives the same stream.
at::Generator MakeSeededGenerator(std::array<int64_t, 2> seed);

// "[2, 3]": a shape for error messages.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace glossa
