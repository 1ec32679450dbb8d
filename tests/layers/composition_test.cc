// Layers composed from nested Params: a small model trained one step, every registered layer built under stubs, user Blocks in containers, templates, and the guides' compiled examples.
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
