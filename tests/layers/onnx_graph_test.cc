#include "glossa/layers/onnx_graph.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/conv.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/onnx_export.h"
#include "glossa/layers/torchscript.h"
#include "glossa/layers/torchscript_export.h"
#include "glossa/layers/transformer_stack.h"
#include "tests/inference/onnx_runtime.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

std::string TempPath(const std::string& name) {
  // This process's own directory: unit_tests and unit_tests_reference_kernels run at once, and
  // would otherwise write and read each other's graphs.
  static const std::string dir = glossa::testing::TempDir("onnx_graph_test");
  return dir + "/" + name;
}

// A stack of pre-layer-norm Transformer layers (causal or not), its ONNX graph in ONNX Runtime
// against its FProp, with padded positions: every layer's emitter (attention with per-dim scale,
// layer norm, ReLU feed-forward with its paddings, the final layer norm) at once.
void CheckStack(bool causal, const std::string& text) {
  auto stack = Make<TransformerStack>(
      TransformerStack::Params(),
      StrCat("num_layers : 2\nmdl_dim : 8\nhidden_dim : 16\nnum_atten_heads : 2\n"
             "mask_self_atten : ", causal ? "True" : "False", "\n", text));
  at::manual_seed(3);
  const at::Tensor x = at::randn({3, 5, 8});
  at::Tensor paddings = at::zeros({3, 5});
  paddings[1].narrow(0, 3, 2).fill_(1);
  paddings[2][4] = 1;
  at::Tensor want;
  {
    at::NoGradGuard no_grad;
    EvalModeScope eval;
    want = stack->FProp(stack->theta(), x, paddings).to(at::kDouble);
  }
  OnnxGraph g("stack");
  const std::string in = g.Input("x", at::kFloat, {"B", "T", "8"});
  g.SetPaddings(g.Input("paddings", at::kFloat, {"B", "T"}));
  g.Output(EmitOnnx(*stack, g, in, "stack."), "y", at::kFloat, {"B", "T", "8"});
  const std::string path = TempPath(StrCat("stack", causal, ".onnx"));
  g.Save(path);
  const auto got = RunOnnxRuntime(path, {{"x", x}, {"paddings", paddings}}, path + ".json");
  ASSERT_EQ(got.count("y"), 1u);
  ASSERT_EQ(got.at("y").sizes(), want.sizes());
  // Real positions only: padded queries differ by design (nothing reads them).
  const at::Tensor real = (paddings < 0.5).unsqueeze(-1).expand_as(want);
  const double err =
      (got.at("y") - want).abs().masked_select(real).max().item<double>();
  EXPECT_LE(err, 1e-5) << "largest difference " << err;
}

TEST(OnnxGraph, EncoderStackInOnnxRuntimeMatchesFProp) { CheckStack(false, ""); }

TEST(OnnxGraph, CausalStackWithoutPerDimScaleMatchesFProp) {
  CheckStack(true, "transformer_layer_params_tpl.tr_atten_tpl.atten_tpl.enable_per_dim_scale : "
                   "False\n");
}

TEST(OnnxGraph, CheckerRefusesABrokenGraphAsAnExporterBug) {
  OnnxGraph g("broken");
  const std::string x = g.Input("x", at::kFloat, {"B"});
  g.Output(g.Op("NoSuchOperator", {x}), "y", at::kFloat, {"B"});
  EXPECT_ERROR_CONTAINS(g.Save(TempPath("broken.onnx")), InternalError,
                        "graph 'broken' fails onnx's checker");
  EXPECT_FALSE(std::filesystem::exists(TempPath("broken.onnx")));
  // A shape that contradicts the declared one fails strict shape inference.
  OnnxGraph h("shapes");
  const std::string a = h.Input("a", at::kFloat, {"2", "3"});
  h.Output(h.Op("Transpose", {a}), "b", at::kFloat, {"2", "3"});
  EXPECT_ERROR_CONTAINS(h.SerializeChecked(), InternalError, "graph 'shapes' fails");
  EXPECT_ERROR_CONTAINS(h.Get("self_bias"), InternalError, "'self_bias' was not set");
}

// A projection whose FProp differs from its base's: the export must not write its base's forward.
class DoubledProjection : public ProjectionLayer {
 public:
  static glossa::Params Params() {
    glossa::Params p = ProjectionLayer::Params();
    p.Set("cls", ClsOf<DoubledProjection>());
    return p;
  }
  explicit DoubledProjection(const glossa::Params& p) : ProjectionLayer(p) {}
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& x) const {
    return 2 * ProjectionLayer::FProp(theta, x);
  }
};
GLOSSA_REGISTER_CLASS(DoubledProjection, "glossa.testing.DoubledProjection");

// The export rooms (glossa/layers/onnx_export.h, torchscript_export.h) go by a layer's exact
// class: one without an emitter is refused naming its class, also when its base class has one.
TEST(OnnxGraph, LayersWithoutAnExportAreUnimplementedNamingTheirClass) {
  auto conv = Make<Conv2DLayer>(Conv2DLayer::Params(),
                                "filter_shape : [3, 3, 1, 2]\nfilter_stride : [1, 1]");
  OnnxGraph g("conv");
  EXPECT_ERROR_CONTAINS(EmitOnnx(*conv, g, g.Input("x", at::kFloat, {"1"}), "c"),
                        UnimplementedError,
                        "--onnx: layer 'layer': its class glossa::Conv2DLayer is not covered by "
                        "the ONNX export");
  TorchScriptWriter w;
  EXPECT_ERROR_CONTAINS(EmitTorchScript(*conv, w, "x", "y", "c"), UnimplementedError,
                        "its class glossa::Conv2DLayer is not covered");

  const std::string dims = "input_dim : 4\noutput_dim : 3\nhas_bias : True\nactivation : 'NONE'";
  auto doubled = Make<DoubledProjection>(DoubledProjection::Params(), dims);
  EXPECT_ERROR_CONTAINS(EmitOnnx(*doubled, g, "x", "d"), UnimplementedError,
                        "its class glossa::(anonymous namespace)::DoubledProjection is not covered");
  EXPECT_ERROR_CONTAINS(EmitTorchScript(*doubled, w, "x", "y", "d"), UnimplementedError,
                        "DoubledProjection is not covered by the TorchScript export");
  // Its base class exports.
  auto plain = Make<ProjectionLayer>(ProjectionLayer::Params(), dims);
  OnnxGraph h("projection");
  EXPECT_FALSE(EmitOnnx(*plain, h, h.Input("x", at::kFloat, {"2", "4"}), "p").empty());
  EmitTorchScript(*plain, w, "x", "y", "p");
  EXPECT_NE(w.code().find("torch.addmm"), std::string::npos) << w.code();

  auto post = Make<TransformerAttentionLayer>(TransformerAttentionLayer::Params(),
                                              "input_dim : 4\nnum_heads : 2\npre_layer_norm : False");
  EXPECT_ERROR_CONTAINS(EmitOnnx(*post, g, "x", "p"), UnimplementedError,
                        "post-layer-norm attention is not covered by the ONNX export");
}

}  // namespace
}  // namespace glossa
