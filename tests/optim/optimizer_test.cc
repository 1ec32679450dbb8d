// Optimizers against independent references: PyTorch's optimizers where the math is TensorFlow's
// (tests/reference/optimizer_reference.py), and element-by-element formula implementations written
// here for TensorFlow's Adam and RMSProp and for Adafactor.
#include "glossa/optim/optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace glossa {
namespace {

using json = nlohmann::json;

json Reference() {
  return json::parse(testing::ReadSourceFile("tests/reference/optimizer_reference.json"));
}

at::Tensor FromList(const json& data, std::vector<int64_t> shape) {
  return at::tensor(data.get<std::vector<double>>(), at::kDouble).reshape(shape).clone();
}

std::vector<double> ToVector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

void ExpectNear(const at::Tensor& actual, const at::Tensor& expected, double tol,
                const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_LE((actual.to(at::kDouble) - expected).abs().max().item<double>(), tol) << what;
}

TEST(Optimizers, MatchPyTorchWhereTheMathIsTensorFlows) {
  json ref = Reference();
  const std::vector<int64_t> shape = ref["shape"].get<std::vector<int64_t>>();
  const double lr = ref["lr"].get<double>();
  std::map<std::string, Params> params = {
      {"sgd", SGD::Params()},
      {"momentum", Momentum::Params().Set("alpha", 0.9)},
      {"nesterov", Momentum::Params().Set("alpha", 0.9).Set("use_nesterov", true)},
      {"adagrad", Adagrad::Params()},
      {"adadelta", AdaDelta::Params()},
  };
  for (const auto& c : ref["cases"]) {
    const std::string name = c["name"];
    auto opt = params.at(name).Instantiate<Optimizer>();
    at::Tensor w = FromList(ref["w0"], shape);
    for (size_t step = 0; step < c["steps"].size(); ++step) {
      at::Tensor g = FromList(ref["grads"][step], shape);
      opt->Apply(lr, {{"model/w", w, g}}, static_cast<int64_t>(step));
      const auto& expected = c["steps"][step];
      ExpectNear(w, FromList(expected["w"], shape), 1e-12,
                 name + " weights, step " + std::to_string(step));
      for (const auto& [slot, values] : expected["slots"].items()) {
        const std::string key = "model/w/" + opt->name() + "/" + slot;
        ASSERT_TRUE(opt->slots().count(key)) << key;
        ExpectNear(opt->slots().at(key), FromList(values, shape), 1e-12, key);
      }
    }
  }
}

// TensorFlow's Adam, element by element.
TEST(Optimizers, AdamFollowsTensorFlowsForm) {
  for (auto [params, b1, b2, eps] : {std::make_tuple(Adam::Params(), 0.9, 0.999, 1e-6),
                                     std::make_tuple(Adam::ParamsA(), 0.9, 0.997, 1e-9),
                                     std::make_tuple(Adam::ParamsB(), 0.9, 0.98, 1e-9)}) {
    auto opt = params.Instantiate<Optimizer>();
    at::Tensor w = at::randn({3, 2}, at::kDouble);
    std::vector<double> ref = ToVector(w), m(6, 0.0), v(6, 0.0);
    const double lr = 0.01;
    for (int t = 1; t <= 6; ++t) {
      at::Tensor g = at::randn({3, 2}, at::kDouble);
      std::vector<double> gv = ToVector(g);
      const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
      for (int i = 0; i < 6; ++i) {
        m[i] = b1 * m[i] + (1 - b1) * gv[i];
        v[i] = b2 * v[i] + (1 - b2) * gv[i] * gv[i];
        ref[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
      }
      opt->Apply(lr, {{"w", w, g}}, t - 1);
    }
    for (int i = 0; i < 6; ++i) {
      EXPECT_NEAR(ToVector(w)[i], ref[i], 1e-12);
      EXPECT_NEAR(ToVector(opt->slots().at("w/Adam/m"))[i], m[i], 1e-12);
      EXPECT_NEAR(ToVector(opt->slots().at("w/Adam/v"))[i], v[i], 1e-12);
    }
    EXPECT_NEAR(opt->slots().at("Adam/beta1_power").item<double>(), std::pow(b1, 7), 1e-12);
  }
}

// Float32 variables take the one-pass kernel (optimizer.cc, on AVX-512 CPUs): the same updates as
// the double-precision reference to float32 rounding, over sizes around its 16-wide vectors and
// its parallel grain, and a non-contiguous variable (the ATen ops) alike.
TEST(Optimizers, AdamInFloat32MatchesTheFloat64Updates) {
  for (int64_t n : {1, 15, 16, 17, 100, 70000}) {
    auto opt = Adam::ParamsB().Instantiate<Optimizer>();
    at::Tensor w64 = at::randn({n}, at::kDouble);
    at::Tensor w = w64.to(at::kFloat);
    at::Tensor wt = at::randn({4, 3}, at::kFloat).t();  // not contiguous
    at::Tensor wt64 = wt.to(at::kDouble);
    std::vector<double> m(n, 0.0), v(n, 0.0);
    std::vector<double> ref = ToVector(w.to(at::kDouble));
    const double b1 = 0.9, b2 = 0.98, eps = 1e-9, lr = 0.01;
    for (int t = 1; t <= 5; ++t) {
      at::Tensor g = at::randn({n}, at::kFloat);
      at::Tensor gt = at::randn({3, 4}, at::kFloat);
      std::vector<double> gv = ToVector(g.to(at::kDouble));
      const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
      for (int64_t i = 0; i < n; ++i) {
        m[i] = b1 * m[i] + (1 - b1) * gv[i];
        v[i] = b2 * v[i] + (1 - b2) * gv[i] * gv[i];
        ref[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
      }
      opt->Apply(lr, {{"w", w, g}, {"wt", wt, gt}}, t - 1);
    }
    const std::vector<double> got = ToVector(w.to(at::kDouble));
    const std::vector<double> gm = ToVector(opt->slots().at("w/Adam/m").to(at::kDouble));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[i], ref[i], 1e-5 * (1 + std::abs(ref[i]))) << "n=" << n << " i=" << i;
      ASSERT_NEAR(gm[i], m[i], 1e-6 * (1 + std::abs(m[i]))) << "n=" << n << " i=" << i;
    }
    EXPECT_FALSE(at::equal(wt, wt64.to(at::kFloat)));  // the non-contiguous one was updated too
  }
  // Bit for bit the ATen ops Adam ran before the kernel, on the same contiguous float32 tensors.
  auto opt = Adam::ParamsB().Instantiate<Optimizer>();
  at::Tensor a = at::randn({64, 48}, at::kFloat);
  at::Tensor b = a.clone(), mb = at::zeros_like(a), vb = at::zeros_like(a);
  double p1 = 0.9, p2 = 0.98;
  for (int t = 0; t < 4; ++t) {
    at::Tensor g = at::randn({64, 48}, at::kFloat) * (t == 2 ? 1e-6 : 1.0);
    opt->Apply(0.01, {{"a", a, g}}, t);
    const double lr_t = 0.01 * std::sqrt(1 - p2) / (1 - p1);
    mb.mul_(0.9).add_(g, 1 - 0.9);
    vb.mul_(0.98).addcmul_(g, g, 1 - 0.98);
    b.addcdiv_(mb, vb.sqrt().add_(1e-9), -lr_t);
    p1 *= 0.9;
    p2 *= 0.98;
  }
  EXPECT_TRUE(at::equal(a, b)) << "max |diff| " << (a - b).abs().max().item<double>();
  EXPECT_TRUE(at::equal(opt->slots().at("a/Adam/m"), mb));
  EXPECT_TRUE(at::equal(opt->slots().at("a/Adam/v"), vb));
}

TEST(Optimizers, RMSPropFollowsTensorFlowsForm) {
  auto opt = RMSProp::Params().Set("epsilon", 1e-3).Instantiate<Optimizer>();
  at::Tensor w = at::randn({5}, at::kDouble);
  std::vector<double> ref = ToVector(w), ms(5, 1.0), mom(5, 0.0);  // ms starts at 1
  for (int t = 0; t < 5; ++t) {
    at::Tensor g = at::randn({5}, at::kDouble);
    std::vector<double> gv = ToVector(g);
    for (int i = 0; i < 5; ++i) {
      ms[i] = 0.9 * ms[i] + 0.1 * gv[i] * gv[i];
      mom[i] = 0.9 * mom[i] + 0.05 * gv[i] / std::sqrt(ms[i] + 1e-3);
      ref[i] -= mom[i];
    }
    opt->Apply(0.05, {{"w", w, g}}, t);
  }
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(ToVector(w)[i], ref[i], 1e-12);
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(ToVector(opt->slots().at("w/RMSProp/rms"))[i], ms[i], 1e-12);
}

// Adafactor on a [R, C] matrix, factored (R >= C), element by element.
TEST(Optimizers, AdafactorFactoredMatchesTheAlgorithm) {
  const int64_t R = 4, C = 3;
  auto opt = Adafactor::Params()
                 .Set("min_dim_size_to_factor", 2)
                 .Set("beta1", 0.5)
                 .Set("clipping_threshold", 1.0)
                 .Instantiate<Optimizer>();
  at::Tensor w = at::randn({R, C}, at::kDouble);
  std::vector<double> ref = ToVector(w), vr(C, 0.0), vc(R, 0.0), m(R * C, 0.0);
  const double lr = 0.1, beta2 = 0.999;
  for (int step = 0; step < 4; ++step) {
    at::Tensor g = at::randn({R, C}, at::kDouble);
    std::vector<double> gv = ToVector(g);
    const double t = step + 1.0;
    const double decay = beta2 * (1 - std::pow(beta2, t - 1)) / (1 - std::pow(beta2, t));
    double rms_w = 0;
    for (double x : ref) rms_w += x * x;
    rms_w = std::sqrt(rms_w / (R * C));
    const double scale = std::max(rms_w, 1e-3) * lr;
    std::vector<double> row_mean(C, 0.0), col_mean(R, 0.0);  // mean over rows (d0) / cols (d1)
    for (int i = 0; i < R; ++i) {
      for (int j = 0; j < C; ++j) {
        const double gsq = gv[i * C + j] * gv[i * C + j] + 1e-30;
        row_mean[j] += gsq / R;
        col_mean[i] += gsq / C;
      }
    }
    double vr_mean = 0;
    for (int j = 0; j < C; ++j) {
      vr[j] = vr[j] * decay + row_mean[j] * (1 - decay);
      vr_mean += vr[j] / C;
    }
    for (int i = 0; i < R; ++i) vc[i] = vc[i] * decay + col_mean[i] * (1 - decay);
    std::vector<double> x(R * C);
    double rms_x = 0;
    for (int i = 0; i < R; ++i) {
      for (int j = 0; j < C; ++j) {
        x[i * C + j] = gv[i * C + j] / std::sqrt(vc[i] * vr[j] / vr_mean);
        rms_x += x[i * C + j] * x[i * C + j];
      }
    }
    rms_x = std::sqrt(rms_x / (R * C));
    for (int k = 0; k < R * C; ++k) {
      const double sub = x[k] / std::max(1.0, rms_x / 1.0) * scale;
      m[k] = 0.5 * m[k] + 0.5 * sub;
      ref[k] -= m[k];
    }
    opt->Apply(lr, {{"w", w, g}}, step);
  }
  for (int k = 0; k < R * C; ++k) EXPECT_NEAR(ToVector(w)[k], ref[k], 1e-10) << k;
  EXPECT_EQ(opt->slots().at("w/Adafactor/vr").sizes(), (std::vector<int64_t>{C}));
  EXPECT_EQ(opt->slots().at("w/Adafactor/vc").sizes(), (std::vector<int64_t>{R}));
  for (int j = 0; j < C; ++j)
    EXPECT_NEAR(ToVector(opt->slots().at("w/Adafactor/vr"))[j], vr[j], 1e-12);
}

TEST(Optimizers, AdafactorUnfactoredWithDecayExponentAndRelativeStep) {
  auto opt = Adafactor::Params()
                 .Set("decay_exponent_pow", 0.8)
                 .Set("multiply_by_parameter_scale", false)
                 .Set("relative_step", true)
                 .Instantiate<Optimizer>();
  at::Tensor w = at::randn({6}, at::kDouble);  // rank 1: never factored
  std::vector<double> ref = ToVector(w), v(6, 0.0);
  for (int step = 0; step < 3; ++step) {
    at::Tensor g = at::randn({6}, at::kDouble);
    std::vector<double> gv = ToVector(g);
    const double decay = 1 - std::pow(step + 1.0, -0.8);
    const double lr = 2.0 * std::min(1e-2, 1 / std::sqrt(step + 1.0));
    for (int i = 0; i < 6; ++i) {
      v[i] = v[i] * decay + (gv[i] * gv[i] + 1e-30) * (1 - decay);
      ref[i] -= gv[i] / std::sqrt(v[i]) * lr;
    }
    opt->Apply(2.0, {{"w", w, g}}, step);
  }
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(ToVector(w)[i], ref[i], 1e-12);
  EXPECT_TRUE(opt->slots().count("w/Adafactor/v"));
  EXPECT_FALSE(opt->slots().count("w/Adafactor/m"));  // beta1 = 0: no momentum slot
}

TEST(Optimizers, GradientAccumulatorAppliesTheMeanEveryNSteps) {
  auto opt = GradientAccumulator::Params()
                 .Set("accum_steps", 3)
                 .Set("optimizer_tpl", SGD::Params())
                 .Instantiate<Optimizer>();
  at::Tensor w = at::zeros({2}, at::kDouble);
  std::vector<at::Tensor> gs = {at::tensor({1.0, 2.0}, at::kDouble),
                                at::tensor({3.0, 4.0}, at::kDouble),
                                at::tensor({5.0, 6.0}, at::kDouble)};
  opt->Apply(1.0, {{"w", w, gs[0]}}, 0);
  opt->Apply(1.0, {{"w", w, gs[1]}}, 1);
  EXPECT_TRUE(at::equal(w, at::zeros({2}, at::kDouble)));
  EXPECT_TRUE(at::equal(opt->slots().at("w/GradientAccumulator/grad_accumulator"),
                        at::tensor({4.0, 6.0}, at::kDouble)));
  opt->Apply(1.0, {{"w", w, gs[2]}}, 2);  // 2 % 3 == 3 - 1: apply the mean (3, 4)
  EXPECT_TRUE(at::allclose(w, at::tensor({-3.0, -4.0}, at::kDouble)));
  EXPECT_TRUE(at::equal(opt->slots().at("w/GradientAccumulator/grad_accumulator"),
                        at::zeros({2}, at::kDouble)));
  EXPECT_THROW(GradientAccumulator::Params().Set("accum_steps", 0).Instantiate<Optimizer>(),
               InvalidArgumentError);
}

TEST(Optimizers, RestoredSlotsContinueTheTrajectory) {
  at::Tensor w1 = at::randn({3}, at::kDouble), w2 = w1.clone();
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 4; ++i) grads.push_back(at::randn({3}, at::kDouble));
  auto a = Adam::Params().Instantiate<Optimizer>();
  for (int i = 0; i < 4; ++i) a->Apply(0.1, {{"w", w1, grads[i]}}, i);
  auto b = Adam::Params().Instantiate<Optimizer>();
  for (int i = 0; i < 2; ++i) b->Apply(0.1, {{"w", w2, grads[i]}}, i);
  auto c = Adam::Params().Instantiate<Optimizer>();
  for (const auto& [name, value] : b->slots()) c->SetSlot(name, value);
  for (int i = 2; i < 4; ++i) c->Apply(0.1, {{"w", w2, grads[i]}}, i);
  EXPECT_TRUE(at::allclose(w1, w2, 1e-14, 1e-14));
  EXPECT_THROW(c->SetSlot("w/Adam/m", at::zeros({4})), InvalidArgumentError);
}

TEST(Optimizers, RejectMismatchedGradients) {
  auto opt = SGD::Params().Instantiate<Optimizer>();
  at::Tensor w = at::zeros({2});
  EXPECT_ERROR_CONTAINS(opt->Apply(0.1, {{"w", w, at::zeros({3})}}, 0), InvalidArgumentError,
                        "variable 'w' and its gradient");
  EXPECT_THROW(Optimizer::Params().Set("cls", ClsOf<SGD>()).Instantiate<Optimizer>(),
               InvalidArgumentError);  // no name
}

TEST(Optimizers, ASlotMissingFromARestoredCheckpointIsAnErrorNotAZero) {
  at::Tensor w = at::ones({3}), g = at::full({3}, 0.5);
  auto trained = Adam::Params().Instantiate<Optimizer>();
  trained->Apply(0.1, {{"model/w", w, g}, {"model/b", w.clone(), g}}, 0);
  auto slots = trained->slots();
  ASSERT_TRUE(slots.count("model/w/Adam/v"));
  slots.erase("model/w/Adam/v");
  auto restored = Adam::Params().Instantiate<Optimizer>();
  for (const auto& [name, t] : slots) restored->SetSlot(name, t);
  const at::Tensor before = w.clone();
  EXPECT_ERROR_CONTAINS(restored->Apply(0.1, {{"model/w", w, g}}, 1), InvalidArgumentError,
                        "lacks optimizer slot 'model/w/Adam/v' (it holds 'model/w/Adam/m'");
  EXPECT_TRUE(at::equal(w, before));  // nothing was updated
  // Missing both slots of a variable is no better: restored state with a variable trained now
  // that has none is an error naming it, not moments restarted at zero (softmax/bias_0 of an
  // edited checkpoint).
  at::Tensor u = at::ones({2});
  EXPECT_ERROR_CONTAINS(restored->Apply(0.1, {{"model/u", u, at::ones({2})}}, 1),
                        InvalidArgumentError,
                        "lacks optimizer slot 'model/u/Adam/m': it holds this optimizer's slots "
                        "(e.g. of 'model/b') but none of variable 'model/u'");
  EXPECT_TRUE(at::equal(u, at::ones({2})));
  // An optimizer restored from no state (a checkpoint without slots, or a first run) starts every
  // variable's slots at zero.
  auto fresh = Adam::Params().Instantiate<Optimizer>();
  EXPECT_NO_THROW(fresh->Apply(0.1, {{"model/u", u, at::ones({2})}}, 1));
}

}  // namespace
}  // namespace glossa
