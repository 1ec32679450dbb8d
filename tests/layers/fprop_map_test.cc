// The uniform call (BaseLayer::FPropMap): named inputs to named outputs for every kind of layer,
// the same values as the typed FProp overloads, and clear errors for wrong inputs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "glossa/layers/attention.h"
#include "glossa/layers/block.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/rnn.h"
#include "glossa/layers/transformer.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

NestedMap Inputs(std::initializer_list<std::pair<const char*, NestedValue>> items) {
  NestedMap m;
  for (const auto& [k, v] : items) m.Put(k, v);
  return m;
}

TEST(FPropMap, ProjectionGivesWhatFPropGives) {
  auto layer = Make<ProjectionLayer>(ProjectionLayer::Params(),
                                          "input_dim : 4\noutput_dim : 3\nactivation : 'RELU'");
  const at::Tensor x = at::randn({5, 4});
  const at::Tensor p = (at::rand({5, 1}) > 0.5).to(at::kFloat);
  const NestedMap out = layer->FPropMap(layer->theta(), Inputs({{"inputs", x}, {"paddings", p}}));
  EXPECT_TRUE(at::equal(out.GetTensor("outputs"), layer->FProp(layer->theta(), x, p)));
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(layer->FPropMapSignatureText(),
            "FProp(theta, inputs, paddings=None) -> Tensor  [ProjectionLayer]");
}

TEST(FPropMap, AttentionTakesFlagsAndGivesBothOutputs) {
  auto layer = Make<MultiHeadedAttention>(MultiHeadedAttention::Params(),
                                               "input_dim : 8\nhidden_dim : 8\nnum_heads : 2");
  const at::Tensor q = at::randn({2, 3, 8});
  const NestedMap out = layer->FPropMap(
      layer->theta(), Inputs({{"query", q}, {"key", q}, {"value", q}, {"causal", true}}));
  auto [context, probs] = layer->FProp(layer->theta(), q, q, q, {}, /*causal=*/true);
  EXPECT_TRUE(at::equal(out.GetTensor("context"), context));
  EXPECT_TRUE(at::equal(out.GetTensor("probs"), probs));
  EXPECT_EQ(out.GetTensor("probs")[0][0][0][2].item<float>(), 0.0f);  // causal
}

TEST(FPropMap, RecurrentAndPositionalLayersPassStructuredValues) {
  auto rnn = Make<RNNLayer>(RNNLayer::Params(),
                                 "cell.num_input_nodes : 3\ncell.num_output_nodes : 4");
  const at::Tensor x = at::randn({5, 2, 3});
  const NestedMap out = rnn->FPropMap(rnn->theta(), Inputs({{"inputs", x}}));
  auto [y, state] = rnn->FProp(rnn->theta(), x);
  EXPECT_TRUE(at::equal(out.GetTensor("outputs"), y));
  EXPECT_TRUE(at::equal(out.at("final_state").AsMap().GetTensor("m"), state.GetTensor("m")));

  auto pos = Make<PositionalEmbeddingLayer>(PositionalEmbeddingLayer::Params(),
                                                 "embedding_dim : 6");
  const NestedMap by_length =
      pos->FPropMap(pos->theta(), Inputs({{"seq_length_or_position", int64_t{4}}}));
  EXPECT_TRUE(at::equal(by_length.GetTensor("outputs"), pos->FProp(pos->theta(), 4)));
}

TEST(FPropMap, ABlockWithoutItsOwnCallUsesTheBlockShape) {
  Params seq = SequentialLayer::Params();
  seq.Set("name", "seq").Set("sub", ParamValue::List{LayerNorm::Params().Set("input_dim", 3)});
  auto layer = InstantiateLayer<SequentialLayer>(seq);
  const at::Tensor x = at::randn({2, 4, 3});
  const NestedMap out = layer->FPropMap(layer->theta(), Inputs({{"x", x}}));
  EXPECT_TRUE(at::equal(out.GetTensor("outputs"), layer->FProp(layer->theta(), x, {})));
  EXPECT_EQ(layer->FPropMapSignatureText(),
            "FProp(theta, x, paddings=None) -> Tensor  [SequentialLayer]");
}

TEST(FPropMap, WrongInputsAreErrorsNamingTheLayerAndKey) {
  Params tl = TransformerLayer::Params();
  TransformerLayer::SetCanonicalShapeParams(tl, 8, 16, 2);
  auto layer = Make<TransformerLayer>(tl, "");
  const at::Tensor x = at::randn({2, 3, 8});
  EXPECT_ERROR_CONTAINS(layer->FPropMap(layer->theta(), Inputs({{"input", x}})),
                        InvalidArgumentError, "unexpected input input (did you mean");
  EXPECT_ERROR_CONTAINS(layer->FPropMap(layer->theta(), Inputs({{"paddings", at::zeros({2, 3})}})),
                        InvalidArgumentError, "missing input 'inputs'");
  const NestedMap out = layer->FPropMap(layer->theta(), Inputs({{"inputs", x}}));
  auto [y, probs] = layer->FProp(layer->theta(), x, {}, {}, {});
  EXPECT_TRUE(at::equal(out.GetTensor("outputs"), y));
  EXPECT_TRUE(at::equal(out.GetTensor("atten_probs"), probs));
}

// A layer that is not a Block and declares no uniform call.
class Opaque : public BaseLayer {
 public:
  static glossa::Params Params() { return BaseLayer::Params().Set("cls", ClsOf<Opaque>()); }
  explicit Opaque(const glossa::Params& p) : BaseLayer(p) {}
};
GLOSSA_REGISTER_CLASS(Opaque, "glossa.testing.Opaque");

TEST(FPropMap, ALayerWithoutAUniformCallIsUnimplemented) {
  auto layer = InstantiateLayer<Opaque>(Opaque::Params().Set("name", "o"));
  EXPECT_EQ(layer->FPropMapSignatureText(), "");
  EXPECT_ERROR_CONTAINS(layer->FPropMap(layer->theta(), NestedMap()), UnimplementedError,
                        "layer 'o' (Opaque) has no uniform call");
}

}  // namespace
}  // namespace glossa
