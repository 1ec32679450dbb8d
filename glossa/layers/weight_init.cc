#include "glossa/layers/weight_init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

WeightInit Make(std::string method, double scale, std::optional<int64_t> seed) {
  return WeightInit{std::move(method), scale, seed};
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Standard normals redrawn until |z| < 2 (TensorFlow's truncated_normal).
at::Tensor TruncatedStandardNormal(const std::vector<int64_t>& shape, at::Generator& gen) {
  at::Tensor z = at::normal(0.0, 1.0, shape, gen, at::TensorOptions().dtype(at::kDouble));
  while (true) {
    at::Tensor bad = z.abs() >= 2.0;
    const int64_t n = bad.sum().item<int64_t>();
    if (n == 0) return z;
    z.masked_scatter_(bad, at::normal(0.0, 1.0, {n}, gen, at::TensorOptions().dtype(at::kDouble)));
  }
}

}  // namespace

WeightInit WeightInit::Gaussian(double s, std::optional<int64_t> seed) {
  return Make("gaussian", s, seed);
}
WeightInit WeightInit::Uniform(double s, std::optional<int64_t> seed) {
  return Make("uniform", s, seed);
}
WeightInit WeightInit::UniformPositive(double s, std::optional<int64_t> seed) {
  return Make("uniform_positive", s, seed);
}
WeightInit WeightInit::Category(double s, std::optional<int64_t> seed) {
  return Make("category", s, seed);
}
WeightInit WeightInit::Xavier(double s, std::optional<int64_t> seed) {
  return Make("xavier", s, seed);
}
WeightInit WeightInit::XavierWithFixupParams(double scale, double depth,
                                             double layers_per_residual_block,
                                             std::optional<int64_t> seed) {
  return Make("xavier", scale * std::pow(depth, -1.0 / (2 * layers_per_residual_block)), seed);
}
WeightInit WeightInit::GeoMeanXavier(double s, std::optional<int64_t> seed) {
  return Make("geo_mean_xavier", s, seed);
}
WeightInit WeightInit::Constant(double s) { return Make("constant", s, 0); }
WeightInit WeightInit::TruncatedGaussian(double s, std::optional<int64_t> seed) {
  return Make("truncated_gaussian", s, seed);
}
WeightInit WeightInit::GaussianSqrtDim(double s, std::optional<int64_t> seed) {
  return Make("gaussian_sqrt_dim", s, seed);
}
WeightInit WeightInit::GaussianSqrtFanIn(double s, std::optional<int64_t> seed) {
  return Make("gaussian_sqrt_fanin", s, seed);
}
WeightInit WeightInit::GaussianSqrtFanOut(double s, std::optional<int64_t> seed) {
  return Make("gaussian_sqrt_fanout", s, seed);
}
WeightInit WeightInit::GaussianSqrtFanAvg(double s, std::optional<int64_t> seed) {
  return Make("gaussian_sqrt_fanavg", s, seed);
}
WeightInit WeightInit::UniformSqrtDim(double s, std::optional<int64_t> seed) {
  return Make("uniform_sqrt_dim", s, seed);
}
WeightInit WeightInit::UniformUnitScaling(double s, std::optional<int64_t> seed) {
  return Make("uniform_unit_scaling", s, seed);
}
WeightInit WeightInit::UniformUnitScalingFanAvg(double s, std::optional<int64_t> seed) {
  return Make("uniform_unit_scaling_fan_avg", s, seed);
}
WeightInit WeightInit::TruncatedGaussianSqrtDim(double s, std::optional<int64_t> seed) {
  return Make("truncated_gaussian_sqrt_dim", s, seed);
}
WeightInit WeightInit::TruncatedGaussianSqrtFanIn(double s, std::optional<int64_t> seed) {
  return Make("truncated_gaussian_sqrt_fanin", s, seed);
}
WeightInit WeightInit::TruncatedGaussianSqrtFanOut(double s, std::optional<int64_t> seed) {
  return Make("truncated_gaussian_sqrt_fanout", s, seed);
}
WeightInit WeightInit::KaimingUniformFanInRelu(double s, std::optional<int64_t> seed) {
  return Make("kaiming_uniform_fanin_relu", s, seed);
}
WeightInit WeightInit::KaimingUniformFanInLeakyRelu(double s, std::optional<int64_t> seed) {
  return Make("kaiming_uniform_fanin_leakyrelu", s, seed);
}

const std::vector<std::string>& WeightInitMethods() {
  static const std::vector<std::string> kMethods = {
      "gaussian",
      "uniform",
      "uniform_positive",
      "category",
      "xavier",
      "geo_mean_xavier",
      "constant",
      "truncated_gaussian",
      "gaussian_sqrt_dim",
      "gaussian_sqrt_fanin",
      "gaussian_sqrt_fanout",
      "gaussian_sqrt_fanavg",
      "uniform_sqrt_dim",
      "uniform_unit_scaling",
      "uniform_unit_scaling_fan_avg",
      "truncated_gaussian_sqrt_dim",
      "truncated_gaussian_sqrt_fanin",
      "truncated_gaussian_sqrt_fanout",
      "kaiming_uniform_fanin_relu",
      "kaiming_uniform_fanin_leakyrelu",
  };
  return kMethods;
}

bool WeightInit::IsDefault() const {
  return method == "xavier" && std::abs(scale - kDefaultXavierScale) < 1e-7 && !seed;
}

Params WeightInit::ToParams() const {
  Params p;
  p.Define("method", method, "Initialization method (Lingvo's WeightInit method name).");
  p.Define("scale", scale, "Scale of the initialization (see the method's formula).");
  p.Define("seed", seed ? ParamValue(*seed) : ParamValue(), "Seed; None uses the layer's.");
  return p;
}

WeightInit WeightInit::FromParams(const Params& p) {
  WeightInit w;
  w.method = p.GetString("method");
  w.scale = p.GetFloat("scale");
  if (p.IsSet("seed")) w.seed = p.GetInt("seed");
  const auto& methods = WeightInitMethods();
  if (std::find(methods.begin(), methods.end(), w.method) == methods.end()) {
    throw InvalidArgumentError(
        StrCat("unknown WeightInit method ", KeyErrorString(w.method, methods)));
  }
  if (w.method != "constant" && w.scale < 0) {
    throw InvalidArgumentError(StrCat("WeightInit ", w.method, ": scale must be >= 0, got ",
                                      PyFloatRepr(w.scale), " (only constant allows negative)"));
  }
  return w;
}

std::optional<std::pair<int64_t, int64_t>> FanInFanOut(const std::vector<int64_t>& shape) {
  if (shape.empty()) return std::nullopt;
  if (shape.size() == 1) return std::make_pair(shape[0], shape[0]);
  int64_t rf = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) rf *= shape[i];
  return std::make_pair(shape[shape.size() - 2] * rf, shape.back() * rf);
}

at::Generator MakeSeededGenerator(std::array<int64_t, 2> seed) {
  const uint64_t mixed =
      SplitMix64(SplitMix64(static_cast<uint64_t>(seed[0])) ^ static_cast<uint64_t>(seed[1]));
  return at::make_generator<at::CPUGeneratorImpl>(mixed);
}

namespace {

// Throws InvalidArgumentError if `wp`'s shape has a dimension <= 0, its method is unknown, or its
// scale is negative for a method other than constant.
void CheckWeightParams(const WeightParams& wp) {
  const WeightInit& init = wp.init;
  const std::vector<int64_t>& shape = wp.shape;
  for (int64_t d : shape) {
    if (d <= 0) {
      throw InvalidArgumentError(
          StrCat("variable shape ", ShapeString(shape), " has a dimension <= 0"));
    }
  }
  const auto& methods = WeightInitMethods();
  if (std::find(methods.begin(), methods.end(), init.method) == methods.end()) {
    throw InvalidArgumentError(
        StrCat("unknown WeightInit method ", KeyErrorString(init.method, methods)));
  }
  if (init.method != "constant" && init.scale < 0) {
    throw InvalidArgumentError(
        StrCat("WeightInit ", init.method, ": scale must be >= 0, got ", PyFloatRepr(init.scale)));
  }
}

}  // namespace

at::Tensor InitializeWeight(const WeightParams& wp, std::array<int64_t, 2> seed) {
  CheckWeightParams(wp);
  const WeightInit& init = wp.init;
  const std::vector<int64_t>& shape = wp.shape;
  const at::ScalarType dtype = ToScalarType(wp.dtype);
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  if (init.method == "constant") return at::full(shape, init.scale, opts).to(dtype);
  if (!at::isFloatingType(dtype)) {
    throw InvalidArgumentError(StrCat("WeightInit ", init.method, " cannot initialize a ",
                                      DTypeName(wp.dtype), " variable; use constant"));
  }
  at::Generator gen = MakeSeededGenerator(seed);
  const int64_t dim0 = shape.empty() ? 1 : shape[0];
  const auto fans = FanInFanOut(shape);
  auto uniform = [&](double lo, double hi) { return at::empty(shape, opts).uniform_(lo, hi, gen); };
  auto normal = [&](double stddev) { return at::normal(0.0, stddev, shape, gen, opts); };
  auto truncated = [&](double stddev) { return TruncatedStandardNormal(shape, gen) * stddev; };
  double scale = init.scale;
  const std::string& m = init.method;
  at::Tensor v;
  if (m == "gaussian") {
    v = normal(scale);
  } else if (m == "uniform") {
    v = uniform(-scale, scale);
  } else if (m == "uniform_positive") {
    v = uniform(0.0, scale);
  } else if (m == "category") {
    v = uniform(0.0, scale).floor();
  } else if (m == "xavier" || m == "geo_mean_xavier") {
    if (!fans) {
      throw InvalidArgumentError(StrCat("WeightInit ", m, " needs a shape of rank >= 1"));
    }
    const double fin = static_cast<double>(fans->first), fout = static_cast<double>(fans->second);
    const double limit =
        m == "xavier" ? std::sqrt(6.0 / (fin + fout)) : std::sqrt(3.0 / std::sqrt(fin * fout));
    v = uniform(-limit, limit) * scale;
  } else if (m == "truncated_gaussian") {
    v = truncated(scale);
  } else if (m == "gaussian_sqrt_dim" || m == "uniform_sqrt_dim" ||
             m == "truncated_gaussian_sqrt_dim") {
    scale *= 1.0 / std::sqrt(static_cast<double>(dim0));
    v = m == "gaussian_sqrt_dim"  ? normal(scale)
        : m == "uniform_sqrt_dim" ? uniform(-scale, scale)
                                  : truncated(scale);
  } else if (m == "gaussian_sqrt_fanin" || m == "truncated_gaussian_sqrt_fanin") {
    if (fans) scale *= 1.0 / std::sqrt(static_cast<double>(fans->first));
    v = m == "gaussian_sqrt_fanin" ? normal(scale) : truncated(scale);
  } else if (m == "gaussian_sqrt_fanout" || m == "truncated_gaussian_sqrt_fanout") {
    if (fans) scale *= 1.0 / std::sqrt(static_cast<double>(fans->second));
    v = m == "gaussian_sqrt_fanout" ? normal(scale) : truncated(scale);
  } else if (m == "gaussian_sqrt_fanavg") {
    if (fans) scale *= std::sqrt(2.0 / static_cast<double>(fans->first + fans->second));
    v = normal(scale);
  } else if (m == "uniform_unit_scaling") {
    int64_t prod = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) prod *= shape[i];
    const double limit = std::sqrt(3.0 / static_cast<double>(std::max<int64_t>(1, prod))) * scale;
    v = uniform(-limit, limit);
  } else if (m == "uniform_unit_scaling_fan_avg") {
    const auto f = fans ? *fans : std::make_pair<int64_t, int64_t>(1, 1);
    const double avg = std::max(1.0, static_cast<double>(f.first + f.second) / 2.0);
    const double limit = std::sqrt(3.0 * scale / avg);
    v = uniform(-limit, limit);
  } else if (m == "kaiming_uniform_fanin_relu" || m == "kaiming_uniform_fanin_leakyrelu") {
    double fan = 1.0;
    for (size_t i = 0; i + 1 < shape.size(); ++i) fan *= static_cast<double>(shape[i]);
    const double gain =
        m == "kaiming_uniform_fanin_relu" ? std::sqrt(2.0) : std::sqrt(2.0 / (1.0 + scale * scale));
    const double bound = std::sqrt(3.0) * gain / std::sqrt(fan);
    v = uniform(-bound, bound);
  } else {
    throw InternalError(StrCat("WeightInit method ", m, " has no formula"));
  }
  return v.to(dtype);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(std::to_string(d));
  return "[" + Join(dims, ", ") + "]";
}

}  // namespace glossa
