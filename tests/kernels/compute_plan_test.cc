// The inference plan (glossa/kernels/compute_plan.h): weights prepared once by name, run as the
// policy says, checked against the values theta holds. (The layers' side, PlanInference and
// FProp reading the plan, is in tests/layers/base_layer_test.cc.)
#include "glossa/kernels/compute_plan.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "glossa/base/errors.h"
#include "glossa/kernels/batch_invariant.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/int8_gemm.h"
#include "glossa/kernels/packed_affine.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(ComputePlan, RunsThePreparedWeightAsThePolicySays) {
  at::manual_seed(1);
  const at::Tensor x = at::randn({9, 16}), b = at::randn({24});
  const at::Tensor w = at::randn({16, 24});
  const at::Tensor wt = at::randn({24, 16});  // a transposed view: prepared contiguous
  at::NoGradGuard no_grad;

  ComputePlan fp32({});
  fp32.Prepare("a/w", w, {w});
  fp32.Prepare("a/wt", wt.t(), {wt});
  // float32: the weight packed into panels, read where they measured faster than BLAS (with
  // InvariantAffine's bits), else Affine on the matrix.
  const PreparedWeight& pw = *fp32.Find("a/w", {w});
  EXPECT_TRUE(at::equal(pw.panels, PackPanels(w)));
  EXPECT_TRUE(SameBits(fp32.Affine(pw, x, b), PackedKernelsFor(9, 16, 24)
                                                  ? InvariantAffine(x, w, b, false)
                                                  : Affine(x, w, b)));
  const PreparedWeight& t = *fp32.Find("a/wt", {wt});
  EXPECT_TRUE(t.w.is_contiguous());
  EXPECT_TRUE(at::equal(t.w, wt.t()));
  EXPECT_EQ(t.int8, nullptr);
  EXPECT_TRUE(at::equal(t.panels, PackPanels(wt.t())));
  EXPECT_EQ(fp32.Find("a/none", {w}), nullptr);

  ComputePlan int8({.precision = Precision::kInt8});
  int8.Prepare("a/w", w, {w});
  const at::Tensor y8 = int8.Affine(*int8.Find("a/w", {w}), x, b, /*relu=*/true);
  EXPECT_TRUE(SameBits(y8, Int8Affine(x, *QuantizeInt8(w), b, true)));
  EXPECT_FALSE(int8.Find("a/w", {w})->panels.defined());  // int8 reads its quantized form only
  EXPECT_FALSE(SameBits(y8, at::relu(Affine(x, w, b))));  // int8 ran, not float32
  EXPECT_LT((y8 - at::relu(at::addmm(b, x, w))).abs().max().item<double>(), 0.1);

  // bf16: the weight rounded to bf16 once; every path computes with the rounded values (the
  // reference too), the panels at any row count.
  ComputePlan bf16({.precision = Precision::kBf16});
  bf16.Prepare("a/wt", wt.t(), {wt});
  const PreparedWeight& pb = *bf16.Find("a/wt", {wt});
  const at::Tensor rounded = wt.t().to(at::kBFloat16).to(at::kFloat);
  EXPECT_TRUE(at::equal(pb.w, rounded));
  EXPECT_FALSE(pb.panels.defined());
  EXPECT_EQ(pb.int8, nullptr);
  EXPECT_TRUE(at::equal(pb.panels_bf16, PackPanelsBf16(wt.t().contiguous())));
  const at::Tensor yb = bf16.Affine(pb, x, b, /*relu=*/true);
  EXPECT_TRUE(SameBits(yb, KernelsForcedToReference()
                               ? Affine(x, rounded, b, true)
                               : PackedAffineBf16(x, pb.panels_bf16, 24, b, true)));
  EXPECT_FALSE(SameBits(yb, at::relu(at::addmm(b, x, wt.t()))));  // not the float32 weights
  EXPECT_LT((yb - at::relu(at::addmm(b, x, wt.t()))).abs().max().item<double>(), 0.1);
  EXPECT_EQ(bf16.policy().ToString(), "bf16, fused decoder step");
  EXPECT_EQ(ParsePrecision("bf16", "--precision"), Precision::kBf16);

  ComputePlan inv({.batch_invariant = true});
  inv.Prepare("a/wt", wt.t(), {wt});
  EXPECT_EQ(inv.BatchInvariantNow(), !KernelsForcedToReference());
  const at::Tensor yi = inv.Affine(*inv.Find("a/wt", {wt}), x, b);
  if (!KernelsForcedToReference()) {
    EXPECT_TRUE(SameBits(yi, InvariantAffine(x, wt.t().contiguous(), b, false)));
    // A row's bits alone are its bits in the batch.
    EXPECT_TRUE(SameBits(inv.Affine(*inv.Find("a/wt", {wt}), x.narrow(0, 4, 1), b), yi[4]
                                                                                    .unsqueeze(0)));
  }
  EXPECT_EQ(inv.policy().ToString(),
            KernelsForcedToReference()
                ? "float32, batch-invariant (off: GLOSSA_KERNELS=reference), fused decoder step"
                : "float32, batch-invariant, fused decoder step");
  EXPECT_EQ(int8.policy().ToString(), "int8, fused decoder step");
}

// The plan is data, not a mode of the thread: another thread runs the same arithmetic, and
// nothing changes on a thread without the plan.
TEST(ComputePlan, IsTheSameOnAnyThread) {
  at::manual_seed(2);
  const at::Tensor x = at::randn({5, 8}), w = at::randn({8, 12}), b = at::randn({12});
  ComputePlan int8({.precision = Precision::kInt8});
  int8.Prepare("w", w, {w});
  at::Tensor here, there;
  {
    at::NoGradGuard no_grad;
    here = int8.Affine(*int8.Find("w", {w}), x, b);
  }
  std::thread t([&] {
    at::NoGradGuard no_grad;
    there = int8.Affine(*int8.Find("w", {w}), x, b);
  });
  t.join();
  EXPECT_TRUE(SameBits(here, there));
  EXPECT_TRUE(ComputePlan::AppliesNow() == false);  // autograd is on here: training ignores plans
}

// A prepared weight is used only for the values it was made from: a write to the variable, or
// another tensor under its name, is an error naming it, never stale weights.
TEST(ComputePlan, RefusesWeightsThatChangedSinceItWasMade) {
  at::Tensor w = at::randn({4, 6});
  ComputePlan plan({.precision = Precision::kInt8});
  plan.Prepare("enc/w", w, {w});
  EXPECT_NE(plan.Find("enc/w", {w}), nullptr);
  EXPECT_ERROR_CONTAINS(plan.Find("enc/w", {at::randn({4, 6})}), InternalError,
                        "weight 'enc/w' was prepared from other values");
  {
    at::NoGradGuard no_grad;
    w.mul_(2);  // written in place: its version moves
  }
  EXPECT_ERROR_CONTAINS(plan.Find("enc/w", {w}), InternalError, "make the plan again");
  EXPECT_ERROR_CONTAINS(plan.Prepare("enc/w", w, {w}), InternalError, "prepared twice");
  EXPECT_ERROR_CONTAINS(plan.Prepare("v", at::randn({4}), {}), InvalidArgumentError,
                        "2-D floating CPU matrix");
  EXPECT_EQ(ParsePrecision("int8", "--precision"), Precision::kInt8);
  EXPECT_EQ(ParsePrecision("none", "quantize"), Precision::kFloat32);
  EXPECT_ERROR_CONTAINS(ParsePrecision("int4", "--precision"), InvalidArgumentError,
                        "--precision is 'int4'; it must be float32, bf16 or int8");
}

}  // namespace
}  // namespace glossa
