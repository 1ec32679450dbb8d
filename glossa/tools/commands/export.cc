// `glossa export`: an inference bundle (docs/inference.md) from a checkpoint of <logdir>/train,
// the model built as it was trained (<logdir>/control/params.txt).
#include <CLI/CLI.hpp>

#include <iostream>

#include "glossa/base/file.h"
#include "glossa/inference/bundle.h"
#include "glossa/checkpoint/saver.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

class ExportCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand(
        "export", "Write an inference bundle (docs/inference.md) from a checkpoint of <logdir>/train.");
    AddModelFlags(c, f_, true, "Train");
    AddFollowerFlags(c, f_);
    c->add_option("--checkpoint", f_.checkpoint,
                  "The checkpoint prefix to export (default: the latest).");
    c->add_option("--subgraphs", subgraphs_,
                  "Subgraphs to export, comma-separated (default: all the task declares).")
        ->delimiter(',');
    c->add_option("--out", out_, "The bundle directory (new or empty).")->required();
    c->add_option("--dtype", dtype_, "Weights: float32 or bfloat16.")->capture_default_str();
    c->add_flag("--torchscript", torchscript_,
                "Also write torchscript/network.pt (ids to log-probs) for torch.jit.load.");
    c->add_flag("--onnx", onnx_,
                "Also write onnx/<network>.onnx (opset 17) for ONNX Runtime and other engines.");
    c->add_option("--quantize", quantize_,
                  "none, int8: the Predictor runs the projections in int8 (weights per output "
                  "channel, activations per row at run time), or bf16: on the weights rounded "
                  "to bf16 at load, activations and sums in float32 (float32 dtype only).")
        ->capture_default_str();
    return c;
  }

  int Run(const CommandContext&) override {
    ModelFlags f = f_;
    f.checkpoint.clear();  // not an eval override here
    const Params p = ModelParamsFromFlags(f);
    const std::string ckpt = ResolveCheckpoint(f_.checkpoint, JoinPath(f.logdir, "train"));
    const int64_t step =
        ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = out_, .dtype = dtype_,
                      .subgraphs = subgraphs_, .torchscript = torchscript_, .onnx = onnx_,
                      .quantize = quantize_,
                      .log = [](const std::string& l) { std::cout << l << std::endl; }});
    std::cout << "exported " << ckpt << " (step " << step << ") to " << out_ << "\n";
    return 0;
  }

 private:
  ModelFlags f_;
  std::string out_, dtype_ = "float32", quantize_ = "none";
  std::vector<std::string> subgraphs_;
  bool torchscript_ = false;
  bool onnx_ = false;
};
GLOSSA_REGISTER_COMMAND(ExportCommand, 80);

}  // namespace
}  // namespace cli
}  // namespace glossa
