#include "glossa/layers/weight_init.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_util.h"

namespace glossa {
namespace {

constexpr double kTruncatedVariance = 0.7737413;  // Var of N(0,1) truncated to (-2, 2)

at::Tensor Draw(const WeightInit& init, std::vector<int64_t> shape = {200, 300},
                std::array<int64_t, 2> seed = {1, 2}) {
  return InitializeWeight(WeightParams{shape, init, DType::kFloat64, {}}, seed);
}

struct Moments {
  double mean, var, min, max;
};
Moments Stats(const at::Tensor& t) {
  return {t.mean().item<double>(), t.var(/*unbiased=*/false).item<double>(), t.min().item<double>(),
          t.max().item<double>()};
}

void ExpectUniform(const at::Tensor& t, double lo, double hi, const std::string& what) {
  Moments m = Stats(t);
  EXPECT_GE(m.min, lo) << what;
  EXPECT_LT(m.max, hi) << what;
  EXPECT_NEAR(m.mean, (lo + hi) / 2, 0.02 * (hi - lo)) << what;
  EXPECT_NEAR(m.var, (hi - lo) * (hi - lo) / 12, 0.03 * (hi - lo) * (hi - lo) / 12) << what;
  EXPECT_LT(m.min, lo + 0.01 * (hi - lo)) << what << ": range too narrow";  // reaches the bounds
  EXPECT_GT(m.max, hi - 0.01 * (hi - lo)) << what;
}

void ExpectNormal(const at::Tensor& t, double stddev, bool truncated, const std::string& what) {
  Moments m = Stats(t);
  const double var = stddev * stddev * (truncated ? kTruncatedVariance : 1.0);
  EXPECT_NEAR(m.mean, 0.0, 0.02 * stddev) << what;
  EXPECT_NEAR(m.var, var, 0.03 * var) << what;
  if (truncated) {
    EXPECT_LT(std::max(-m.min, m.max), 2.0 * stddev) << what;
    EXPECT_GT(m.max, 1.9 * stddev) << what;
  } else {
    EXPECT_GT(m.max, 3.0 * stddev) << what;  // 60000 normals reach past 3 sigma
  }
}

TEST(WeightInit, FanInFanOutFollowsLingvo) {
  EXPECT_FALSE(FanInFanOut({}).has_value());
  EXPECT_EQ(*FanInFanOut({7}), (std::pair<int64_t, int64_t>(7, 7)));
  EXPECT_EQ(*FanInFanOut({3, 5}), (std::pair<int64_t, int64_t>(3, 5)));
  // Conv HWIO kernel: receptive field 3*3.
  EXPECT_EQ(*FanInFanOut({3, 3, 8, 16}), (std::pair<int64_t, int64_t>(72, 144)));
}

TEST(WeightInit, EveryMethodFollowsItsFormula) {
  const double s = 0.7;
  const std::vector<int64_t> shape = {200, 300};  // fan_in 200, fan_out 300, dim0 200
  const double fin = 200, fout = 300, dim0 = 200;
  ExpectNormal(Draw(WeightInit::Gaussian(s)), s, false, "gaussian");
  ExpectUniform(Draw(WeightInit::Uniform(s)), -s, s, "uniform");
  ExpectUniform(Draw(WeightInit::UniformPositive(s)), 0, s, "uniform_positive");
  const double lx = std::sqrt(6.0 / (fin + fout));
  ExpectUniform(Draw(WeightInit::Xavier(s)), -s * lx, s * lx, "xavier");
  const double lg = std::sqrt(3.0 / std::sqrt(fin * fout));
  ExpectUniform(Draw(WeightInit::GeoMeanXavier(s)), -s * lg, s * lg, "geo_mean_xavier");
  ExpectNormal(Draw(WeightInit::TruncatedGaussian(s)), s, true, "truncated_gaussian");
  ExpectNormal(Draw(WeightInit::GaussianSqrtDim(s)), s / std::sqrt(dim0), false,
               "gaussian_sqrt_dim");
  ExpectNormal(Draw(WeightInit::GaussianSqrtFanIn(s)), s / std::sqrt(fin), false, "fanin");
  ExpectNormal(Draw(WeightInit::GaussianSqrtFanOut(s)), s / std::sqrt(fout), false, "fanout");
  ExpectNormal(Draw(WeightInit::GaussianSqrtFanAvg(s)), s * std::sqrt(2.0 / (fin + fout)), false,
               "fanavg");
  const double us = s / std::sqrt(dim0);
  ExpectUniform(Draw(WeightInit::UniformSqrtDim(s)), -us, us, "uniform_sqrt_dim");
  const double uus = std::sqrt(3.0 / 200) * s;
  ExpectUniform(Draw(WeightInit::UniformUnitScaling(s)), -uus, uus, "uniform_unit_scaling");
  const double ufa = std::sqrt(3.0 * s / ((fin + fout) / 2));
  ExpectUniform(Draw(WeightInit::UniformUnitScalingFanAvg(s)), -ufa, ufa, "unit_scaling_fan_avg");
  ExpectNormal(Draw(WeightInit::TruncatedGaussianSqrtDim(s)), s / std::sqrt(dim0), true, "tg_dim");
  ExpectNormal(Draw(WeightInit::TruncatedGaussianSqrtFanIn(s)), s / std::sqrt(fin), true, "tg_in");
  ExpectNormal(Draw(WeightInit::TruncatedGaussianSqrtFanOut(s)), s / std::sqrt(fout), true,
               "tg_out");
  const double kr = std::sqrt(6.0 / 200);
  ExpectUniform(Draw(WeightInit::KaimingUniformFanInRelu(s)), -kr, kr, "kaiming_relu");
  const double kl = std::sqrt(3.0) * std::sqrt(2.0 / (1 + s * s)) / std::sqrt(200.0);
  ExpectUniform(Draw(WeightInit::KaimingUniformFanInLeakyRelu(s)), -kl, kl, "kaiming_leaky");
  // Default negative slope sqrt(5) gives bound 1/sqrt(fan_in).
  const double kd = 1.0 / std::sqrt(200.0);
  ExpectUniform(Draw(WeightInit::KaimingUniformFanInLeakyRelu()), -kd, kd, "kaiming_leaky_default");
  at::Tensor c = Draw(WeightInit::Constant(-1.5));
  EXPECT_TRUE(c.eq(-1.5).all().item<bool>());
  at::Tensor cat = Draw(WeightInit::Category(3.0));
  EXPECT_TRUE((cat.eq(0) | cat.eq(1) | cat.eq(2)).all().item<bool>());
  EXPECT_NEAR(cat.mean().item<double>(), 1.0, 0.02);
  EXPECT_NEAR(Draw(WeightInit::XavierWithFixupParams(1.0, 4.0, 2.0)).abs().max().item<double>(),
              std::pow(4.0, -0.25) * lx, 0.01 * lx);
}

TEST(WeightInit, ConvKernelsUseTheReceptiveField) {
  at::Tensor w = Draw(WeightInit::Xavier(1.0), {3, 3, 40, 60});
  const double l = std::sqrt(6.0 / (3 * 3 * 40 + 3 * 3 * 60));
  ExpectUniform(w, -l, l, "xavier conv");
}

TEST(WeightInit, SameSeedIsBitIdenticalAndOtherSeedsDiffer) {
  for (const auto& method : WeightInitMethods()) {
    WeightInit init{method, method == "category" ? 4.0 : 0.5, std::nullopt};
    if (method == "constant") continue;
    at::Tensor a = Draw(init, {30, 20}, {7, 99});
    at::Tensor b = Draw(init, {30, 20}, {7, 99});
    EXPECT_TRUE(at::equal(a, b)) << method;
    EXPECT_FALSE(at::equal(a, Draw(init, {30, 20}, {8, 99}))) << method;
    EXPECT_FALSE(at::equal(a, Draw(init, {30, 20}, {7, 98}))) << method;
  }
}

TEST(WeightInit, DtypesAndErrors) {
  WeightParams wp{{4, 5}, WeightInit::Gaussian(1.0), DType::kBFloat16, {}};
  EXPECT_EQ(InitializeWeight(wp, {1, 1}).scalar_type(), at::kBFloat16);
  WeightParams counter{{}, WeightInit::Constant(0), DType::kInt64, {}};
  at::Tensor c = InitializeWeight(counter, {1, 1});
  EXPECT_EQ(c.dim(), 0);
  EXPECT_EQ(c.scalar_type(), at::kLong);
  EXPECT_ERROR_CONTAINS(InitializeWeight({{3}, WeightInit::Gaussian(), DType::kInt32, {}}, {1, 1}),
                        InvalidArgumentError, "cannot initialize a int32 variable");
  EXPECT_ERROR_CONTAINS(InitializeWeight({{}, WeightInit::Xavier(), DType::kFloat32, {}}, {1, 1}),
                        InvalidArgumentError, "rank >= 1");
  EXPECT_ERROR_CONTAINS(
      InitializeWeight({{3, 0}, WeightInit::Gaussian(), DType::kFloat32, {}}, {1, 1}),
      InvalidArgumentError, "dimension <= 0");
  EXPECT_ERROR_CONTAINS(
      InitializeWeight({{3}, WeightInit::Gaussian(-1.0), DType::kFloat32, {}}, {1, 1}),
      InvalidArgumentError, "scale must be >= 0");
  EXPECT_ERROR_CONTAINS(
      InitializeWeight({{3}, WeightInit{"xavir", 1.0, {}}, DType::kFloat32, {}}, {1, 1}),
      InvalidArgumentError, "did you mean");
  // Scalars: sqrt_fan methods keep the scale (no fans), as in Lingvo.
  at::Tensor scalar =
      InitializeWeight({{}, WeightInit::GaussianSqrtFanIn(2.0), DType::kFloat32, {}}, {1, 1});
  EXPECT_EQ(scalar.dim(), 0);
}

TEST(WeightInit, ParamsRoundTripAndDefault) {
  WeightInit w = WeightInit::TruncatedGaussianSqrtFanIn(0.5, 42);
  EXPECT_EQ(WeightInit::FromParams(w.ToParams()), w);
  EXPECT_TRUE(WeightInit::Default().IsDefault());
  EXPECT_EQ(WeightInit::Default().scale, 1.000001);
  EXPECT_FALSE(WeightInit::Xavier(1.0).IsDefault());
  EXPECT_FALSE(WeightInit::Xavier(1.000001, 3).IsDefault());
  Params p = w.ToParams();
  p.FromText("method : 'gaussian'\nscale : 2.0\nseed : NoneType\n");
  EXPECT_EQ(WeightInit::FromParams(p), WeightInit::Gaussian(2.0));
}

}  // namespace
}  // namespace glossa
