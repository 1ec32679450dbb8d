// Affine (glossa/kernels/gemm.h): bf16 products through float32 GEMMs against float64 products of
// the same bf16 values, and against ATen's bf16 addmm; forward and gradients, with and without a
// bias, for tall and wide outputs (split by rows or by columns) and a transposed weight.
#include "glossa/kernels/gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "glossa/kernels/kernel_choice.h"
#include "glossa/layers/attention.h"
#include "glossa/runtime/cpu_runtime.h"

namespace glossa {
namespace {

extern "C" void openblas_set_num_threads(int) __attribute__((weak));

// OpenBLAS's threads for a comparison (nothing without OpenBLAS: Affine is then ATen's own).
void SetBlasThreadsForTest(int threads) {
  if (openblas_set_num_threads != nullptr && threads > 0) openblas_set_num_threads(threads);
}

struct Result {
  at::Tensor y, dx, dw, db;
};

// Pins a kernel choice for a test (glossa/kernels/kernel_choice.h), so that both paths are tested
// on every CPU whatever this machine's measurement would pick; restores the mode after.
class PinKernels {
 public:
  PinKernels(KernelChoice choice, KernelMode mode) : choice_(choice), saved_(GetKernelMode(choice)) {
    SetKernelMode(choice, mode);
  }
  ~PinKernels() { SetKernelMode(choice_, saved_); }

 private:
  KernelChoice choice_;
  KernelMode saved_;
};
class PinBf16Kernels : public PinKernels {
 public:
  explicit PinBf16Kernels(KernelMode mode) : PinKernels(KernelChoice::kBf16, mode) {}
};

Result RunAffine(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0, const at::Tensor& g,
           bool affine, bool transposed_w) {
  at::Tensor x = x0.detach().clone().requires_grad_(true);
  at::Tensor w = (transposed_w ? w0.t().contiguous() : w0).detach().clone().requires_grad_(true);
  at::Tensor b = b0.defined() ? b0.detach().clone().requires_grad_(true) : at::Tensor();
  const at::Tensor wv = transposed_w ? w.t() : w;
  at::Tensor y = affine ? Affine(x, wv, b) : (b.defined() ? at::addmm(b, x, wv) : at::mm(x, wv));
  (y.to(at::kDouble) * g).sum().backward();
  at::Tensor dw = transposed_w ? w.grad().t() : w.grad();
  return {y.detach(), x.grad(), dw, b.defined() ? b.grad() : at::Tensor()};
}

// max |got − want| / (max |want| + tiny), as a fraction of bf16's precision.
double RelError(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kDouble);
  return (got.to(at::kDouble) - w).abs().max().item<double>() /
         (w.abs().max().item<double>() + 1e-30);
}

// Both bf16 paths (the native float32 sgemms and ATen's oneDNN GEMMs, pinned) against float64.
TEST(Affine, Bf16ThroughFloat32GemmsMatchesFloat64AndAtenAddmm) {
  for (KernelMode mode : {KernelMode::kNative, KernelMode::kAten}) {
  SCOPED_TRACE(mode == KernelMode::kNative ? "native" : "aten");
  PinBf16Kernels pin(mode);
  for (int threads : {1, 2}) {
    const int saved = at::get_num_threads();
    at::set_num_threads(threads);
    for (auto [m, k, n] : {std::make_tuple(64, 24, 40), std::make_tuple(5, 16, 300),
                           std::make_tuple(1, 3, 1)}) {
      for (bool bias : {true, false}) {
        for (bool transposed : {false, true}) {
          SCOPED_TRACE(testing::Message() << "threads " << threads << " m,k,n " << m << "," << k
                                          << "," << n << " bias " << bias << " wᵀ " << transposed);
          at::manual_seed(m * 7 + n);
          const at::Tensor x = at::randn({m, k}).to(at::kBFloat16);
          const at::Tensor w = at::randn({k, n}).to(at::kBFloat16);
          const at::Tensor b = bias ? at::randn({n}).to(at::kBFloat16) : at::Tensor();
          const at::Tensor g = at::randn({m, n}, at::kDouble);
          const Result got = RunAffine(x, w, b, g, true, transposed);
          EXPECT_EQ(got.y.scalar_type(), at::kBFloat16);
          EXPECT_EQ(got.dx.scalar_type(), at::kBFloat16);
          EXPECT_EQ(got.dw.scalar_type(), at::kBFloat16);
          // float64 products of the same bf16 values.
          const at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble);
          at::Tensor yd = at::mm(xd, wd);
          if (bias) yd = yd + b.to(at::kDouble);
          const at::Tensor gb = g.to(at::kBFloat16).to(at::kDouble);  // the upstream as bf16
          // One bf16 rounding of the float32 sums: 2^-8 relative, with room for the sums.
          EXPECT_LT(RelError(got.y, yd), 1.0 / 128);
          EXPECT_LT(RelError(got.dx, at::mm(gb, wd.t())), 1.0 / 128);
          EXPECT_LT(RelError(got.dw, at::mm(xd.t(), gb)), 1.0 / 128);
          if (bias) {
            EXPECT_LT(RelError(got.db, gb.sum(0)), 1.0 / 128);
          }
          // ATen's bf16 kernels round the same way, up to the order of the sums.
          const Result aten = RunAffine(x, w, b, g, false, transposed);
          EXPECT_LT(RelError(got.y, aten.y), 1.0 / 64);
          EXPECT_LT(RelError(got.dx, aten.dx), 1.0 / 64);
          EXPECT_LT(RelError(got.dw, aten.dw), 1.0 / 64);
        }
      }
    }
    at::set_num_threads(saved);
  }
  }
}

// The AVX-512 conversions give ATen's bits: ties to even, ±∞, subnormals, NaNs as NaNs, every
// tail length.
TEST(Affine, ConversionsGiveAtensBits) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0xffc12345u, 0x7f800001u, 0x00000001u, 0x80008000u, 0x3f808000u,
                                0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x0001ffffu};
  std::mt19937 rng(9);
  while (bits.size() < 100003) bits.push_back(static_cast<uint32_t>(rng()));
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{40},
                    static_cast<int64_t>(bits.size())}) {
    at::Tensor f = at::empty({n}, at::kFloat);
    std::memcpy(f.data_ptr(), bits.data(), n * 4);
    const at::Tensor got = Narrow(f, at::kBFloat16), want = f.to(at::kBFloat16);
    ASSERT_EQ(got.scalar_type(), at::kBFloat16);
    // Compared as bits; NaNs only as NaNs (ATen's own payloads differ between its vector loop,
    // 0xFFFF, and its scalar tail, 0x7FC0).
    const at::Tensor nan = at::isnan(f);
    EXPECT_TRUE(at::equal(at::isnan(got), nan)) << n;
    EXPECT_TRUE(at::equal(got.view(at::kShort).masked_fill(nan, 0),
                          want.view(at::kShort).masked_fill(nan, 0)))
        << n;
    const at::Tensor wide = Widen(want);
    EXPECT_TRUE(at::equal(wide.view(at::kInt), want.to(at::kFloat).view(at::kInt))) << n;
  }
  // Non-contiguous input: widened through a contiguous copy.
  const at::Tensor t = at::randn({6, 5}).to(at::kBFloat16).t();
  EXPECT_TRUE(at::equal(Widen(t), t.to(at::kFloat)));
  EXPECT_TRUE(Widen(t).is_contiguous());
  // Views whose rows are contiguous (the attention heads of the fused Q/K/V projection): read in
  // place, row by row.
  const at::Tensor qkv = at::randn({3, 7, 3, 2, 5}).to(at::kBFloat16);
  for (const at::Tensor& v : {qkv.select(2, 1), qkv.select(0, 2).select(1, 0),
                              qkv.select(2, 2).select(2, 1), qkv.permute({1, 0, 2, 3, 4})
                                                                  .reshape({7, 3, 30})
                                                                  .narrow(2, 5, 10)}) {
    ASSERT_FALSE(v.is_contiguous());
    const at::Tensor w = Widen(v);
    EXPECT_TRUE(w.is_contiguous());
    EXPECT_TRUE(at::equal(w, v.to(at::kFloat))) << v.sizes();
  }
}

// bf16 self-attention (the strided core on widened heads, bf16 projections) against the same
// layer in float32 on the same bf16 values: outputs and the gradients of inputs and weights.
TEST(Affine, Bf16AttentionMatchesFloat32OnTheSameValues) {
  PinBf16Kernels pin(KernelMode::kNative);
  auto make = [](bool bf16) {
    Params p = MultiHeadedAttention::Params();
    p.Set("name", "atten").Set("random_seed", 5).Set("input_dim", 32).Set("num_heads", 4);
    if (bf16) p.Set("fprop_dtype", DType::kBFloat16);
    return InstantiateLayer<MultiHeadedAttention>(p);
  };
  auto l16 = make(true), l32 = make(false);
  NestedMap th16 = l16->theta().Transform([](const NestedValue& v) -> NestedValue {
    return v.AsTensor().detach().clone().requires_grad_(true);
  });
  ASSERT_EQ(th16.FlattenTensors()[0].scalar_type(), at::kBFloat16);
  NestedMap th32 = th16.Transform([](const NestedValue& v) -> NestedValue {
    return v.AsTensor().detach().to(at::kFloat).requires_grad_(true);
  });
  at::manual_seed(2);
  at::Tensor x16 = at::randn({3, 11, 32}).to(at::kBFloat16).requires_grad_(true);
  at::Tensor x32 = x16.detach().to(at::kFloat).requires_grad_(true);
  at::Tensor paddings = at::zeros({3, 11});
  paddings.select(0, 2).narrow(0, 8, 3).fill_(1.0);
  const at::Tensor c = at::randn({3, 11, 32}, at::kDouble);
  auto [y16, p16] = l16->FProp(th16, x16, x16, x16, paddings, /*causal=*/true);
  auto [y32, p32] = l32->FProp(th32, x32, x32, x32, paddings, /*causal=*/true);
  ASSERT_EQ(y16.scalar_type(), at::kBFloat16);
  ASSERT_EQ(p16.scalar_type(), at::kBFloat16);
  (y16.to(at::kDouble) * c).sum().backward();
  (y32.to(at::kDouble) * c).sum().backward();
  // bf16 rounds each intermediate (projections, probabilities, the attention output) to 8 bits.
  EXPECT_LT(RelError(y16, y32), 3e-2);
  EXPECT_LT(RelError(p16, p32), 3e-2);
  EXPECT_LT(RelError(x16.grad(), x32.grad()), 3e-2);
  const auto keys = th16.Keys();
  const auto g16 = th16.FlattenTensors(), g32 = th32.FlattenTensors();
  for (size_t i = 0; i < g16.size(); ++i) {
    ASSERT_TRUE(g16[i].grad().defined()) << keys[i];
    EXPECT_EQ(g16[i].grad().scalar_type(), at::kBFloat16);
    const double want_max = g32[i].grad().abs().max().item<double>();
    if (want_max < 1e-4) {
      // The key bias: softmax ignores a shift of every logit, so its gradient is 0 up to rounding.
      EXPECT_LT(g16[i].grad().to(at::kDouble).abs().max().item<double>(), 1e-2) << keys[i];
      continue;
    }
    EXPECT_LT(RelError(g16[i].grad(), g32[i].grad()), 3e-2) << keys[i];
  }
}

// Float32 Affine is ATen's addmm (and relu), forward and gradients, bit for bit with the GEMMs on
// the same threads: with one kernel thread ATen's on OpenBLAS's threads; with two, each GEMM
// single-threaded (row halves forward, dx and dw side by side backward), so ATen with one OpenBLAS
// thread; and within float32 rounding of ATen on two (OpenBLAS's threaded driver splits a long
// inner dimension into other blocks than its single-threaded one: the logits' input gradient,
// inner dimension 2,000, differs in the last bits). The shapes are under OpenBLAS's own threading
// threshold (2^18 multiply-adds) or over Affine's split (2^22), so that every GEMM runs on one
// thread either way. Tiny-LM shapes and odd ones, with and without
// bias and ReLU, a transposed weight (the output projection's), a column-major input, an input
// without a gradient.
TEST(Affine, Float32IsAtensAddmmAndRelu) {
  const int saved_aten = at::get_num_threads(), saved_kernel = KernelThreads();
  const CpuRuntimeLayout layout = ConfigureCpuRuntime(0, /*bf16_compute=*/false);
  // The GEMMs split over the kernel threads (--gemm_split=native) or on OpenBLAS's (aten).
  for (auto [kernel_threads, split] : {std::make_pair(1, true), std::make_pair(2, true),
                                       std::make_pair(2, false), std::make_pair(3, true)}) {
    SetKernelThreads(kernel_threads);
    PinKernels pin(KernelChoice::kGemmSplit, split ? KernelMode::kNative : KernelMode::kAten);
    for (auto [m, k, n] : {std::make_tuple(1024, 128, 512), std::make_tuple(1024, 512, 128),
                           std::make_tuple(1024, 128, 2000), std::make_tuple(64, 24, 40),
                           std::make_tuple(5, 16, 300), std::make_tuple(1001, 64, 100),
                           std::make_tuple(1, 3, 1),
                           std::make_tuple(300, 7, 2)}) {
      for (int variant = 0; variant < 16; ++variant) {
        const bool bias = variant & 1, relu = variant & 2, w_t = variant & 4, x_t = variant & 8;
        // The large shapes in two of the layouts (each takes a while).
        if (m * k * n > 1000000 && variant != 7 && variant != 8) continue;
        SCOPED_TRACE(testing::Message() << "kernel threads " << kernel_threads << " split "
                                        << split << " m,k,n " << m
                                        << "," << k << "," << n << " bias " << bias << " relu "
                                        << relu << " wᵀ " << w_t << " xᵀ " << x_t);
        at::manual_seed(m + 3 * n + variant);
        const at::Tensor x0 = at::randn({m, k}), w0 = at::randn({k, n}), b0 = at::randn({n});
        const at::Tensor g = at::randn({m, n});
        // ATen's composition with `blas` OpenBLAS threads (0: as set).
        auto run = [&](bool affine, bool x_grad, int blas) {
          SetBlasThreadsForTest(blas);
          at::Tensor xs = (x_t ? x0.t().contiguous() : x0).clone().requires_grad_(x_grad);
          at::Tensor ws = (w_t ? w0.t().contiguous() : w0).clone().requires_grad_(true);
          at::Tensor b = bias ? b0.clone().requires_grad_(true) : at::Tensor();
          const at::Tensor x = x_t ? xs.t() : xs, w = w_t ? ws.t() : ws;
          at::Tensor y;
          if (affine) {
            y = Affine(x, w, b, relu);
          } else {
            y = bias ? at::addmm(b, x, w) : at::mm(x, w);
            if (relu) y = at::relu(y);
          }
          (y * g).sum().backward();
          SetBlasThreadsForTest(blas > 0 ? layout.blas_threads : 0);
          return std::vector<at::Tensor>{y.detach(), x_grad ? xs.grad() : at::zeros({1}),
                                         ws.grad(), bias ? b.grad() : at::zeros({1})};
        };
        // Split GEMMs run on one OpenBLAS thread each.
        const bool side_by_side = split && kernel_threads >= 2 && layout.blas_threads > 0;
        for (bool x_grad : {true, false}) {
          const auto got = run(true, x_grad, 0);
          const auto same_threads = run(false, x_grad, side_by_side ? 1 : 0);
          const auto aten = run(false, x_grad, 0);
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_TRUE(got[i].defined()) << i;
            // Bit for bit where OpenBLAS gives a row the same bits whatever the number of rows
            // (its SkylakeX kernels on a Xeon); other kernel sets (OPENBLAS_CORETYPE=Haswell on
            // an AVX-512 CPU) accumulate partial tiles in another order: float32 rounding.
            EXPECT_LT(RelError(got[i], same_threads[i]), 1e-6)
                << "output " << i << " x_grad " << x_grad;
            EXPECT_LT(RelError(got[i], aten[i]), 1e-6) << "output " << i << " x_grad " << x_grad;
          }
        }
      }
    }
  }
  SetKernelThreads(saved_kernel);
  at::set_num_threads(saved_aten);
}

// bf16 Affine with the ReLU fused gives relu(Affine(·)) bit for bit, with its gradients, on both
// bf16 paths (the native one's fused ReLU, and Glossa's bf16 ReLU after ATen's addmm).
void ExpectBf16ReluIsReluOfTheProduct(KernelMode mode) {
  PinBf16Kernels pin(mode);
  at::manual_seed(4);
  const at::Tensor x0 = at::randn({70, 24}).to(at::kBFloat16),
                   w0 = at::randn({24, 130}).to(at::kBFloat16),
                   b0 = at::randn({130}).to(at::kBFloat16);
  const at::Tensor g = at::randn({70, 130});
  auto run = [&](bool fused) {
    at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true),
               b = b0.clone().requires_grad_(true);
    at::Tensor y = fused ? Affine(x, w, b, /*relu=*/true) : at::relu(Affine(x, w, b));
    (y.to(at::kFloat) * g).sum().backward();
    return std::vector<at::Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
  };
  const auto got = run(true), want = run(false);
  EXPECT_GT((got[0] == 0).sum().item<int64_t>(), 0);  // the ReLU clipped something
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << i;
}

TEST(Affine, Bf16ReluIsReluOfTheProduct) {
  ExpectBf16ReluIsReluOfTheProduct(KernelMode::kNative);
  ExpectBf16ReluIsReluOfTheProduct(KernelMode::kAten);
  // NaN stays NaN, -0 and negatives become 0, as ATen's relu has them (an odd length: the tail).
  PinBf16Kernels pin(KernelMode::kAten);
  const at::Tensor x = at::tensor({1.5f, -2.0f, std::nanf(""), -std::nanf(""), -0.0f, 0.0f, 3e38f,
                                   -3e38f, 1e-40f, -1e-40f, 7.0f}).to(at::kBFloat16).view({11, 1});
  const at::Tensor eye = at::ones({1, 1}, at::kBFloat16);
  const at::Tensor got = Affine(x, eye, at::Tensor(), /*relu=*/true).to(at::kFloat);
  const at::Tensor want = at::relu(x.to(at::kFloat));
  EXPECT_TRUE(at::equal(got.isnan(), want.isnan()));
  EXPECT_TRUE(at::equal(got.nan_to_num(), want.nan_to_num())) << got << want;
}

// bf16 Affine with a float32 output (the logits' path) gives .to(kFloat) of the bf16 result, and
// the gradients of that composition (its upstream gradient rounded to bf16 by the cast's
// backward), bit for bit; with and without bias and ReLU.
TEST(Affine, Bf16WithFloat32OutputIsTheCastOfTheBf16Product) {
  PinBf16Kernels pin(KernelMode::kNative);
  at::manual_seed(6);
  const at::Tensor x0 = at::randn({97, 40}).to(at::kBFloat16),
                   w0 = at::randn({40, 300}).to(at::kBFloat16),
                   b0 = at::randn({300}).to(at::kBFloat16);
  at::Tensor g = at::randn({97, 300});
  g[0][0] = std::numeric_limits<float>::quiet_NaN();  // rounded and passed on as NaN
  g[1][1] = 1.00390625f;                             // a tie: rounds to even (1.0)
  for (bool bias : {false, true}) {
    for (bool relu : {false, true}) {
      auto run = [&](bool fused) {
        at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
        at::Tensor b = bias ? b0.clone().requires_grad_(true) : at::Tensor();
        at::Tensor y = fused ? Affine(x, w, b, relu, /*float_out=*/true)
                             : Affine(x, w, b, relu).to(at::kFloat);
        (y * g).sum().backward();
        return std::vector<at::Tensor>{y.detach(), x.grad(), w.grad(),
                                       bias ? b.grad() : at::zeros({1})};
      };
      const auto got = run(true), want = run(false);
      EXPECT_EQ(got[0].scalar_type(), at::kFloat);
      for (size_t i = 0; i < got.size(); ++i) {
        // NaN compares unequal: compare the bits with NaNs masked, and where the NaNs are.
        const at::Tensor nan = at::isnan(want[i]);
        EXPECT_TRUE(at::equal(at::isnan(got[i]), nan)) << i << " bias " << bias << " relu " << relu;
        EXPECT_TRUE(at::equal(got[i].masked_fill(nan, 0), want[i].masked_fill(nan, 0)))
            << i << " bias " << bias << " relu " << relu;
      }
    }
  }
}

TEST(Affine, OtherDtypesAreAtensOwn) {
  at::manual_seed(3);
  for (auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor x = at::randn({4, 3}, dtype), w = at::randn({3, 5}, dtype),
                     b = at::randn({5}, dtype);
    EXPECT_TRUE(at::equal(Affine(x, w, b), at::addmm(b, x, w)));
    EXPECT_TRUE(at::equal(Affine(x, w, at::Tensor()), at::mm(x, w)));
  }
  EXPECT_THROW(Affine(at::randn({4, 3}), at::randn({4, 5}), at::Tensor()), c10::Error);
}

}  // namespace
}  // namespace glossa
