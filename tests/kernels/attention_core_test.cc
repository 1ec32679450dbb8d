// AttentionCore: the native core on strided heads against the reference (einsum, softmax,
// einsum), outputs, probabilities and gradients; causal blocks; what it sends to the reference.
#include "glossa/kernels/attention_core.h"

#include "glossa/base/errors.h"

#include "glossa/kernels/bf16_dot_attention.h"
#include "glossa/kernels/bf16_softmax.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/kernel_choice.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>

namespace glossa {
namespace {

// The causal mask of T queries over T keys as an additive float32 bias [1, 1, T, T].
at::Tensor CausalBias(int64_t t) {
  return at::zeros({t, t}).masked_fill(at::ones({t, t}).triu(1) > 0.5,
                                       std::numeric_limits<float>::lowest()).view({1, 1, t, t});
}

void Compare(const at::Tensor& qkv0, int64_t b, int64_t t, int64_t n, int64_t h,
             const at::Tensor& bias, bool causal_blocks) {
  auto run = [&](bool native) {
    at::Tensor qkv = qkv0.clone().requires_grad_(true);
    // Views of one fused projection, as the attention layer hands them over.
    const at::Tensor q = qkv.narrow(2, 0, n * h).view({b, t, n, h});
    const at::Tensor k = qkv.narrow(2, n * h, n * h).view({b, t, n, h});
    const at::Tensor v = qkv.narrow(2, 2 * n * h, n * h).view({b, t, n, h});
    if (native) {
      EXPECT_TRUE(AttentionCoreNativeApplies(q, k, v));
    }
    auto [out, probs] = native ? AttentionCore(q, k, v, bias, causal_blocks)
                               : AttentionCoreReference(q, k, v, bias);
    const at::Tensor loss = (out * out).sum() + (probs * at::arange(t).to(at::kFloat)).sum();
    const at::Tensor g = torch::autograd::grad({loss}, {qkv})[0];
    return std::vector<at::Tensor>{out.detach(), probs.detach(), g};
  };
  const auto got = run(true), want = run(false);
  EXPECT_TRUE(at::allclose(got[0], want[0], 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(got[1], want[1], 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(got[2], want[2], 1e-4, 1e-4));
}

TEST(AttentionCoreKernel, NativeMatchesTheReference) {
  const int64_t b = 2, t = 9, n = 3, h = 4;
  const at::Tensor padded = at::zeros({b, 1, 1, t}).index_put_(
      {1, 0, 0, at::indexing::Slice(6, t)}, std::numeric_limits<float>::lowest());
  Compare(at::randn({b, t, 3 * n * h}), b, t, n, h, padded, false);
  Compare(at::randn({b, t, 3 * n * h}), b, t, n, h, at::empty({0}), false);
}

TEST(AttentionCoreKernel, CausalBlocksMatchTheReference) {
  for (int64_t t : {64, 80}) Compare(at::randn({2, t, 3 * 2 * 8}), 2, t, 2, 8, CausalBias(t), true);
}

// Packed rows (segments end to end, each causal within itself, padding as segment 0): the causal
// blocks start at the first key any query of the block may see, skipping the segments before
// it; outputs, probabilities and gradients are the reference's. T = 96: blocks of 32 queries,
// segments that start inside a block, span blocks, and end one.
at::Tensor PackedCausalBias(const std::vector<std::vector<int64_t>>& segment_lengths, int64_t t) {
  at::Tensor bias = at::full({static_cast<int64_t>(segment_lengths.size()), 1, t, t},
                             std::numeric_limits<float>::lowest());
  for (size_t b = 0; b < segment_lengths.size(); ++b) {
    int64_t start = 0;
    for (int64_t len : segment_lengths[b]) {
      for (int64_t q = start; q < start + len; ++q) {
        bias[b][0][q].narrow(0, start, q - start + 1).zero_();
      }
      start += len;
    }
  }
  return bias;
}

TEST(AttentionCoreKernel, CausalBlocksOfPackedRowsSkipTheSegmentsBeforeTheirOwn) {
  const int64_t t = 96;
  // Row 1 ends in 6 padded positions (their own segment, as segment 0 is).
  const at::Tensor bias = PackedCausalBias({{10, 40, 30, 16}, {60, 30, 6}}, t);
  Compare(at::randn({2, t, 3 * 2 * 8}), 2, t, 2, 8, bias, true);
  if (!CpuHasAvx512F()) return;  // the softmax kernel below needs it (GLOSSA_KERNELS=reference)
  // The softmax with block starts (row 0's blocks from keys 0, 10 and 50; row 1's from 0, 0, 60)
  // is the softmax of the masked logits, 0 before each block's start and after its end.
  const std::vector<int64_t> starts = {0, 10, 50, 0, 0, 60};
  const at::Tensor x0 = at::randn({2, 2, t, t});
  at::Tensor x = x0.clone();
  const at::Tensor want = at::softmax(x + bias, -1);
  SoftmaxWithBiasInPlace(x, bias, 32, starts);
  EXPECT_TRUE(at::allclose(x, want, 1e-6, 1e-7));
  const at::Tensor d0 = at::randn({2, 2, t, t});
  at::Tensor d = d0.clone();
  const at::Tensor dwant = at::_softmax_backward_data(d, want, -1, at::kFloat);
  SoftmaxBackwardInPlace(d, want, 32, starts);
  EXPECT_TRUE(at::allclose(d.narrow(3, 0, 32), dwant.narrow(3, 0, 32), 1e-6, 1e-7));
  EXPECT_TRUE(at::equal(d[0][1].narrow(0, 64, 32).narrow(1, 0, 50), at::zeros({32, 50})));
  // A head at a time (the native core's fused stages) gives the same bits: the forward on the
  // head's rows of the whole tensor, the backward in a buffer holding only the head's rows.
  at::Tensor x2 = x0.clone();
  for (int64_t h = 0; h < 4; ++h) {
    SoftmaxWithBiasOnRows(x2.data_ptr<float>(), x2.sizes(), bias, 32, starts, h * t, (h + 1) * t);
    at::Tensor head = d0.view({4, t, t})[h].clone();
    SoftmaxBackwardOnRows(head.data_ptr<float>(), h * t, want.data_ptr<float>(), want.sizes(),
                          32, starts, h * t, (h + 1) * t);
    EXPECT_TRUE(at::equal(head, d.view({4, t, t})[h])) << "head " << h;
  }
  EXPECT_TRUE(at::equal(x2, x));
  // Rows outside the tensor, or before the buffer's first, are refused.
  EXPECT_THROW(SoftmaxWithBiasOnRows(x2.data_ptr<float>(), x2.sizes(), bias, 32, starts, 0,
                                     4 * t + 1),
               c10::Error);
  EXPECT_THROW(SoftmaxBackwardOnRows(d.data_ptr<float>(), t, x.data_ptr<float>(), x.sizes(), 32,
                                     starts, 0, t),
               c10::Error);
}

// The native softmaxes never produce a subnormal probability (e^x below −87 is 0, as under
// flush-to-zero: on Intel cores each subnormal result or operand takes a microcode assist, and a
// causal mask's keys put half the softmax's inputs there), and agree with ATen's everywhere else:
// logits 0, −86 (a normal e^x), −87.5 and −100 (subnormal ones), −200 (0 either way), masked.
TEST(AttentionCoreKernel, SoftmaxesProduceNoSubnormals) {
  if (!CpuHasAvx512BwVl()) return;  // both kernels need it (GLOSSA_KERNELS=reference too)
  const float lowest = std::numeric_limits<float>::lowest();
  const at::Tensor row = at::tensor({0.0f, -86.0f, -87.5f, -100.0f, -200.0f, 0.0f, 1.0f, 2.0f,
                                     3.0f, -50.0f, -86.5f, -88.0f, -90.0f, -95.0f, -99.0f, 0.5f,
                                     -1.0f});
  const int64_t S = row.numel();
  const at::Tensor bias = at::zeros({1, 1, 1, S}).index_put_({0, 0, 0, 5}, lowest);
  const at::Tensor want = at::softmax(row.view({1, 1, 1, S}) + bias, -1);
  auto check = [&](const at::Tensor& got, double rtol, const char* what) {
    const at::Tensor g = got.to(at::kFloat).reshape({-1});
    const at::Tensor w = want.to(got.scalar_type()).to(at::kFloat).reshape({-1});
    for (int64_t s = 0; s < S; ++s) {
      const float gs = g[s].item<float>(), ws = w[s].item<float>();
      EXPECT_NE(std::fpclassify(gs), FP_SUBNORMAL) << what << " key " << s << ": " << gs;
      if (std::fpclassify(ws) == FP_NORMAL) {
        EXPECT_NEAR(gs, ws, rtol * ws) << what << " key " << s;
      } else {
        EXPECT_EQ(gs, 0.0f) << what << " key " << s << " (ATen: " << ws << ")";
      }
    }
  };
  at::Tensor x = row.view({1, 1, 1, S}).clone();
  SoftmaxWithBiasInPlace(x, bias);
  check(x, 1e-6, "float32");
  check(Bf16SoftmaxWithBias(row.view({1, 1, 1, S}).to(at::kBFloat16), bias), 1e-2, "bf16");
}

// bf16 logits' softmax (kernels/bf16_softmax.h) against ATen's bf16 softmax of logits + bias:
// probabilities and the logits' gradient within one bf16 rounding, with a per-query float32
// bias, a broadcast bf16 one and none, rows of 37 keys (a partial last vector) and 64.
TEST(Bf16Softmax, MatchesAtensSoftmaxOfTheBiasedLogits) {
  at::manual_seed(11);
  for (int64_t s : {37, 64}) {
    const at::Tensor masked = at::rand({2, 1, 5, s}) < 0.3;
    const std::vector<at::Tensor> biases = {
        at::zeros({2, 1, 5, s}).masked_fill_(masked, std::numeric_limits<float>::lowest()),
        at::zeros({1, 1, 1, s}).masked_fill_(at::arange(s) >= s - 3, -3.38e38)
            .to(at::kBFloat16),
        at::Tensor()};
    for (const at::Tensor& bias : biases) {
      SCOPED_TRACE(testing::Message() << "S " << s << " bias " << (bias.defined() ? bias.sizes() : at::IntArrayRef{}));
      const at::Tensor x0 = (3 * at::randn({2, 3, 5, s})).to(at::kBFloat16);
      const at::Tensor g = at::randn({2, 3, 5, s}).to(at::kBFloat16);
      if (!Bf16SoftmaxApplies(x0, bias)) GTEST_SKIP() << "needs AVX-512 BW/VL";
      const at::Tensor x = x0.clone().requires_grad_(true), xr = x0.clone().requires_grad_(true);
      const at::Tensor y = Bf16SoftmaxWithBias(x, bias);
      const at::Tensor yr = at::softmax(bias.defined() ? xr + bias.to(at::kBFloat16) : xr, -1);
      // One bf16 rounding: ATen adds the bias in bf16 first, so compare against float64 too.
      const at::Tensor exact = at::softmax(
          bias.defined() ? x0.to(at::kDouble) + bias.to(at::kDouble) : x0.to(at::kDouble), -1);
      EXPECT_EQ(y.scalar_type(), at::kBFloat16);
      EXPECT_TRUE(at::allclose(y.to(at::kDouble), exact, 8e-3, 1e-6));
      EXPECT_TRUE(at::allclose(y.to(at::kFloat), yr.to(at::kFloat), 1.6e-2, 1e-5));
      y.backward(g);
      yr.backward(g);
      EXPECT_TRUE(at::allclose(x.grad().to(at::kFloat), xr.grad().to(at::kFloat), 3e-2, 2e-3));
    }
  }
}

// The native core's bf16 path (kernels/bf16_dot_attention.h where the CPU has AVX-512 BF16 and
// the head size is even; else float32 sgemms of the widened heads) against float64 attention of
// the same bf16 values: outputs, probabilities and the gradients of q, k and v within the
// relative error of a few bf16 roundings (the probabilities and dL/dlogits are rounded before
// their second products). Pinned to the native path (the measured choice could take ATen's).
void CompareBf16(int64_t b, int64_t t, int64_t s, int64_t n, int64_t h, const at::Tensor& bias,
                 bool causal_blocks, bool probs_in_loss) {
  SCOPED_TRACE(testing::Message() << "B " << b << " T " << t << " S " << s << " N " << n << " H "
                                  << h << (causal_blocks ? " causal" : "")
                                  << (probs_in_loss ? " probs in the loss" : ""));
  // Self-attention (s == t): views of one fused projection; else q apart from fused k/v.
  const at::Tensor qkv0 = at::randn({b, s, 3 * n * h}).to(at::kBFloat16);
  const at::Tensor q0 =
      s == t ? qkv0.narrow(2, 0, n * h) : at::randn({b, t, n * h}).to(at::kBFloat16);
  const at::Tensor wo = at::randn({b, t, n, h}, at::kDouble);
  const at::Tensor wp = at::randn({b, n, t, s}, at::kDouble);
  auto run = [&](bool exact) {
    const at::ScalarType dtype = exact ? at::kDouble : at::kBFloat16;
    const at::Tensor fq = q0.to(dtype).requires_grad_(true);
    const at::Tensor fkv = qkv0.to(dtype).requires_grad_(true);
    const at::Tensor q = fq.view({b, t, n, h});
    const at::Tensor k = fkv.narrow(2, n * h, n * h).view({b, s, n, h});
    const at::Tensor v = fkv.narrow(2, 2 * n * h, n * h).view({b, s, n, h});
    auto [out, probs] = exact ? AttentionCoreReference(q, k, v, bias.to(at::kDouble))
                              : AttentionCore(q, k, v, bias, causal_blocks);
    at::Tensor loss = (out.to(at::kDouble) * wo).sum();
    if (probs_in_loss) loss = loss + (probs.to(at::kDouble) * wp).sum();
    const auto g = torch::autograd::grad({loss}, {fq, fkv});
    return std::vector<at::Tensor>{out.detach().to(at::kDouble), probs.detach().to(at::kDouble),
                                   g[0].to(at::kDouble), g[1].to(at::kDouble)};
  };
  const KernelMode mode = GetKernelMode(KernelChoice::kBf16);
  SetKernelMode(KernelChoice::kBf16, KernelMode::kNative);
  const auto got = run(false);
  SetKernelMode(KernelChoice::kBf16, mode);
  const auto want = run(true);
  const char* names[] = {"out", "probs", "dq", "dk and dv"};
  for (int i = 0; i < 4; ++i) {
    const double rel = ((got[i] - want[i]).norm() / want[i].norm()).item<double>();
    EXPECT_LT(rel, 8e-3) << names[i];  // measured 1.1e-3 to 3.7e-3
  }
}

TEST(AttentionCoreKernel, Bf16NativeMatchesFloat64Attention) {
  at::manual_seed(3);
  const float lowest = std::numeric_limits<float>::lowest();
  const at::Tensor padded9 =
      at::zeros({2, 1, 1, 9}).index_put_({1, 0, 0, at::indexing::Slice(6, 9)}, lowest);
  const at::Tensor padded13 =
      at::zeros({2, 1, 1, 13}).index_put_({0, 0, 0, at::indexing::Slice(10, 13)}, lowest);
  for (bool with_probs : {false, true}) {
    CompareBf16(2, 9, 9, 3, 8, padded9, false, with_probs);
    CompareBf16(2, 7, 13, 2, 32, padded13, false, with_probs);  // an odd key count
    CompareBf16(2, 80, 80, 2, 32, CausalBias(80), true, with_probs);
    // Packed rows whose blocks start at odd keys (11 and 51 in row 0).
    CompareBf16(2, 96, 96, 2, 16, PackedCausalBias({{11, 40, 29, 16}, {60, 30, 6}}, 96), true,
                with_probs);
    CompareBf16(2, 9, 9, 2, 5, padded9, false, with_probs);  // odd heads: widened sgemms
  }
  EXPECT_EQ(Bf16DotAttentionApplies(at::empty({1, 2, 1, 5}, at::kBFloat16)), false);
}

// The query scale inside the core (AttentionCore's query_scale, as MultiHeadedAttention passes
// it in float32) gives the bits of multiplying q first: outputs, probabilities and the gradients
// of q, k and v; the scale's own gradient is the same sum in another order. On both per-head
// GEMM paths, with and without causal blocks, through the fused backward (the output's
// gradient alone) and the staged one (the probabilities' too). AttentionCoreQkv, given the
// fused projection whole, gives the same bits again, its gradient written in place.
TEST(AttentionCoreKernel, AQueryScaleInsideTheCoreHasTheProductsBits) {
  const KernelMode saved = GetKernelMode(KernelChoice::kRowKernel);
  for (const KernelMode mode : {KernelMode::kNative, KernelMode::kAten}) {
    SetKernelMode(KernelChoice::kRowKernel, mode);
    for (const int64_t t : {9, 80}) {
      const int64_t b = 2, n = 2, h = 8;
      const bool blocks = t == 80;
      const at::Tensor bias = blocks ? CausalBias(t) : at::empty({0});
      const at::Tensor qkv0 = at::randn({b, t, 3 * n * h}), scale0 = at::rand({h}) + 0.5;
      for (const bool probs_loss : {false, true}) {
        auto run = [&](int inside) {  // 0: q * scale first; 1: inside; 2: inside, qkv whole
          const at::Tensor qkv = qkv0.clone().requires_grad_(true);
          const at::Tensor scale = scale0.clone().requires_grad_(true);
          const at::Tensor q = qkv.narrow(2, 0, n * h).view({b, t, n, h});
          const at::Tensor k = qkv.narrow(2, n * h, n * h).view({b, t, n, h});
          const at::Tensor v = qkv.narrow(2, 2 * n * h, n * h).view({b, t, n, h});
          auto [out, probs] =
              inside == 2 ? AttentionCoreQkv(qkv.view({b, t, 3, n, h}), bias, blocks, false, scale)
              : inside == 1 ? AttentionCore(q, k, v, bias, blocks, false, scale)
                            : AttentionCore(q * scale, k, v, bias, blocks);
          at::Tensor loss = (out * out).sum();
          if (probs_loss) loss = loss + (probs * at::arange(t).to(at::kFloat)).sum();
          const auto g = torch::autograd::grad({loss}, {qkv, scale});
          return std::vector<at::Tensor>{out.detach(), probs.detach(), g[0], g[1]};
        };
        const auto got = run(1), want = run(0), whole = run(2);
        for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(at::equal(whole[i], got[i])) << i;
        const std::string at = "t=" + std::to_string(t) + (probs_loss ? " probs loss" : "") +
                               (mode == KernelMode::kNative ? " small GEMMs" : " BLAS");
        EXPECT_TRUE(at::equal(got[0], want[0])) << at;
        EXPECT_TRUE(at::equal(got[1], want[1])) << at;
        EXPECT_TRUE(at::equal(got[2], want[2])) << at;
        // Sums of 2·80·2 products that partly cancel: the tolerance scales with the largest.
        const double tol = 1e-5 * want[3].abs().max().item<double>();
        EXPECT_TRUE(at::allclose(got[3], want[3], 1e-5, tol)) << at << "\n" << got[3] << want[3];
      }
    }
  }
  SetKernelMode(KernelChoice::kRowKernel, saved);
  EXPECT_THROW(AttentionCoreQkv(at::randn({2, 4, 2, 3}), at::empty({0}), false), InvalidArgumentError);
}

TEST(AttentionCoreKernel, OtherOperandsTakeTheReference) {
  const at::Tensor q = at::randn({1, 3, 2, 4}, at::kDouble);
  EXPECT_FALSE(AttentionCoreNativeApplies(q, q, q));
  auto [out, probs] = AttentionCore(q, q, q, at::empty({0}, at::kDouble), false);
  auto [rout, rprobs] = AttentionCoreReference(q, q, q, at::empty({0}, at::kDouble));
  EXPECT_TRUE(at::equal(out, rout));
  EXPECT_TRUE(at::equal(probs, rprobs));
  EXPECT_TRUE(at::allclose(probs.sum(-1), at::ones({1, 2, 3}, at::kDouble)));
}

}  // namespace
}  // namespace glossa
