// TransformerStack: the decoder's incremental steps and the encoder's variables.
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
#include "glossa/layers/transformer_stack.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

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

// The same decoder driven only through the StepLayer interface (what the tasks use): the source
// projected once into the context, every layer stepped through it; bit for bit the typed steps.
TEST(TransformerStack, DecodingThroughStepLayerMatchesTheTypedSteps) {
  auto dec = Make<TransformerStack>(TransformerDecoder::Params(),
                                    "num_layers : 2\nmdl_dim : 8\nnum_atten_heads : 2\n"
                                    "hidden_dim : 16\ndtype : float64");
  at::Tensor y = at::randn({2, 4, 8}, at::kDouble), enc = at::randn({2, 3, 8}, at::kDouble);
  at::Tensor enc_paddings = at::zeros({2, 3}, at::kDouble);
  enc_paddings[1][2] = 1.0;
  const NestedMap theta = dec->theta();
  const StepLayer& step = *dec;
  const NestedMap context = step.PrecomputeContext(theta, enc, enc_paddings);
  NestedMap states = step.InitStates(2, at::kDouble), typed_states = states;
  for (int64_t t = 0; t < 4; ++t) {
    auto [out, next] = step.ExtendStep(theta, y.select(1, t), states, context);
    auto [want, typed_next] = dec->ExtendStep(theta, y.select(1, t), typed_states, enc, enc_paddings);
    EXPECT_TRUE(at::equal(out, want)) << "step " << t;
    states = next;
    typed_states = typed_next;
  }
  // A decoder with cross-attention needs the source: a step without a context names it.
  const TransformerLayer& layer = dynamic_cast<const TransformerLayer&>(*dec->GetChildren("x_layers")[0]);
  const StepLayer& one = layer;
  EXPECT_ERROR_CONTAINS(one.ExtendStep(layer.theta(), y.select(1, 0), one.InitStates(2, at::kDouble), {}),
                        InvalidArgumentError, "has_aux_atten needs a context with aux");
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

// Packed inputs (Lingvo's segment mask): two target sequences (3 and 4 steps) and their sources
// (2 and 3) share one row each side, with a padded step at the end of each row. Every segment's
// outputs are what the sequence gives alone, in the causal decoder with cross-attention and in
// the encoder; in float64 (the reference attention) and float32 (the native core, with its causal
// blocks). Without the segment ids the outputs differ (the check can fail).
void ExpectPackedEqualsAlone(const std::string& dtype, double tol) {
  const at::ScalarType st = dtype == "float64" ? at::kDouble : at::kFloat;
  const std::string shape = "num_layers : 2\nmdl_dim : 8\nnum_atten_heads : 2\nhidden_dim : 16\n";
  auto dec = Make<TransformerStack>(TransformerDecoder::Params(), shape + "dtype : " + dtype);
  auto enc = Make<TransformerStack>(TransformerEncoder::Params(), shape + "dtype : " + dtype);
  const auto opts = at::TensorOptions().dtype(st);
  const at::Tensor ya = at::randn({1, 3, 8}, opts), yb = at::randn({1, 4, 8}, opts);
  const at::Tensor sa = at::randn({1, 2, 8}, opts), sb = at::randn({1, 3, 8}, opts);
  const at::Tensor y = at::cat({ya, yb, at::randn({1, 1, 8}, opts)}, 1);
  const at::Tensor src = at::cat({sa, sb, at::randn({1, 1, 8}, opts)}, 1);
  const at::Tensor y_pad = at::tensor({0, 0, 0, 0, 0, 0, 0, 1}, opts).view({1, 8});
  const at::Tensor src_pad = at::tensor({0, 0, 0, 0, 0, 1}, opts).view({1, 6});
  const at::Tensor y_seg = at::tensor({1, 1, 1, 2, 2, 2, 2, 0}, at::kLong).view({1, 8});
  const at::Tensor src_seg = at::tensor({1, 1, 2, 2, 2, 0}, at::kLong).view({1, 6});

  const at::Tensor packed = dec->FProp(dec->theta(), y, y_pad, src, src_pad, y_seg, src_seg);
  const at::Tensor alone_a = dec->FProp(dec->theta(), ya, {}, sa, {});
  const at::Tensor alone_b = dec->FProp(dec->theta(), yb, {}, sb, {});
  EXPECT_TRUE(at::allclose(packed.slice(1, 0, 3), alone_a, tol, tol)) << dtype;
  EXPECT_TRUE(at::allclose(packed.slice(1, 3, 7), alone_b, tol, tol)) << dtype;
  EXPECT_TRUE(at::isfinite(packed).all().item<bool>());
  const at::Tensor unpacked = dec->FProp(dec->theta(), y, y_pad, src, src_pad);
  EXPECT_FALSE(at::allclose(unpacked.slice(1, 3, 7), alone_b, tol, tol)) << dtype;

  const at::Tensor enc_packed = enc->FProp(enc->theta(), src, src_pad, {}, {}, src_seg);
  EXPECT_TRUE(at::allclose(enc_packed.slice(1, 0, 2), enc->FProp(enc->theta(), sa), tol, tol));
  EXPECT_TRUE(at::allclose(enc_packed.slice(1, 2, 5), enc->FProp(enc->theta(), sb), tol, tol));

  // Bad segment ids are refused naming the shapes; so is a decoder given one side's only.
  EXPECT_ERROR_CONTAINS(enc->FProp(enc->theta(), src, src_pad, {}, {}, src_seg.slice(1, 0, 5)),
                        InvalidArgumentError, "segment ids must be integer tensors [B, T] = [1, 6]");
  EXPECT_ERROR_CONTAINS(dec->FProp(dec->theta(), y, y_pad, src, src_pad, y_seg),
                        InvalidArgumentError, "needs both segment_ids and aux_segment_ids");
  if (st != at::kDouble) return;
  // A pipelined stack refuses packed inputs, naming the setting to change.
  auto piped = Make<TransformerStack>(TransformerStack::Params(),
                                      shape + "mask_self_atten : True\nsplits : 2\n"
                                              "num_micro_batches : 1\ndtype : float64");
  EXPECT_ERROR_CONTAINS(piped->FProp(piped->theta(), y, y_pad, {}, {}, y_seg),
                        FailedPreconditionError, "set the input's packed_input to False");
}

TEST(TransformerStack, PackedSegmentsComputeWhatEachSequenceComputesAlone) {
  ExpectPackedEqualsAlone("float64", 1e-10);
  ExpectPackedEqualsAlone("float32", 2e-5);
}

}  // namespace
}  // namespace glossa
