// MultiHeadedAttention: incremental decoding, causal blocks, padded keys, attention dropout.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "glossa/core/step_seed.h"
#include "glossa/base/strings.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/attention_mask.h"
#include "glossa/layers/block.h"
#include "glossa/layers/conv.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/revnet.h"
#include "glossa/layers/rnn.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "glossa/search/beam_search.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// KeyMask (glossa/layers/attention_mask.h) written out for one packed row: keys of another
// segment masked, padded keys masked except for the padding's own queries (segment 0), future
// keys masked when causal; a cached mask is not reused once its inputs are written in place.
TEST(AttentionMask, KeyMaskOfPaddingsSegmentsAndCausality) {
  const at::Tensor pad = at::tensor({0.f, 0.f, 0.f, 1.f}).view({1, 4});
  const at::Tensor seg = at::tensor({1, 1, 2, 0}, at::kLong).view({1, 4});
  auto rows = [](const at::Tensor& m) { return m.squeeze(0).squeeze(0).to(at::kInt); };
  const at::Tensor want_packed = at::tensor({0, 0, 1, 1,  //
                                             0, 0, 1, 1,  //
                                             1, 1, 0, 1,  //
                                             1, 1, 1, 0},
                                            at::kInt)
                                     .view({4, 4});
  EXPECT_TRUE(at::equal(rows(KeyMask(pad, seg, seg, 4, 4, false, at::kCPU)), want_packed));
  const at::Tensor causal = KeyMask(pad, seg, seg, 4, 4, true, at::kCPU);
  EXPECT_TRUE(at::equal(rows(causal), want_packed | at::ones({4, 4}, at::kInt).triu(1)));
  // Unpacked: the padded key, for every query.
  EXPECT_TRUE(at::equal(rows(KeyMask(pad, {}, {}, 4, 4, false, at::kCPU)).expand({4, 4}),
                        at::tensor({0, 0, 0, 1}, at::kInt).expand({4, 4})));
  // The last mask is cached per inputs; writing the segment ids in place refreshes it.
  at::Tensor seg2 = seg.clone();
  const at::Tensor before = KeyMask(pad, seg2, seg2, 4, 4, false, at::kCPU);
  EXPECT_TRUE(KeyMask(pad, seg2, seg2, 4, 4, false, at::kCPU).is_same(before));
  seg2.fill_(1);
  // (one segment now: every query, the padded one too, masks only the padded key)
  EXPECT_EQ(KeyMask(pad, seg2, seg2, 4, 4, false, at::kCPU).sum().item<int64_t>(), 4);
  // The bias: 0 where visible, the dtype's lowest where masked.
  const at::Tensor bias = MaskBias(causal, at::TensorOptions().dtype(at::kFloat));
  EXPECT_EQ(bias[0][0][0][0].item<float>(), 0.f);
  EXPECT_EQ(bias[0][0][0][2].item<float>(), std::numeric_limits<float>::lowest());
}

TEST(MultiHeadedAttention, ExtendStepMatchesCausalFProp) {
  auto atten = Make<MultiHeadedAttention>(MultiHeadedAttention::Params(),
                                          "input_dim : 8\nnum_heads : 2\ndtype : float64");
  at::Tensor x = at::randn({3, 5, 8}, at::kDouble);
  NestedMap theta = atten->theta();
  at::Tensor full = atten->FProp(theta, x, x, x, {}, /*causal=*/true).first;
  NestedMap cache = atten->InitStates(3, at::kDouble);
  for (int64_t t = 0; t < 5; ++t) {
    auto [y, next] = atten->ExtendStep(theta, x.select(1, t), cache);
    EXPECT_TRUE(at::allclose(y, full.select(1, t), 1e-10, 1e-10)) << "step " << t;
    cache = next;
  }
  EXPECT_TRUE(at::equal(cache.GetTensor("length"), at::full({3}, 5, at::kLong)));
  EXPECT_GE(cache.GetTensor("unordered.key").size(1), 5);
  EXPECT_EQ(cache.GetTensor("unordered.key").size(0), 3);
}

// Decoding with a beam search's reorders: the caches are written in place and never copied by
// GatherStates (only the row tables move), they grow past their first capacity, and every
// hypothesis's output equals the causal FProp of the sequence of inputs it descends from.
TEST(MultiHeadedAttention, ExtendStepReadsReorderedHypothesesThroughTheirRows) {
  for (bool f32 : {true, false}) {
    auto atten = Make<MultiHeadedAttention>(
        MultiHeadedAttention::Params(),
        StrCat("input_dim : 8\nnum_heads : 2\ndtype : ", f32 ? "float32" : "float64"));
    const at::ScalarType dt = f32 ? at::kFloat : at::kDouble;
    const NestedMap theta = atten->theta();
    const int64_t n = 4, steps = MultiHeadedAttention::kInitialCacheSteps + 5;
    at::manual_seed(9);
    NestedMap cache = atten->InitStates(n, dt);
    std::vector<at::Tensor> history(n);  // each hypothesis's inputs so far [t, 8]
    for (auto& h : history) h = at::zeros({0, 8}, dt);
    for (int64_t t = 0; t < steps; ++t) {
      const at::Tensor x = at::randn({n, 8}, dt);
      auto [y, next] = atten->ExtendStep(theta, x, cache);
      for (int64_t i = 0; i < n; ++i) {
        history[i] = at::cat({history[i], x[i].unsqueeze(0)});
        const at::Tensor seq = history[i].unsqueeze(0);
        const at::Tensor want = atten->FProp(theta, seq, seq, seq, {}, true).first[0][t];
        EXPECT_TRUE(at::allclose(y[i], want, f32 ? 1e-5 : 1e-10, f32 ? 1e-5 : 1e-10))
            << "step " << t << " hypothesis " << i;
      }
      // Reorder as a beam search does: hypotheses 0 and 2 continue twice, 1 and 3 end.
      const at::Tensor parents = at::tensor(std::vector<int64_t>{2, 0, 2, 0}, at::kLong);
      const at::Tensor before = next.GetTensor("unordered.key");
      cache = GatherStates(next, parents);
      EXPECT_EQ(cache.GetTensor("unordered.key").data_ptr(), before.data_ptr()) << "copied";
      std::vector<at::Tensor> moved;
      for (int64_t i = 0; i < n; ++i) moved.push_back(history[parents[i].item<int64_t>()]);
      history = moved;
    }
    EXPECT_GE(cache.GetTensor("unordered.key").size(1), steps);
  }
}

// Causal self-attention in blocks of queries (causal_blocks, the default) gives the full
// computation's probabilities bit for bit, and its outputs and gradients up to float32 rounding
// (BLAS sums the shorter products in other groups), float32 and bf16, with padded keys, when the
// probabilities get a gradient of their own, with queries whose keys are all padded (an
// all-padding example, left padding), for sequence lengths that split into equal blocks and ones
// that leave a short last block.
TEST(MultiHeadedAttention, CausalBlocksGiveTheFullComputation) {
  for (int64_t t : {64, 80, 130}) {
    for (bool bf16 : {false, true}) {
      for (int case_index = 0; case_index < 4; ++case_index) {
        // Right padding with and without a gradient on the probabilities; then (queries whose
        // keys are all masked: their probability spreads over all keys) an all-padding example
        // and left padding.
        const bool probs_grad = case_index == 1;
        const int pad_case = case_index < 2 ? 0 : case_index - 1;
        SCOPED_TRACE(StrCat("T ", t, " bf16 ", bf16, " probs_grad ", probs_grad, " padding case ",
                            pad_case));
        std::vector<at::Tensor> results[2];
        for (bool blocks : {false, true}) {
          Params p = MultiHeadedAttention::Params();
          p.Set("name", "atten").Set("random_seed", 7).Set("input_dim", 16).Set("num_heads", 2);
          p.Set("causal_blocks", blocks);
          if (bf16) p.Set("fprop_dtype", DType::kBFloat16);
          auto atten = InstantiateLayer<MultiHeadedAttention>(p);
          NestedMap theta = atten->theta().Transform([](const NestedValue& v) -> NestedValue {
            return v.AsTensor().detach().clone().requires_grad_(true);
          });
          at::manual_seed(t);
          at::Tensor x = at::randn({2, t, 16});
          if (bf16) x = x.to(at::kBFloat16);
          x.requires_grad_(true);
          at::Tensor paddings = at::zeros({2, t});
          paddings.select(0, 1).narrow(0, t - 9, 9).fill_(1.0);
          if (pad_case == 1) paddings.select(0, 0).fill_(1.0);  // an all-padding example
          if (pad_case == 2) paddings.select(0, 0).narrow(0, 0, 5).fill_(1.0);  // left padding
          const at::Tensor c = at::randn({2, t, 16}), cp = at::randn({2, 2, t, t});
          auto [y, probs] = atten->FProp(theta, x, x, x, paddings, /*causal=*/true);
          at::Tensor loss = (y.to(at::kFloat) * c).sum();
          if (probs_grad) loss = loss + (probs.to(at::kFloat) * cp).sum();
          loss.backward();
          results[blocks] = {y.detach(), probs.detach(), x.grad()};
          for (const at::Tensor& v : theta.FlattenTensors()) results[blocks].push_back(v.grad());
        }
        ASSERT_EQ(results[0].size(), results[1].size());
        // The probabilities: the same arithmetic on blocks of queries. Bit-identical where
        // OpenBLAS's sgemm gives a row the same bits whatever the number of rows (its SkylakeX
        // kernels); with other kernel sets (OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU) a
        // partial tile accumulates in another order, so within float32 rounding.
        {
          const at::Tensor want = results[0][1].to(at::kDouble);
          const double err = (results[1][1].to(at::kDouble) - want).abs().max().item<double>();
          EXPECT_LE(err, (bf16 ? 1e-2 : 1e-6) * want.abs().max().item<double>())
              << "the probabilities";
        }
        for (size_t i = 0; i < results[0].size(); ++i) {
          ASSERT_TRUE(results[1][i].defined()) << i;
          const at::Tensor want = results[0][i].to(at::kDouble);
          // Relative to the values, or for a gradient that is 0 up to rounding (the key bias's:
          // softmax ignores a shift of all logits) to a tenth of the input's gradient.
          const double floor = i >= 2 ? 0.1 * results[0][2].abs().max().item<double>() : 1e-30;
          const double err = (results[1][i].to(at::kDouble) - want).abs().max().item<double>() /
                             std::max(want.abs().max().item<double>(), floor);
          // float32 rounding; in bf16, a value near a rounding boundary may go the other way.
          EXPECT_LT(err, bf16 ? 1e-2 : 1e-5) << "result " << i;
        }
        // The probabilities of masked keys are exactly 0 (the skipped blocks included), for the
        // example whose first key is unpadded.
        const at::Tensor future = at::ones({t, t}, at::kBool).triu(1);
        EXPECT_TRUE(
            results[1][1].select(0, 1).masked_select(future.view({1, t, t})).eq(0).all().item<bool>());
      }
    }
  }
}

// bf16 layer norm (one pass each way over the bf16 rows) against ATen's float32 layer norm of the
// widened values, rounded to bf16 (the composition it replaced): outputs and input gradients to
// within one bf16 rounding, scale and bias gradients to float32 rounding; row widths that fill
// whole AVX-512 vectors and ones with a tail, a direct scale and 1 + scale.

TEST(MultiHeadedAttention, PaddedKeysGetZeroProbability) {
  auto atten =
      Make<MultiHeadedAttention>(MultiHeadedAttention::Params(), "input_dim : 4\nnum_heads : 2");
  at::Tensor q = at::randn({2, 3, 4}), kv = at::randn({2, 5, 4});
  at::Tensor paddings = at::zeros({2, 5});
  paddings.index_put_({1, at::indexing::Slice(2, at::indexing::None)}, 1.0);
  auto [y, probs] = atten->FProp(atten->theta(), q, kv, kv, paddings);
  EXPECT_TRUE(probs
                  .index({1, at::indexing::Slice(), at::indexing::Slice(),
                          at::indexing::Slice(2, at::indexing::None)})
                  .eq(0)
                  .all()
                  .item<bool>());
  EXPECT_TRUE(at::allclose(probs.sum(-1), at::ones({2, 2, 3})));
  // Padded keys do not influence the output.
  at::Tensor kv2 = kv.clone();
  kv2.index_put_({1, at::indexing::Slice(2, at::indexing::None)}, 100.0);
  EXPECT_TRUE(at::allclose(atten->FProp(atten->theta(), q, kv2, kv2, paddings).first[1], y[1]));
  EXPECT_ERROR_CONTAINS(atten->FProp(atten->theta(), q, kv, kv, at::zeros({2, 4})),
                        InvalidArgumentError, "paddings must be [B, S]");
  EXPECT_ERROR_CONTAINS(atten->FProp(atten->theta(), q, kv, kv, {}, true), InvalidArgumentError,
                        "causal attention needs T == S");
}

TEST(MultiHeadedAttention, AttentionDropoutOnlyInTraining) {
  auto atten = Make<MultiHeadedAttention>(MultiHeadedAttention::Params(),
                                          "input_dim : 4\nnum_heads : 1\natten_dropout_prob : 0.5");
  at::Tensor x = at::randn({2, 6, 4});
  ResetStepSeed();
  at::Tensor train = atten->FProp(atten->theta(), x, x, x).first;
  EvalModeScope eval;
  at::Tensor eval1 = atten->FProp(atten->theta(), x, x, x).first;
  at::Tensor eval2 = atten->FProp(atten->theta(), x, x, x).first;
  EXPECT_TRUE(at::equal(eval1, eval2));
  EXPECT_FALSE(at::allclose(train, eval1));
}

}  // namespace
}  // namespace glossa
