// The layers' side of the fused decoding step (glossa/layers/fused_step.cc): a float32
// TransformerDecoder stack stepped in inference runs one DecoderLayerStep per layer and step, and
// its outputs and caches agree with the unfused composition and with FProp over the whole
// sequence; configurations the kernel cannot express, training and GLOSSA_KERNELS=reference take
// the unfused steps.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/decoder_step.h"
#include "glossa/kernels/compute_plan.h"
#include "glossa/layers/transformer_stack.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

struct Stepped {
  std::vector<at::Tensor> outs;
  NestedMap states;
  int64_t fused_calls = 0;
};

// T steps of `dec` on y [B, T, D], the source projected once (what beam search does), the rows
// reordered after step 1 (a beam's parents) in both runs alike.
Stepped Step(const TransformerStack& dec, const at::Tensor& y, const at::Tensor& enc,
             const at::Tensor& enc_paddings) {
  const NestedMap theta = dec.theta();
  const NestedMap aux = dec.PrecomputeAux(theta, enc);
  Stepped r;
  r.states = dec.InitStates(y.size(0), at::kFloat);
  const int64_t before = FusedDecoderLayerSteps();
  for (int64_t t = 0; t < y.size(1); ++t) {
    auto [out, next] = dec.ExtendStepProjected(theta, y.select(1, t).contiguous(), r.states, aux,
                                               enc_paddings);
    r.outs.push_back(out);
    r.states = next;
  }
  r.fused_calls = FusedDecoderLayerSteps() - before;
  return r;
}

// The plan a Predictor would make at load for `policy`, set on dec.
void Plan(TransformerStack& dec, ComputePolicy policy) {
  dec.SetComputePlan(PlanInference(dec, policy));
}

std::unique_ptr<TransformerStack> Decoder(const std::string& extra) {
  return Make<TransformerStack>(
      TransformerDecoder::Params(),
      "num_layers : 2\nmdl_dim : 32\nnum_atten_heads : 2\nhidden_dim : 48\n" + extra);
}

TEST(FusedDecoderStep, AgreesWithTheUnfusedStepsAndFProp) {
  at::manual_seed(3);
  auto dec = Decoder("");
  const at::Tensor y = at::randn({3, 5, 32}), enc = at::randn({3, 4, 32});
  at::Tensor enc_paddings = at::zeros({3, 4});
  enc_paddings[1][3] = 1.0;
  enc_paddings[2][2] = enc_paddings[2][3] = 1.0;
  at::NoGradGuard no_grad;
  const Stepped fused = Step(*dec, y, enc, enc_paddings);
  if (KernelsForcedToReference()) {
    EXPECT_EQ(fused.fused_calls, 0) << "GLOSSA_KERNELS=reference keeps the unfused steps";
  } else {
    EXPECT_EQ(fused.fused_calls, 2 * 5) << "one DecoderLayerStep per layer and step";
  }
  Plan(*dec, {.fused_decoder_step = false});
  const Stepped unfused = Step(*dec, y, enc, enc_paddings);
  dec->SetComputePlan(nullptr);
  EXPECT_EQ(unfused.fused_calls, 0);
  const at::Tensor full =
      dec->FProp(dec->theta(), y.to(at::kDouble).to(at::kFloat), {}, enc, enc_paddings);
  for (int64_t t = 0; t < 5; ++t) {
    EXPECT_TRUE(at::allclose(fused.outs[t], unfused.outs[t], 1e-5, 1e-5)) << "step " << t;
    EXPECT_TRUE(at::allclose(fused.outs[t], full.select(1, t), 1e-4, 1e-5)) << "step " << t;
  }
  // The caches and row tables the steps leave are the unfused ones.
  const NestedMap& a = fused.states.GetItem("x_layers").AsList()[1].AsMap();
  const NestedMap& b = unfused.states.GetItem("x_layers").AsList()[1].AsMap();
  EXPECT_TRUE(at::equal(a.GetTensor("rows"), b.GetTensor("rows")));
  EXPECT_TRUE(at::equal(a.GetTensor("length"), b.GetTensor("length")));
  const at::Tensor ka = a.GetItem("unordered").AsMap().GetTensor("key").narrow(1, 0, 5);
  const at::Tensor kb = b.GetItem("unordered").AsMap().GetTensor("key").narrow(1, 0, 5);
  EXPECT_TRUE(at::allclose(ka, kb, 1e-5, 1e-5));
}

// What the kernel cannot express runs unfused, with the same answers: post layer norm, another
// activation, training (autograd on).
TEST(FusedDecoderStep, OtherConfigurationsAndModesTakeTheUnfusedSteps) {
  at::manual_seed(4);
  const at::Tensor y = at::randn({2, 3, 32}), enc = at::randn({2, 4, 32});
  const at::Tensor enc_paddings = at::zeros({2, 4});
  for (const char* extra :
       {"transformer_layer_params_tpl.tr_atten_tpl.pre_layer_norm : False",
        "transformer_layer_params_tpl.tr_fflayer_tpl.activation : 'SIGMOID'"}) {
    auto dec = Decoder(extra);
    at::NoGradGuard no_grad;
    const Stepped s = Step(*dec, y, enc, enc_paddings);
    EXPECT_EQ(s.fused_calls, 0) << extra;
    const at::Tensor full = dec->FProp(dec->theta(), y, {}, enc, enc_paddings);
    for (int64_t t = 0; t < 3; ++t) {
      EXPECT_TRUE(at::allclose(s.outs[t], full.select(1, t), 1e-4, 1e-5)) << extra;
    }
  }
  auto dec = Decoder("");
  EXPECT_EQ(Step(*dec, y, enc, enc_paddings).fused_calls, 0) << "autograd on: training";
}

// A plan made for decoding says once, at load, why its decoder layers cannot take the fused step:
// the reason and the first layer that gave it, one line for the layers that share it; a stack
// the kernel can express, a plan that turned the step off, and an encoder (which never steps)
// say nothing.
TEST(FusedDecoderStep, APlanSaysOnceWhyItsLayersDeclineTheFusedStep) {
  struct Case {
    const char* extra;
    const char* layer;  // the sub-layer that declines
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {"transformer_layer_params_tpl.tr_atten_tpl.pre_layer_norm : False",
            ".x_layers_0.cross_atten'", "post layer norm (pre_layer_norm False)"},
           {"transformer_layer_params_tpl.tr_fflayer_tpl.activation : 'SIGMOID'",
            ".x_layers_0.fflayer.fc0'", "activation SIGMOID"},
           {"transformer_layer_params_tpl.tr_fflayer_tpl.residual_dropout_prob : 0.1",
            ".x_layers_0.fflayer'", "a dropout that is not the identity"}}) {
    auto dec = Decoder(c.extra);
    const auto plan = PlanInference(*dec, {});
    ASSERT_EQ(plan->notes().size(), 1u) << c.extra;
    const std::string note = plan->notes()[0];
    EXPECT_EQ(note.rfind("fused decoder step declined: layer '", 0), 0u) << note;
    EXPECT_NE(note.find(c.layer), std::string::npos) << note;
    EXPECT_NE(note.find(c.why), std::string::npos) << note;
    EXPECT_NE(note.find("(and 1 more)"), std::string::npos) << "two layers, one line: " << note;
  }
  const std::vector<std::string> plain = PlanInference(*Decoder(""), {})->notes();
  if (KernelsForcedToReference()) {  // the mode's reason, after the configuration's
    ASSERT_EQ(plain.size(), 1u);
    EXPECT_NE(plain[0].find("GLOSSA_KERNELS=reference"), std::string::npos) << plain[0];
  } else {
    EXPECT_TRUE(plain.empty()) << plain[0];
  }
  EXPECT_TRUE(PlanInference(*Decoder("transformer_layer_params_tpl.tr_atten_tpl.pre_layer_norm : "
                                     "False"),
                            {.fused_decoder_step = false})
                  ->notes()
                  .empty());
  auto enc = Make<TransformerStack>(TransformerStack::Params(),
                                    "num_layers : 2\nmdl_dim : 32\nnum_atten_heads : 2\n"
                                    "hidden_dim : 48\n");
  EXPECT_TRUE(PlanInference(*enc, {})->notes().empty()) << "an encoder never steps";
  // The layer's own check: the configuration's reason first, then the mode's (autograd on).
  auto post = Decoder("transformer_layer_params_tpl.tr_atten_tpl.pre_layer_norm : False");
  auto plain_dec = Decoder("");
  const auto& post_layer = dynamic_cast<const TransformerLayer&>(post->GetDescendant("x_layers[1]"));
  const auto& layer = dynamic_cast<const TransformerLayer&>(plain_dec->GetDescendant("x_layers[1]"));
  std::string why = post_layer.FusedStepDeclined(post_layer.theta(), nullptr);
  EXPECT_NE(why.find(".x_layers_1.cross_atten': post layer norm"), std::string::npos) << why;
  why = layer.FusedStepDeclined(layer.theta(), nullptr);
  EXPECT_NE(why.find(".x_layers_1': autograd is on"), std::string::npos) << why;
  at::NoGradGuard no_grad;
  EXPECT_EQ(layer.FusedStepDeclined(layer.theta(), nullptr).empty(), !KernelsForcedToReference());
}

// What a plan cannot see at load, a step says once: decoding states of another dtype (bf16 caches
// here) decline the fused step in each layer, and the plan gets one note for them (logged when
// first met), the second layer counted. The unfused step leaves float32 caches, so the later
// steps are fused.
TEST(FusedDecoderStep, AStepSaysOnceWhatOnlyStepsMeet) {
  at::manual_seed(6);
  auto dec = Decoder("");
  const at::Tensor y = at::randn({2, 3, 32}), enc = at::randn({2, 4, 32});
  const at::Tensor enc_paddings = at::zeros({2, 4});
  at::NoGradGuard no_grad;
  Plan(*dec, {});
  const size_t at_load = dec->compute_plan()->notes().size();
  EXPECT_EQ(at_load, KernelsForcedToReference() ? 1u : 0u);
  const NestedMap theta = dec->theta();
  const NestedMap aux = dec->PrecomputeAux(theta, enc);
  NestedMap states = dec->InitStates(2, at::kBFloat16);
  const int64_t before = FusedDecoderLayerSteps();
  for (int64_t t = 0; t < 3; ++t) {
    states = dec->ExtendStepProjected(theta, y.select(1, t).contiguous(), states, aux,
                                      enc_paddings)
                 .second;
  }
  const std::vector<std::string> notes = dec->compute_plan()->notes();
  if (KernelsForcedToReference()) {  // the step never applies: nothing more to say
    EXPECT_EQ(FusedDecoderLayerSteps(), before);
    EXPECT_EQ(notes.size(), at_load);
    return;
  }
  EXPECT_EQ(FusedDecoderLayerSteps() - before, 2 * 2) << "the first step's bf16 caches: unfused";
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].rfind("fused decoder step declined at a step: layer '", 0), 0u) << notes[0];
  EXPECT_NE(notes[0].find(".x_layers_0.self_atten': its key cache is BFloat16"), std::string::npos)
      << notes[0];
  EXPECT_NE(notes[0].find("(and 1 more)"), std::string::npos) << "the second layer: " << notes[0];
  // A plan that turned the step off says nothing at its steps.
  Plan(*dec, {.fused_decoder_step = false});
  states = dec->InitStates(2, at::kBFloat16);
  dec->ExtendStepProjected(theta, y.select(1, 0).contiguous(), states, aux, enc_paddings);
  EXPECT_TRUE(dec->compute_plan()->notes().empty());
}

// An int8 plan: the fused step's projections run in int8 on the weights the plan quantized at
// load, the ones the unfused steps' FProp reads, so it agrees with the unfused int8 steps.
TEST(FusedDecoderStep, Int8InferenceRunsFusedWithTheSameQuantizedWeights) {
  at::manual_seed(5);
  auto dec = Decoder("");
  const at::Tensor y = at::randn({3, 4, 32}), enc = at::randn({3, 5, 32});
  const at::Tensor enc_paddings = at::zeros({3, 5});
  at::NoGradGuard no_grad;
  Plan(*dec, {.precision = Precision::kInt8});
  const Stepped fused = Step(*dec, y, enc, enc_paddings);
  Plan(*dec, {.precision = Precision::kInt8, .fused_decoder_step = false});
  const Stepped unfused = Step(*dec, y, enc, enc_paddings);
  dec->SetComputePlan(nullptr);
  EXPECT_EQ(fused.fused_calls, KernelsForcedToReference() ? 0 : 2 * 4);
  const Stepped fp32 = Step(*dec, y, enc, enc_paddings);
  for (int64_t t = 0; t < 4; ++t) {
    EXPECT_TRUE(at::allclose(fused.outs[t], unfused.outs[t], 1e-4, 1e-4)) << "step " << t;
    // int8 is not float32: the quantization shows in the outputs.
    EXPECT_FALSE(at::equal(fused.outs[t], fp32.outs[t])) << "step " << t;
    EXPECT_TRUE(at::allclose(fused.outs[t], fp32.outs[t], 0.1, 0.1)) << "step " << t;
  }
}

// A bf16 plan: the fused step's projections read the weights rounded to bf16 at load, the ones
// the unfused steps' FProp reads too. With every projection weight rounded to bf16 beforehand, a
// batch-invariant float32 plan (PackedAffine on those values) gives the same bits.
TEST(FusedDecoderStep, Bf16WeightsAreTheRoundedWeightsOnEveryPath) {
  at::manual_seed(6);
  auto dec = Decoder("");
  const at::Tensor y = at::randn({3, 4, 32}), enc = at::randn({3, 5, 32});
  const at::Tensor enc_paddings = at::zeros({3, 5});
  at::NoGradGuard no_grad;
  Plan(*dec, {.precision = Precision::kBf16, .batch_invariant = true});
  const Stepped fused = Step(*dec, y, enc, enc_paddings);
  Plan(*dec, {.precision = Precision::kBf16, .fused_decoder_step = false});
  const Stepped unfused = Step(*dec, y, enc, enc_paddings);
  dec->SetComputePlan(nullptr);
  EXPECT_EQ(fused.fused_calls, KernelsForcedToReference() ? 0 : 2 * 4);
  const Stepped fp32 = Step(*dec, y, enc, enc_paddings);
  // The projection weights (every 2-D and 3-D variable named w) rounded to bf16 in place.
  int rounded = 0;
  for (const auto& [key, v] : dec->theta().FlattenItems()) {
    const at::Tensor& t = v.AsTensor();
    if (t.dim() >= 2 && (key == "w" || (key.size() > 2 && key.substr(key.size() - 2) == ".w"))) {
      t.copy_(t.to(at::kBFloat16).to(at::kFloat));
      ++rounded;
    }
  }
  EXPECT_EQ(rounded, 2 * 10) << "a layer's q, k, v, post, cross q, k, v, post, fc0 and fc1";
  Plan(*dec, {.batch_invariant = true});
  const Stepped fp32_rounded = Step(*dec, y, enc, enc_paddings);
  dec->SetComputePlan(nullptr);
  for (int64_t t = 0; t < 4; ++t) {
    if (!KernelsForcedToReference()) {
      EXPECT_TRUE(SameBits(fused.outs[t], fp32_rounded.outs[t])) << "step " << t;
    }
    EXPECT_TRUE(at::allclose(fused.outs[t], unfused.outs[t], 1e-4, 1e-4)) << "step " << t;
    EXPECT_FALSE(at::equal(fused.outs[t], fp32.outs[t])) << "step " << t;
    EXPECT_TRUE(at::allclose(fused.outs[t], fp32.outs[t], 0.05, 0.05)) << "step " << t;
  }
}

}  // namespace
}  // namespace glossa
