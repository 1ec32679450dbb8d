// Behaviours of the core layers beyond the reference table (tests/layers/layer_check_test.cc):
// incremental decoding, training versus eval statistics, padding semantics, errors, and a small
// model built from nested Params and trained one step.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "glossa/core/step_seed.h"
#include "glossa/base/strings.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/block.h"
#include "glossa/layers/conv.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/revnet.h"
#include "glossa/layers/rnn.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

template <typename T>
std::unique_ptr<T> Make(Params p, const std::string& text = "") {
  p.Set("name", "layer").Set("random_seed", 17);
  if (!text.empty()) p.FromText(text);
  return InstantiateLayer<T>(p);
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
  EXPECT_EQ(cache.GetTensor("key").sizes(), (std::vector<int64_t>{3, 5, 2, 4}));
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
TEST(LayerNormBf16, MatchesTheFloat32Composition) {
  for (int64_t d : {128, 37, 8}) {
    for (bool direct : {false, true}) {
      SCOPED_TRACE(StrCat("D ", d, " direct_scale ", direct));
      Params p = LayerNorm::Params();
      p.Set("name", "ln").Set("random_seed", 3).Set("input_dim", d).Set("direct_scale", direct);
      p.Set("fprop_dtype", DType::kBFloat16);
      auto ln = InstantiateLayer<LayerNorm>(p);
      at::manual_seed(d);
      const at::Tensor scale = at::randn({d}) * 0.3 + (direct ? 1.0 : 0.0), bias = at::randn({d});
      const at::Tensor x0 = (at::randn({5, 67, d}) * 3 + 1).to(at::kBFloat16);
      const at::Tensor c = at::randn({5, 67, d});
      auto run = [&](bool fused) {
        at::Tensor s = scale.clone().requires_grad_(true), b = bias.clone().requires_grad_(true);
        at::Tensor x = x0.clone().requires_grad_(true);
        at::Tensor y;
        if (fused) {
          NestedMap theta;
          theta.Put("scale", s);
          theta.Put("bias", b);
          y = ln->FProp(theta, x);
        } else {
          const at::Tensor g = direct ? s : s + 1;
          y = at::layer_norm(x.to(at::kFloat), {d}, g, b, 1e-6).to(at::kBFloat16);
        }
        (y.to(at::kFloat) * c).sum().backward();
        return std::vector<at::Tensor>{y.detach(), x.grad(), s.grad(), b.grad()};
      };
      const auto got = run(true), want = run(false);
      ASSERT_EQ(got[0].scalar_type(), at::kBFloat16);
      ASSERT_EQ(got[1].scalar_type(), at::kBFloat16);
      for (size_t i = 0; i < got.size(); ++i) {
        const at::Tensor w = want[i].to(at::kDouble), g = got[i].to(at::kDouble);
        // One bf16 rounding apart at most (2^-8 relative), against the row's scale.
        const double err = ((g - w).abs() / (w.abs() + 1e-2 * w.abs().max())).max().item<double>();
        EXPECT_LT(err, i < 2 ? 1.0 / 128 : 1e-4) << "result " << i;
      }
      // Most outputs are the same bf16 value.
      EXPECT_GT(got[0].eq(want[0]).to(at::kFloat).mean().item<double>(), 0.97);
    }
  }
}

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

TEST(TransformerStack, DecoderExtendStepMatchesFProp) {
  auto dec = Make<TransformerStack>(TransformerDecoder::Params(),
                                    "num_layers : 2\nmdl_dim : 8\nnum_atten_heads : 2\n"
                                    "hidden_dim : 16\ndtype : float64");
  at::Tensor y = at::randn({2, 4, 8}, at::kDouble), enc = at::randn({2, 3, 8}, at::kDouble);
  at::Tensor enc_paddings = at::zeros({2, 3}, at::kDouble);
  enc_paddings[1][2] = 1.0;
  NestedMap theta = dec->theta();
  at::Tensor full = dec->FProp(theta, y, {}, enc, enc_paddings);
  NestedMap states = dec->InitStates(2, at::kDouble);
  for (int64_t t = 0; t < 4; ++t) {
    auto [out, next] = dec->ExtendStep(theta, y.select(1, t), states, enc, enc_paddings);
    EXPECT_TRUE(at::allclose(out, full.select(1, t), 1e-9, 1e-9)) << "step " << t;
    states = next;
  }
}

TEST(TransformerStack, EncoderIsNotCausalAndVariablesAreNamed) {
  auto enc =
      Make<TransformerStack>(TransformerEncoder::Params(),
                             "num_layers : 2\nmdl_dim : 8\nnum_atten_heads : 2\nhidden_dim : 16");
  at::Tensor x = at::randn({1, 4, 8});
  at::Tensor out = enc->FProp(enc->theta(), x);
  at::Tensor x2 = x.clone();
  x2[0][3][0] += 1.0;  // a later position changes earlier outputs: not causal
  EXPECT_FALSE(at::allclose(enc->FProp(enc->theta(), x2)[0][0], out[0][0]));
  std::vector<std::string> names;
  for (const auto& [info, t] : enc->AllVariables()) names.push_back(info.full_name);
  EXPECT_NE(std::find(names.begin(), names.end(), "layer/x_layers_1/self_atten/atten/query/w"),
            names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "layer/final_ln/scale"), names.end());
  EXPECT_FALSE(enc->GetDescendant("x_layers[0]").HasChild("cross_atten"));
}

TEST(BatchNormLayer, TrainingUpdatesMovingStatsAndEvalUsesThem) {
  auto bn = Make<BatchNormLayer>(BatchNormLayer::Params(), "dim : 3\ndecay : 0.5");
  at::Tensor x = at::randn({4, 6, 3}) * 2 + 5;
  at::Tensor y = bn->FProp(bn->theta(), x);
  // Training: batch statistics normalize (per channel mean 0, variance ~1).
  EXPECT_TRUE(at::allclose(y.mean(std::vector<int64_t>{0, 1}), at::zeros({3}), 1e-4, 1e-4));
  at::Tensor batch_mean = x.mean(std::vector<int64_t>{0, 1});
  EXPECT_TRUE(at::allclose(bn->GetVariable("moving_mean"), batch_mean * 0.5, 1e-5, 1e-5));
  EXPECT_FALSE(bn->GetVariable("moving_mean").requires_grad());
  at::Tensor moving_mean = bn->GetVariable("moving_mean").clone();
  EvalModeScope eval;
  at::Tensor y_eval = bn->FProp(bn->theta(), x);
  EXPECT_TRUE(at::equal(bn->GetVariable("moving_mean"), moving_mean));  // no update in eval
  at::Tensor expected = (x - moving_mean) / at::sqrt(bn->GetVariable("moving_variance") + 0.001);
  EXPECT_TRUE(at::allclose(y_eval, expected, 1e-5, 1e-5));
}

TEST(LSTM, PaddedStepsCarryTheStateAndReverseRuns) {
  auto rnn =
      Make<RNNLayer>(RNNLayer::Params(), "cell.num_input_nodes : 3\ncell.num_output_nodes : 4");
  at::Tensor x = at::randn({5, 2, 3});
  at::Tensor paddings = at::zeros({5, 2, 1});
  paddings.index_put_({at::indexing::Slice(3, at::indexing::None), 1}, 1.0);
  auto [out, final_state] = rnn->FProp(rnn->theta(), x, paddings);
  // Sequence 1 ends at step 3: its outputs stay at the last real step and the final state is it.
  EXPECT_TRUE(at::equal(out[4][1], out[2][1]));
  EXPECT_TRUE(at::equal(final_state.GetTensor("m")[1], out[2][1]));
  EXPECT_FALSE(at::equal(out[4][0], out[2][0]));
  // The padded steps' inputs do not matter.
  at::Tensor x2 = x.clone();
  x2.index_put_({at::indexing::Slice(3, at::indexing::None), 1}, 9.0);
  EXPECT_TRUE(at::equal(rnn->FProp(rnn->theta(), x2, paddings).first[2][1], out[2][1]));
  auto rev = Make<RNNLayer>(RNNLayer::Params(),
                            "cell.num_input_nodes : 3\ncell.num_output_nodes : 4\nreverse : True");
  auto [rout, rstate] = rev->FProp(rev->theta(), x);
  EXPECT_TRUE(at::equal(rstate.GetTensor("m"), rout[0]));  // the last step run is t = 0
  EXPECT_ERROR_CONTAINS(rnn->FProp(rnn->theta(), at::randn({5, 2})), InvalidArgumentError,
                        "inputs must be [T, B, D]");
}

TEST(SimpleFullSoftmax, ClassProbabilitiesAndValidation) {
  auto sm = Make<SimpleFullSoftmax>(SimpleFullSoftmax::Params(), "input_dim : 4\nnum_classes : 3");
  at::Tensor x = at::randn({2, 4});
  at::Tensor ids = at::tensor({2, 0}, at::kLong);
  NestedMap by_ids = sm->FProp(sm->theta(), x, ids);
  at::Tensor probs = at::one_hot(ids, 3).to(at::kFloat);
  NestedMap by_probs = sm->FProp(sm->theta(), x, {}, {}, {}, probs);
  EXPECT_TRUE(
      at::allclose(by_ids.GetTensor("per_example_xent"), by_probs.GetTensor("per_example_xent")));
  EXPECT_EQ(by_ids.GetTensor("total_weight").item<double>(), 2.0);
  EXPECT_ERROR_CONTAINS(sm->FProp(sm->theta(), x, at::tensor({3, 0}, at::kLong)),
                        InvalidArgumentError, "class_ids must be in [0, 3)");
  EXPECT_ERROR_CONTAINS(sm->FProp(sm->theta(), x, ids, {}, {}, probs), InvalidArgumentError,
                        "exactly one of");
  EXPECT_ERROR_CONTAINS(sm->FProp(sm->theta(), x, at::tensor({1}, at::kLong)), InvalidArgumentError,
                        "class_ids must be integers shaped");
}

TEST(Embedding, RejectsOutOfRangeAndFloatIds) {
  auto emb = Make<EmbeddingLayer>(EmbeddingLayer::Params(), "vocab_size : 5\nembedding_dim : 2");
  EXPECT_EQ(emb->EmbLookup(emb->theta(), at::tensor({0, 4}, at::kLong).view({1, 2})).sizes(),
            (std::vector<int64_t>{1, 2, 2}));
  EXPECT_ERROR_CONTAINS(emb->EmbLookup(emb->theta(), at::tensor({5}, at::kLong)),
                        InvalidArgumentError, "ids must be in [0, 5), found 5");
  EXPECT_ERROR_CONTAINS(emb->EmbLookup(emb->theta(), at::tensor({-1}, at::kLong)),
                        InvalidArgumentError, "found -1");
  EXPECT_ERROR_CONTAINS(emb->EmbLookup(emb->theta(), at::tensor({1.0})), InvalidArgumentError,
                        "ids must be integers");
}

TEST(Projection, ValidatesParamsAndShapes) {
  EXPECT_ERROR_CONTAINS(
      Make<ProjectionLayer>(ProjectionLayer::Params(),
                            "input_dim : 2\noutput_dim : 3\nactivation : 'RELUU'"),
      InvalidArgumentError, "unknown activation RELUU (did you mean: [LEAKY_RELU,RELU,RELU6])");
  EXPECT_THROW(Make<ProjectionLayer>(ProjectionLayer::Params(), "input_dim : 0\noutput_dim : 3"),
               InvalidArgumentError);
  auto fc = Make<FCLayer>(FCLayer::Params(), "input_dim : 2\noutput_dim : 3");
  EXPECT_TRUE(fc->params().GetBool("has_bias"));
  EXPECT_ERROR_CONTAINS(fc->FProp(fc->theta(), at::randn({4, 3})), InvalidArgumentError,
                        "inputs must end in input_dim 2");
}

TEST(Projection, PaddedRowsAreZeroAndUnpaddedBatchesPassGradientsThrough) {
  auto fc = Make<FCLayer>(FCLayer::Params(), "input_dim : 2\noutput_dim : 3\nactivation : 'NONE'");
  at::Tensor x = at::randn({2, 4, 2});
  at::Tensor none = at::zeros({2, 4}), some = none.clone();
  some[1][3] = 1.0;
  at::Tensor y = fc->FProp(fc->theta(), x, some);
  EXPECT_TRUE(at::equal(y[1][3], at::zeros({3})));
  EXPECT_TRUE(at::equal(y[0], fc->FProp(fc->theta(), x, none)[0]));
  EXPECT_FALSE(at::equal(fc->FProp(fc->theta(), x, none)[1][3], at::zeros({3})));
  // No padding: the same values and weight gradient as with no paddings at all.
  at::Tensor w = fc->theta().GetTensor("w");
  at::Tensor g0 = torch::autograd::grad({fc->FProp(fc->theta(), x, none).square().sum()}, {w})[0];
  at::Tensor g1 = torch::autograd::grad({fc->FProp(fc->theta(), x, {}).square().sum()}, {w})[0];
  EXPECT_TRUE(at::equal(g0, g1));
}

TEST(Conv2D, OutputPaddingsFollowTheStride) {
  auto conv = Make<Conv2DLayer>(Conv2DLayer::Params(),
                                "filter_shape : [3, 1, 1, 2]\nfilter_stride : [2, 1]");
  at::Tensor x = at::randn({2, 7, 3, 1});
  at::Tensor paddings = at::zeros({2, 7});
  paddings.index_put_({1, at::indexing::Slice(3, at::indexing::None)}, 1.0);
  auto [y, out_paddings] = conv->FProp(conv->theta(), x, paddings);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 4, 3, 2}));  // SAME: ceil(7 / 2)
  EXPECT_TRUE(at::equal(out_paddings[1], at::tensor({0.0f, 0.0f, 1.0f, 1.0f})));
  EXPECT_TRUE(y[1][2].eq(0).all().item<bool>());
  auto valid =
      Make<Conv2DLayer>(Conv2DLayer::Params(), "filter_shape : [3, 3, 1, 2]\npadding : 'VALID'");
  EXPECT_EQ(valid->FProp(valid->theta(), x).first.sizes(), (std::vector<int64_t>{2, 5, 1, 2}));
  EXPECT_ERROR_CONTAINS(Make<Conv2DLayer>(Conv2DLayer::Params(), "padding : 'FULL'"),
                        InvalidArgumentError, "padding must be 'SAME' or 'VALID'");
  EXPECT_ERROR_CONTAINS(conv->FProp(conv->theta(), at::randn({2, 7, 3, 4})), InvalidArgumentError,
                        "inputs must be [B, H, W, 1]");
}

TEST(Pooling, PaddedFramesNeverWinOrCount) {
  auto pool =
      Make<PoolingLayer>(PoolingLayer::Params(), "window_shape : [2, 1]\nwindow_stride : [2, 1]");
  at::Tensor x = at::tensor({-1.0f, -2.0f, 5.0f, 7.0f}).view({1, 4, 1, 1});
  at::Tensor paddings = at::tensor({0.0f, 0.0f, 0.0f, 1.0f}).view({1, 4});
  auto [y, out_paddings] = pool->FProp(pool->theta(), x, paddings);
  // Frame 3 (7) is padded, so 5 wins the second window; the output frames are not padded.
  EXPECT_TRUE(at::equal(y.view({2}), at::tensor({-1.0f, 5.0f})));
  EXPECT_TRUE(at::equal(out_paddings, at::zeros({1, 2})));
  auto avg =
      Make<PoolingLayer>(PoolingLayer::Params(),
                         "window_shape : [2, 1]\nwindow_stride : [2, 1]\npooling_type : 'AVG'");
  at::Tensor paddings2 = at::tensor({0.0f, 0.0f, 0.0f, 1.0f}).view({1, 4});
  auto [ya, pa] = avg->FProp(avg->theta(), x, paddings2);
  EXPECT_FLOAT_EQ(ya.view({2})[0].item<float>(), -1.5f);
  EXPECT_FLOAT_EQ(ya.view({2})[1].item<float>(), 5.0f);  // the padded 7 is not averaged in
}

// A small model as nested Params: embedding -> transformer encoder -> softmax.
class TinyLm : public BaseLayer {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseLayer::Params();
    p.Set("cls", ClsOf<TinyLm>());
    p.Define("emb", EmbeddingLayer::Params().Set("vocab_size", 11).Set("embedding_dim", 8),
             "Embedding.");
    p.Define("encoder",
             TransformerEncoder::Params()
                 .Set("num_layers", 2)
                 .Set("mdl_dim", 8)
                 .Set("num_atten_heads", 2)
                 .Set("hidden_dim", 16),
             "Encoder stack.");
    p.Define("softmax", SimpleFullSoftmax::Params().Set("input_dim", 8).Set("num_classes", 11),
             "Output softmax.");
    return p;
  }
  explicit TinyLm(const glossa::Params& p) : BaseLayer(p) {
    for (const char* name : {"emb", "encoder", "softmax"}) CreateChild(name, p.GetParams(name));
  }
  at::Tensor Loss(const NestedMap& theta, const at::Tensor& ids, const at::Tensor& labels) const {
    at::Tensor x = GetChildAs<EmbeddingLayer>("emb").EmbLookup(theta.at("emb").AsMap(), ids);
    x = GetChildAs<TransformerStack>("encoder").FProp(theta.at("encoder").AsMap(), x);
    return GetChildAs<SimpleFullSoftmax>("softmax")
        .FProp(theta.at("softmax").AsMap(), x, labels)
        .GetTensor("avg_xent");
  }
};
GLOSSA_REGISTER_CLASS(TinyLm, "glossa.testing.TinyLm");

TEST(Model, NestedParamsInstantiateListVariablesAndTrainOneStep) {
  Params p = TinyLm::Params();
  p.Set("name", "lm").Set("random_seed", 3);
  p.FromText("encoder.num_layers : 1\nencoder.hidden_dim : 12\n");  // an override
  auto model = InstantiateLayer<TinyLm>(p);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [info, t] : model->AllVariables()) shapes[info.full_name] = t.sizes().vec();
  EXPECT_EQ(shapes.at("lm/emb/emb_var"), (std::vector<int64_t>{11, 8}));
  EXPECT_EQ(shapes.at("lm/encoder/x_layers_0/fflayer/fc0/w"), (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(shapes.at("lm/softmax/weight_0"), (std::vector<int64_t>{8, 11}));
  EXPECT_EQ(shapes.count("lm/encoder/x_layers_1/fflayer/fc0/w"), 0u);
  // Fixed data (not the global generator, which other tests advance) and a small step: one
  // gradient step must lower the loss.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor ids = at::randint(0, 11, {4, 6}, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor labels = at::randint(0, 11, {4, 6}, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor loss0 = model->Loss(model->theta(), ids, labels);
  std::vector<at::Tensor> vars;
  for (const auto& [info, t] : model->AllVariables()) {
    if (info.trainable) vars.push_back(t);
  }
  auto grads = torch::autograd::grad({loss0}, vars);
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < vars.size(); ++i) vars[i].sub_(grads[i] * 0.1);
  }
  at::Tensor loss1 = model->Loss(model->theta(), ids, labels);
  EXPECT_LT(loss1.item<double>(), loss0.item<double>());
}

TEST(Registry, EveryRegisteredLayerInstantiatesUnderStubs) {
  // Each layer built from its default Params with small dims, its variables stubbed.
  const std::map<std::string, std::string> dims = {
      {"glossa.layers.ProjectionLayer", "input_dim : 2\noutput_dim : 2"},
      {"glossa.layers.FCLayer", "input_dim : 2\noutput_dim : 2"},
      {"glossa.layers.EmbeddingLayer", "vocab_size : 3\nembedding_dim : 2"},
      {"glossa.layers.PositionalEmbeddingLayer", "embedding_dim : 2"},
      {"glossa.layers.LayerNorm", "input_dim : 2"},
      {"glossa.layers.BatchNormLayer", "dim : 2"},
      {"glossa.layers.MultiHeadedProjectionLayer",
       "input_dim : 2\nnum_heads : 1\ndim_per_head : 2"},
      {"glossa.layers.PerDimScaleLayer", "dim : 2"},
      {"glossa.layers.MultiHeadedAttention", "input_dim : 2"},
      {"glossa.layers.TransformerFeedForwardLayer", "input_dim : 2\nhidden_dim : 4"},
      {"glossa.layers.TransformerAttentionLayer", "input_dim : 2"},
      {"glossa.layers.TransformerLayer", "input_dim : 2\ntr_fflayer_tpl.hidden_dim : 4"},
      {"glossa.layers.TransformerStack", "mdl_dim : 2\nhidden_dim : 4"},
      {"glossa.layers.TransformerEncoder", "mdl_dim : 2\nhidden_dim : 4"},
      {"glossa.layers.TransformerDecoder", "mdl_dim : 2\nhidden_dim : 4"},
      {"glossa.layers.SimpleFullSoftmax", "input_dim : 2\nnum_classes : 3"},
      {"glossa.layers.LSTMCellSimple", "num_input_nodes : 2\nnum_output_nodes : 2"},
      {"glossa.layers.RNNLayer", "cell.num_input_nodes : 2\ncell.num_output_nodes : 2"},
      {"glossa.layers.StackedRNN", "num_input_nodes : 2\nnum_output_nodes : 2"},
      {"glossa.layers.TransformerShardedMoeLayer",
       "input_dim : 2\nhidden_dim : 4\nnum_experts : 2"},
      {"glossa.layers.GPipeTransformerStack", "mdl_dim : 2\nhidden_dim : 4"},
  };
  // Containers get their sub-layer Params set directly.
  const Params fc = FCLayer::Params().Set("input_dim", 2).Set("output_dim", 2);
  const ParamValue::List one_fc = {ParamValue(fc)};
  const Params rev = RevNetLayer::Params().Set("f_params", fc).Set("g_params", fc);
  const std::map<std::string, std::function<void(Params&)>> setups = {
      {"glossa.layers.SequentialLayer", [&](Params& p) { p.Set("sub", one_fc); }},
      {"glossa.layers.PipeliningLayer", [&](Params& p) { p.Set("cell_tpl", one_fc); }},
      {"glossa.layers.RevNetLayer", [&](Params& p) { p.Set("f_params", fc).Set("g_params", fc); }},
      {"glossa.layers.StackedRevNetLayer",
       [&](Params& p) { p.Set("sub_layer_params", ParamValue::List{ParamValue(rev)}); }},
  };
  VariableStubScope stubs;
  int built = 0;
  for (const auto& key : ClassRegistry::KeysOf<BaseLayer>()) {
    if (key.rfind("glossa.layers.", 0) != 0) continue;
    Params p = ClassRegistry::Get(key).default_params();
    p.Set("name", "x");
    if (dims.count(key)) p.FromText(dims.at(key));
    if (setups.count(key)) setups.at(key)(p);
    EXPECT_NO_THROW(p.Instantiate<BaseLayer>()) << key;
    ++built;
  }
  EXPECT_GE(built, 20);
}

TEST(Docs, InputGuideShowsTheCompiledExampleVerbatim) {
  const std::string doc = testing::ReadSourceFile("docs/input.md");
  const std::string example = testing::ReadSourceFile("docs/examples/dataset_fn_example.cc");
  EXPECT_NE(doc.find("```cpp\n" + example + "```"), std::string::npos)
      << "docs/input.md must contain docs/examples/dataset_fn_example.cc in a cpp block";
}

TEST(Docs, InferenceGuideShowsTheCompiledExampleVerbatim) {
  const std::string doc = testing::ReadSourceFile("docs/inference.md");
  const std::string example = testing::ReadSourceFile("docs/examples/serving_example.cc");
  EXPECT_NE(doc.find("```cpp\n" + example + "```"), std::string::npos)
      << "docs/inference.md must contain docs/examples/serving_example.cc in a cpp block";
}

TEST(Docs, LayersGuideShowsTheCompiledExampleVerbatim) {
  const std::string doc = testing::ReadSourceFile("docs/layers.md");
  const std::string example = testing::ReadSourceFile("docs/examples/gated_ffn_example.cc");
  EXPECT_NE(doc.find("```cpp\n" + example + "```"), std::string::npos)
      << "docs/layers.md must contain docs/examples/gated_ffn_example.cc in a cpp block";
  const std::string model = testing::ReadSourceFile("docs/examples/tagger_model_example.cc");
  EXPECT_NE(doc.find("```cpp\n" + model + "```"), std::string::npos)
      << "docs/layers.md must contain docs/examples/tagger_model_example.cc in a cpp block";
}


// ---- Composition: typed children, theta paths, the Block interface, layer templates ----

TEST(Composition, MissingChildThetaNamesThePath) {
  auto enc = Make<TransformerStack>(TransformerEncoder::Params(),
                                    "num_layers : 2\nmdl_dim : 8\nnum_atten_heads : 2\nhidden_dim : 16");
  NestedMap theta = enc->theta();
  NestedMap self_atten = theta.GetItem("x_layers[1].self_atten").AsMap();
  self_atten.erase("ln");
  theta.Set("x_layers[1].self_atten", self_atten);
  EXPECT_ERROR_CONTAINS(enc->FProp(theta, at::randn({1, 3, 8})), InvalidArgumentError,
                        "theta of layer 'layer.x_layers_1.self_atten.ln' is missing: no 'ln' (the "
                        "theta given to 'layer.x_layers_1.self_atten' has: atten, "
                        "residual_dropout)");
}

// A user's layer becomes a block of any container by implementing Block: no registration.
class Shift : public BaseLayer, public Block {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseLayer::Params();
    p.Set("cls", ClsOf<Shift>());
    p.Define("by", 1.0, "Added to the input.");
    return p;
  }
  explicit Shift(const glossa::Params& p) : BaseLayer(p), by_(p.GetFloat("by")) {}
  at::Tensor FPropBlock(const NestedMap&, const at::Tensor& x,
                        const at::Tensor& paddings) const override {
    at::Tensor y = x + by_;
    return paddings.defined() ? y * (1 - paddings).unsqueeze(-1) : y;
  }

 private:
  double by_;
};
GLOSSA_REGISTER_CLASS(Shift, "glossa.testing.Shift");

TEST(Composition, UserBlocksDropIntoContainers) {
  Params seq = SequentialLayer::Params();
  seq.Set("name", "seq").Set("sub", ParamValue::List{Shift::Params().Set("by", 2.0),
                                                      LayerNorm::Params().Set("input_dim", 3),
                                                      Shift::Params().Set("by", -1.0)});
  auto layer = InstantiateLayer<SequentialLayer>(seq);
  at::Tensor x = at::randn({2, 4, 3});
  at::Tensor paddings = at::zeros({2, 4});
  paddings[1][3] = 1;
  const NestedMap theta = layer->theta();
  const auto& ln = dynamic_cast<const LayerNorm&>(*layer->GetChildren("sub")[1]);
  at::Tensor want = (ln.FProp(theta.GetItem("sub[1]").AsMap(), x + 2.0) - 1.0) *
                    (1 - paddings).unsqueeze(-1);
  EXPECT_TRUE(at::allclose(layer->FProp(theta, x, paddings), want, 1e-6, 1e-6));
  // The same block as a Transformer layer's feed-forward template.
  Params tl = TransformerLayer::Params();
  tl.Set("name", "tl").Set("input_dim", 4).Set("num_heads", 2);
  Params shift = Shift::Params();
  shift.Define("input_dim", 0, "Set by the layer.");
  tl.Set("tr_fflayer_tpl", shift);
  auto t = InstantiateLayer<TransformerLayer>(tl);
  EXPECT_FALSE(t->HasChild("fflayer") && t->GetChild("fflayer").HasChild("fc0"));
  at::Tensor y = at::randn({2, 3, 4});
  auto [with_shift, probs] = t->FProp(t->theta(), y);
  Params no_ff = tl.Copy();
  no_ff.Set("tr_fflayer_tpl", Shift::Params().Set("by", 0.0));
  no_ff.GetParams("tr_fflayer_tpl").Define("input_dim", 0, "");
  auto t0 = InstantiateLayer<TransformerLayer>(no_ff);
  EXPECT_TRUE(at::allclose(with_shift, t0->FProp(t0->theta(), y).first + 1.0, 1e-6, 1e-6));
}

TEST(Composition, StackTemplateListsFollowLingvo) {
  // A list of 2 templates over 4 layers: layers 0-1 use the first, 2-3 the second.
  Params stack = TransformerStack::Params();
  stack.Set("name", "s").Set("num_layers", 4).Set("mdl_dim", 8).Set("num_atten_heads", 2);
  Params relu = TransformerLayer::Params();
  relu.Set("tr_fflayer_tpl.hidden_dim", 16);
  Params gelu = relu.Copy();
  gelu.Set("tr_fflayer_tpl.activation", "GELU").Set("tr_fflayer_tpl.hidden_dim", 12);
  stack.Set("transformer_layer_params_tpl", ParamValue::List{relu, gelu});
  auto s = InstantiateLayer<TransformerStack>(stack);
  for (int i = 0; i < 4; ++i) {
    const BaseLayer& fc0 = s->GetDescendant(StrCat("x_layers[", i, "].fflayer.fc0"));
    EXPECT_EQ(fc0.params().GetString("activation"), i < 2 ? "RELU" : "GELU") << i;
    EXPECT_EQ(fc0.params().GetInt("output_dim"), i < 2 ? 16 : 12) << i;
  }
  // The stack's hidden_dim, when set, overrides every template's.
  stack.Set("hidden_dim", 20);
  auto s20 = InstantiateLayer<TransformerStack>(stack);
  EXPECT_EQ(s20->GetDescendant("x_layers[3].fflayer.fc0").params().GetInt("output_dim"), 20);
  // A list that does not divide num_layers.
  stack.Set("num_layers", 3);
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerStack>(stack), InvalidArgumentError,
                        "transformer_layer_params_tpl has 2 templates, which must divide "
                        "num_layers 3");
  // A list entry is reachable by its index in params text, and the text round-trips.
  stack.Set("num_layers", 4).Set("hidden_dim", 0);
  stack.FromText("transformer_layer_params_tpl[1].tr_fflayer_tpl.activation : 'RELU'\n");
  auto relu4 = InstantiateLayer<TransformerStack>(stack);
  EXPECT_EQ(relu4->GetDescendant("x_layers[3].fflayer.fc0").params().GetString("activation"),
            "RELU");
  Params back = stack.Copy();
  back.Set("transformer_layer_params_tpl[0].tr_fflayer_tpl.hidden_dim", 99);
  back.FromText(stack.ToText());
  EXPECT_EQ(back.ToText(), stack.ToText());
}

TEST(Composition, FinalLayerNormFollowsTheLayersNorm) {
  Params stack = TransformerStack::Params();
  stack.Set("name", "s").Set("num_layers", 2).Set("mdl_dim", 8).Set("num_atten_heads", 2);
  stack.Set("hidden_dim", 16);
  // Pre-norm layers leave the residual stream unnormalized: a final layer norm by default.
  EXPECT_TRUE(InstantiateLayer<TransformerStack>(stack)->vars().Has("final_ln"));
  // Post-norm layers end normalized: none by default (as before templates), one when asked.
  Params post = stack.Copy();
  post.Set("transformer_layer_params_tpl.tr_atten_tpl.pre_layer_norm", false);
  post.Set("transformer_layer_params_tpl.tr_fflayer_tpl.pre_layer_norm", false);
  auto s = InstantiateLayer<TransformerStack>(post);
  EXPECT_FALSE(s->vars().Has("final_ln"));
  at::Tensor y = s->FProp(s->theta(), at::randn({2, 3, 8}));
  // The last block (post-norm feed-forward) normalizes: zero mean over the model dimension.
  EXPECT_TRUE(at::allclose(y.mean(-1), at::zeros({2, 3}), 1e-5, 1e-5));
  post.Set("final_layer_norm", true);
  EXPECT_TRUE(InstantiateLayer<TransformerStack>(post)->vars().Has("final_ln"));
  stack.Set("final_layer_norm", false);
  EXPECT_FALSE(InstantiateLayer<TransformerStack>(stack)->vars().Has("final_ln"));
}

TEST(Composition, EverySublayerHasATemplate) {
  Params stack = TransformerStack::Params();
  stack.Set("name", "s").Set("num_layers", 1).Set("mdl_dim", 8).Set("num_atten_heads", 2);
  stack.Set("hidden_dim", 16).Set("input_dropout_prob", 0.1).Set("dropout_prob", 0.2);
  stack.FromText(
      "dropout_tpl.dropout_at_eval : True\n"
      "transformer_layer_params_tpl.tr_fflayer_tpl.fc_tpl.has_bias : True\n"
      "transformer_layer_params_tpl.tr_fflayer_tpl.dropout_tpl.dropout_at_eval : True\n"
      "transformer_layer_params_tpl.tr_atten_tpl.dropout_tpl.dropout_at_eval : True\n"
      "transformer_layer_params_tpl.tr_atten_tpl.atten_tpl.dropout_tpl.dropout_at_eval : True\n"
      "transformer_layer_params_tpl.tr_atten_tpl.atten_tpl.proj_tpl.params_init.scale : 0.25\n");
  auto s = InstantiateLayer<TransformerStack>(stack);
  EXPECT_TRUE(s->vars().Has("x_layers[0].fflayer.fc0.b"));
  // Each dropout took its template and its own keep_prob.
  for (const auto& [path, keep] : std::vector<std::pair<std::string, double>>{
           {"input_dropout", 0.9},
           {"x_layers[0].fflayer.relu_dropout", 0.8},
           {"x_layers[0].fflayer.residual_dropout", 0.8},
           {"x_layers[0].self_atten.residual_dropout", 0.8},
           {"x_layers[0].self_atten.atten.atten_dropout", 0.8}}) {
    const BaseLayer& d = s->GetDescendant(path);
    EXPECT_TRUE(d.params().GetBool("dropout_at_eval")) << path;
    EXPECT_NEAR(d.params().GetFloat("keep_prob"), keep, 1e-12) << path;
  }
  for (const char* proj : {"query", "key", "value", "post"}) {
    EXPECT_EQ(s->GetDescendant(StrCat("x_layers[0].self_atten.atten.", proj))
                  .params()
                  .GetFloat("params_init.scale"),
              0.25)
        << proj;
  }
  // The defaults build the same variables, initialized the same, as the fixed sublayers did:
  // a checkpoint written before the templates still loads (tests/tools/legacy_checkpoint_test.sh).
}

TEST(Composition, TemplatesOfTheWrongClassAreNamed) {
  Params stack = TransformerStack::Params();
  stack.Set("name", "s").Set("num_layers", 2).Set("mdl_dim", 8).Set("num_atten_heads", 2);
  stack.Set("hidden_dim", 16);
  Params wrong = stack.Copy();
  wrong.Set("transformer_layer_params_tpl",
            ParamValue::List{TransformerLayer::Params(), LayerNorm::Params()});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerStack>(wrong), InvalidArgumentError,
                        "transformer_layer_params_tpl[1] (glossa.layers.LayerNorm) has no "
                        "mask_self_atten field; use TransformerLayer Params");
  wrong = stack.Copy();
  wrong.Set("transformer_layer_params_tpl.tr_atten_tpl", TransformerFeedForwardLayer::Params());
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerStack>(wrong), InvalidArgumentError,
                        "tr_atten_tpl (glossa.layers.TransformerFeedForwardLayer) has no "
                        "is_masked field");
  wrong = stack.Copy();
  wrong.Set("transformer_layer_params_tpl.tr_fflayer_tpl", SequentialLayer::Params());
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerStack>(wrong), InvalidArgumentError,
                        "hidden_dim is set but transformer_layer_params_tpl.tr_fflayer_tpl has no "
                        "hidden_dim field");
  // Layers of different widths in one stack.
  Params narrow = TransformerLayer::Params();
  TransformerLayer::SetCanonicalShapeParams(narrow, 4, 8, 2);
  Params wide = narrow.Copy().Set("input_dim", 8);
  wrong = stack.Copy().Set("mdl_dim", 0).Set("hidden_dim", 0);
  wrong.Set("transformer_layer_params_tpl", ParamValue::List{narrow, wide});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerStack>(wrong), InvalidArgumentError,
                        "layer 1 has input_dim 8 but layer 0 has 4");
}

}  // namespace
}  // namespace glossa
