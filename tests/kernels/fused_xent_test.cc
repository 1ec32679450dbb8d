// The fused softmax cross-entropy kernel (glossa/kernels/fused_xent.h) against the ATen
// composition in float64 (log_softmax, gather, sum, amax, argmax and autograd's gradients), and
// SimpleFullSoftmax with and without it.
#include "glossa/kernels/attention_core.h"
#include "glossa/kernels/fused_xent.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "glossa/layers/softmax.h"

namespace glossa {
namespace {

struct Reference {
  at::Tensor xent, label_lp, max_lp, argmax, grad;
};

// The same quantities in float64 by ATen ops and autograd.
Reference ReferenceXent(const at::Tensor& logits, const at::Tensor& labels, double a, double b,
                        const at::Tensor& upstream) {
  at::Tensor x = logits.to(at::kDouble).detach().requires_grad_(true);
  at::Tensor lp = at::log_softmax(x, -1);
  at::Tensor label_lp = lp.gather(-1, labels.unsqueeze(-1)).squeeze(-1);
  at::Tensor xent = -a * label_lp;
  if (b != 0) xent = xent - b * lp.sum(-1);  // (0 · −∞ would be NaN for a −∞ logit)
  (xent * upstream.to(at::kDouble)).sum().backward();
  return {xent.detach(), label_lp.detach(), at::amax(lp.detach(), {-1}),
          logits.argmax(-1), x.grad()};
}

void ExpectClose(const at::Tensor& got, const at::Tensor& want, double atol, double rtol,
                 const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double err = ((g - w).abs() - rtol * w.abs()).max().item<double>();
  EXPECT_LE(err, atol) << what << ": max |got - want| = " << (g - w).abs().max().item<double>();
}

class FusedXentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!FusedSoftmaxXentSupported()) GTEST_SKIP() << "this CPU has no AVX-512 F, BW and VL";
  }
};

TEST_F(FusedXentTest, EqualsTheAtenCompositionInFloat64) {
  at::manual_seed(3);
  // Class counts around the 16-wide vectors and their tails, and a vocabulary-sized one.
  for (int64_t classes : {1, 2, 7, 16, 17, 31, 32, 33, 100, 2000}) {
    for (auto [a, b] : {std::pair{1.0, 0.0}, {0.9, 0.1 / classes}, {0.7, 0.02}}) {
      SCOPED_TRACE(testing::Message() << "C=" << classes << " a=" << a << " b=" << b);
      at::Tensor logits = at::randn({3, 5, classes}) * 4;
      // Large logits: the log-sum-exp must not overflow.
      logits[0][0] += 60;
      logits[1][2].fill_(-30);
      const at::Tensor labels = at::randint(0, classes, {3, 5}, at::kLong);
      const at::Tensor upstream = at::rand({3, 5});
      at::Tensor x = logits.clone().requires_grad_(true);
      SoftmaxXent r = FusedSoftmaxXent(x, labels, a, b, /*want_argmax=*/true);
      (r.xent * upstream).sum().backward();
      const Reference ref = ReferenceXent(logits, labels, a, b, upstream);
      // float32 rounding of terms up to |60 + log C|.
      ExpectClose(r.xent, ref.xent, 2e-5, 2e-6, "xent");
      ExpectClose(r.label_log_prob, ref.label_lp, 2e-5, 2e-6, "label_log_prob");
      ExpectClose(r.max_log_prob, ref.max_lp, 2e-5, 2e-6, "max_log_prob");
      EXPECT_TRUE(at::equal(r.argmax, ref.argmax));
      // p = e^(x − lse) inherits the float32 rounding of x − lse (ulp 4e-6 near 60).
      ExpectClose(x.grad(), ref.grad, 1e-5, 1e-5, "gradient");
      EXPECT_FALSE(r.label_log_prob.requires_grad());
      EXPECT_FALSE(r.max_log_prob.requires_grad());
    }
  }
}

// With a bias the kernel reads logits + bias and returns the bias's gradient (column sums).
TEST_F(FusedXentTest, BiasIsAddedAndGetsItsGradient) {
  at::manual_seed(4);
  for (int64_t classes : {5, 16, 37, 2000}) {
    SCOPED_TRACE(testing::Message() << "C=" << classes);
    const at::Tensor logits = at::randn({6, 7, classes}) * 3;
    const at::Tensor bias = at::randn({classes});
    const at::Tensor labels = at::randint(0, classes, {6, 7}, at::kLong);
    const at::Tensor upstream = at::rand({6, 7});
    at::Tensor x = logits.clone().requires_grad_(true), b = bias.clone().requires_grad_(true);
    SoftmaxXent r = FusedSoftmaxXent(x, labels, 0.9, 0.1 / classes, true, b);
    (r.xent * upstream).sum().backward();
    const Reference ref = ReferenceXent(logits + bias, labels, 0.9, 0.1 / classes, upstream);
    ExpectClose(r.xent, ref.xent, 2e-5, 2e-6, "xent");
    ExpectClose(r.label_log_prob, ref.label_lp, 2e-5, 2e-6, "label_log_prob");
    EXPECT_TRUE(at::equal(r.argmax, ref.argmax));
    ExpectClose(x.grad(), ref.grad, 1e-5, 1e-5, "logits gradient");
    ExpectClose(b.grad(), ref.grad.sum(at::IntArrayRef{0, 1}), 1e-5, 1e-5, "bias gradient");
  }
  EXPECT_THROW(FusedSoftmaxXent(at::zeros({2, 5}), at::zeros({2}, at::kLong), 1, 0, false,
                                at::zeros({4})),
               c10::Error);
}

// bf16 logits are read as they are: the outputs are bit for bit those of the float32 kernel on
// the widened logits, the gradient that float32 gradient rounded to bf16 (what casting the logits
// to float32 first and the gradient back gave), the bias gradient the same float32 sums.
TEST_F(FusedXentTest, Bf16LogitsGiveTheWidenedLogitsResultsBitForBit) {
  at::manual_seed(5);
  for (int64_t classes : {7, 16, 37, 2000}) {
    for (const bool with_bias : {false, true}) {
      SCOPED_TRACE(testing::Message() << "C=" << classes << (with_bias ? " bias" : ""));
      const at::Tensor logits = (at::randn({4, 9, classes}) * 3).to(at::kBFloat16);
      const at::Tensor bias = with_bias ? at::randn({classes}) : at::Tensor();
      // The label sits in every 16-column chunk and its tail somewhere among the rows.
      const at::Tensor labels = at::randint(0, classes, {4, 9}, at::kLong);
      const at::Tensor upstream = at::rand({4, 9});
      auto run = [&](bool bf16) {
        at::Tensor x = (bf16 ? logits : logits.to(at::kFloat)).clone().requires_grad_(true);
        at::Tensor b = with_bias ? bias.clone().requires_grad_(true) : at::Tensor();
        SoftmaxXent r = FusedSoftmaxXent(x, labels, 0.9, 0.1 / classes, true, b);
        (r.xent * upstream).sum().backward();
        return std::vector<at::Tensor>{r.xent, r.label_log_prob, r.max_log_prob, r.argmax,
                                       x.grad(), with_bias ? b.grad() : at::zeros({1})};
      };
      const auto got = run(true), want = run(false);
      for (int i = 0; i < 4; ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << "output " << i;
      EXPECT_EQ(got[4].scalar_type(), at::kBFloat16);
      EXPECT_TRUE(at::equal(got[4], want[4].to(at::kBFloat16))) << "gradient";
      EXPECT_TRUE(at::equal(got[5], want[5])) << "bias gradient";
    }
  }
}

TEST_F(FusedXentTest, ArgmaxIsTheFirstMaximalClassAndTiesAreCorrect) {
  at::Tensor logits = at::zeros({2, 40});
  logits[0][21] = 5;
  logits[0][37] = 5;
  logits[1].fill_(1);
  SoftmaxXent r = FusedSoftmaxXent(logits, at::tensor({37, 3}, at::kLong), 1, 0, true);
  EXPECT_EQ(r.argmax[0].item<int64_t>(), 21);
  EXPECT_EQ(r.argmax[1].item<int64_t>(), 0);
  // A label tied with the max has label_log_prob == max_log_prob exactly.
  EXPECT_EQ(r.label_log_prob[0].item<float>(), r.max_log_prob[0].item<float>());
  EXPECT_NEAR(r.label_log_prob[1].item<float>(), -std::log(40.0), 1e-6);
}

TEST_F(FusedXentTest, InfinitiesAndNaNs) {
  const float inf = std::numeric_limits<float>::infinity();
  at::Tensor logits = at::randn({3, 20});
  logits[0][4] = -inf;  // a masked class: probability 0, the loss stays finite
  logits[1][2] = std::nanf("");
  at::Tensor x = logits.clone().requires_grad_(true);
  SoftmaxXent r = FusedSoftmaxXent(x, at::tensor({1, 1, 1}, at::kLong), 1, 0, false);
  r.xent.sum().backward();
  const Reference ref = ReferenceXent(logits, at::tensor({1, 1, 1}, at::kLong), 1, 0,
                                      at::ones({3}));
  EXPECT_TRUE(std::isfinite(r.xent[0].item<float>()));
  EXPECT_NEAR(r.xent[0].item<float>(), ref.xent[0].item<double>(), 1e-5);
  EXPECT_EQ(x.grad()[0][4].item<float>(), 0.0f);
  // A NaN logit makes its row's loss NaN (the trainer's NaN check sees it), not others'.
  EXPECT_TRUE(std::isnan(r.xent[1].item<float>()));
  EXPECT_TRUE(std::isfinite(r.xent[2].item<float>()));
  EXPECT_TRUE(at::isfinite(x.grad()[2]).all().item<bool>());
}

// The attention softmax kernels against ATen in float64: masks broadcast over batch rows or
// query steps, fully masked keys, rows around the vector width.
TEST_F(FusedXentTest, AttentionSoftmaxAndItsBackward) {
  at::manual_seed(5);
  const float lowest = std::numeric_limits<float>::lowest();
  for (int64_t S : {1, 7, 16, 17, 130}) {
    for (int which : {0, 1, 2}) {
      SCOPED_TRACE(testing::Message() << "S=" << S << " bias " << which);
      const int64_t B = 3, N = 2, T = 5;
      const at::Tensor x = at::randn({B, N, T, S}) * 3;
      at::Tensor bias;
      if (which == 1) bias = at::zeros({1, 1, T, S}).masked_fill_(at::rand({1, 1, T, S}) > 0.7, lowest);
      if (which == 2) bias = at::zeros({B, 1, 1, S}).masked_fill_(at::rand({B, 1, 1, S}) > 0.6, lowest);
      if (bias.defined()) bias.select(3, 0).fill_(0);  // keep one key per row
      at::Tensor y = x.clone();
      SoftmaxWithBiasInPlace(y, bias.defined() ? bias : at::empty({0}));
      const at::Tensor want =
          at::softmax(x.to(at::kDouble) + (bias.defined() ? bias.to(at::kDouble).clamp_min(-1e300)
                                                          : at::zeros({1}, at::kDouble)),
                      -1);
      ExpectClose(y, want, 1e-6, 1e-5, "softmax");
      const at::Tensor dy = at::randn({B, N, T, S});
      at::Tensor d = dy.clone();
      SoftmaxBackwardInPlace(d, y);
      const at::Tensor yd = y.to(at::kDouble), dyd = dy.to(at::kDouble);
      ExpectClose(d, yd * (dyd - (dyd * yd).sum(-1, true)), 1e-6, 1e-5, "softmax backward");
    }
  }
  at::Tensor wrong = at::zeros({2, 2, 3, 4});
  EXPECT_THROW(SoftmaxWithBiasInPlace(wrong, at::zeros({2, 1, 3, 5})), c10::Error);
}

TEST_F(FusedXentTest, BadShapesAreErrors) {
  EXPECT_THROW(FusedSoftmaxXent(at::zeros({2, 0}), at::zeros({2}, at::kLong), 1, 0, false),
               c10::Error);
  EXPECT_THROW(FusedSoftmaxXent(at::zeros({2, 5}), at::zeros({3}, at::kLong), 1, 0, false),
               c10::Error);
  EXPECT_THROW(FusedSoftmaxXent(at::zeros({2, 5}), at::tensor({0, 5}, at::kLong), 1, 0, false),
               c10::Error);
  EXPECT_THROW(FusedSoftmaxXent(at::zeros({2, 5}), at::tensor({-1, 0}, at::kLong), 1, 0, false),
               c10::Error);
}

// SimpleFullSoftmax fused (float32 and bfloat16 logits) against fused_xent: false.
TEST_F(FusedXentTest, SimpleFullSoftmaxFusedEqualsUnfused) {
  for (double ls : {0.0, 0.1}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(testing::Message() << "label_smoothing=" << ls << " dtype=" << dtype);
      auto make = [&](bool fused) {
        Params p = SimpleFullSoftmax::Params();
        p.Set("name", "softmax").Set("input_dim", 8).Set("num_classes", 37);
        p.Set("label_smoothing", ls).Set("fused_xent", fused).Set("random_seed", 5);
        return InstantiateLayer<SimpleFullSoftmax>(p);
      };
      auto fused = make(true), plain = make(false);
      at::manual_seed(1);
      const at::Tensor inputs = at::randn({4, 6, 8});
      const at::Tensor labels = at::randint(0, 37, {4, 6}, at::kLong);
      const at::Tensor paddings = (at::rand({4, 6}) > 0.8).to(at::kFloat);
      // The outputs and the theta gradients of avg_xent, through XentFromLogits on `dtype`
      // logits, or (via_fprop) through FProp.
      auto run = [&](SimpleFullSoftmax& layer, bool via_fprop) {
        NestedMap theta = layer.theta();
        for (auto& t : theta.FlattenTensors()) t.requires_grad_(true);
        NestedMap out =
            via_fprop ? layer.FProp(theta, inputs, labels, {}, paddings)
                      : layer.XentFromLogits(layer.Logits(theta, inputs).to(dtype), labels, {},
                                             paddings);
        out.GetTensor("avg_xent").backward();
        std::vector<at::Tensor> grads;
        for (auto& t : theta.FlattenTensors()) grads.push_back(t.grad());
        return std::pair{out, grads};
      };
      auto [fo, fg] = run(*fused, false);
      auto [po, pg] = run(*plain, false);
      // FProp itself: the fused path adds the bias in the kernel (float32 inputs).
      if (dtype == at::kFloat) {
        auto [ffo, ffg] = run(*fused, true);
        auto [pfo, pfg] = run(*plain, true);
        EXPECT_FALSE(ffo.Has("logits"));
        EXPECT_TRUE(pfo.Has("logits"));
        ExpectClose(ffo.GetTensor("per_example_xent"), pfo.GetTensor("per_example_xent"), 1e-5,
                    1e-5, "FProp per_example_xent");
        for (size_t i = 0; i < ffg.size(); ++i) {
          ExpectClose(ffg[i], pfg[i], 1e-6, 1e-4, "FProp weight and bias grads");
        }
      }
      EXPECT_FALSE(fo.Has("log_probs"));
      EXPECT_TRUE(po.Has("log_probs"));
      for (const char* key : {"per_example_xent", "per_example_label_log_prob",
                              "per_example_max_log_prob", "avg_xent", "total_weight"}) {
        ExpectClose(fo.GetTensor(key), po.GetTensor(key), 1e-5, 1e-5, key);
      }
      EXPECT_TRUE(at::equal(fo.GetTensor("per_example_argmax"), po.GetTensor("per_example_argmax")));
      ASSERT_EQ(fg.size(), pg.size());
      for (size_t i = 0; i < fg.size(); ++i) ExpectClose(fg[i], pg[i], 1e-6, 1e-4, "weight grad");
    }
  }
}

}  // namespace
}  // namespace glossa
