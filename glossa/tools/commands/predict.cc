// `glossa predict`: a bundle's subgraph over lines of stdin or --input, JSON lines of fetches to
// stdout or --output (glossa/inference/predict_lines.h).
#include <CLI/CLI.hpp>
#include <glog/logging.h>

#include <sys/stat.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/inference/predict_lines.h"
#include "glossa/inference/predictor.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

// An --output that is the input (the same file, through any name or link; the input may be stdin)
// would be truncated before its lines are read: refused before anything is opened for writing.
void RefuseOutputOverInput(const std::string& input, const std::string& output) {
  struct stat out_st {};
  if (output.empty() || ::stat(output.c_str(), &out_st) != 0) return;  // stdout, or a new file
  struct stat in_st {};
  const bool have_in =
      input.empty() ? ::fstat(0, &in_st) == 0 : ::stat(input.c_str(), &in_st) == 0;
  if (have_in && in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino) {
    throw InvalidArgumentError(StrCat(
        "--output '", output, "' is ",
        input.empty() ? "the file on standard input" : StrCat("the --input file '", input, "'"),
        " (the same device and inode): writing it would destroy the lines before they are read; "
        "give another --output"));
  }
}

class PredictCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand(
        "predict", "Run an inference bundle's subgraph on JSON lines (or text lines) from stdin or "
                   "--input; JSON lines of fetches to stdout or --output.");
    c->add_option("--bundle", bundle_, "The bundle directory (glossa export).")->required();
    c->add_option("--subgraph", o_.subgraph, "The subgraph to run.")->capture_default_str();
    c->add_option("--input", input_, "Input file (default: stdin).");
    c->add_option("--output", output_, "Output file (default: stdout).");
    AddIntFlag(c, "--batch_size", o_.batch_size, 1, 65536, "Lines run together (default 32).");
    AddIntFlag(c, "--sort_window", o_.sort_window, 0, 1 << 20,
               "Lines read ahead and sorted by length (tokens) before they are cut into batches, "
               "so that a batch pads little (Marian's maxi-batch); answers keep the input's "
               "order. 0: batches in input order (default).");
    AddIntFlag(c, "--max_batch_tokens", o_.max_batch_tokens, 0, int64_t{1} << 30,
               "A batch's rows x its longest line's tokens at most this (CTranslate2's token "
               "batches); a longer line runs alone. 0: no budget (default).");
    c->add_option("--input_format", o_.input_format,
                  "text: each line is the subgraph's one string feed; json: each line is a JSON "
                  "object of feeds; auto: lines starting with '{' are JSON.")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "text", "json"}));
    AddIntFlag(c, "--max_line_bytes", o_.max_line_bytes, 1, int64_t{1} << 30,
               "A longer input line is an error naming it (default 1 MiB).");
    AddKernelFlags(c, kernels_);
    c->add_option("--precision", precision_,
                  "float32, int8 (weights quantized per output channel at load) or bf16 "
                  "(weights rounded to bf16 at load, float32 activations); default: the "
                  "bundle's (int8 or bf16 when exported with --quantize=int8 or bf16).")
        ->check(CLI::IsMember({"float32", "int8", "bf16"}));
    c->add_flag("--batch_invariant", batch_invariant_,
                "Batch-invariant kernels: a line's answer has the same bits whatever lines share "
                "its batch (what glossa serve runs by default).");
    AddIntFlag(c, "--max_new_tokens", max_new_tokens_, 0, 1 << 20,
               "A line asking a generation for more new tokens is an error (default 512).");
    return c;
  }

  int Run(const CommandContext&) override {
    RefuseOutputOverInput(input_, output_);
    // A reader that goes away (`glossa predict | head`) makes the next write fail with EPIPE,
    // which stops the run with an error and exit status 1, not a silent death by SIGPIPE.
    std::signal(SIGPIPE, SIG_IGN);
    ApplyKernelFlags(kernels_);
    ConfigureCpuRuntime(0, false, CpuWorkload::kInference);  // as glossa serve
    PredictorOptions po;
    po.subgraphs = {o_.subgraph};
    po.max_new_tokens = max_new_tokens_;
    po.precision = precision_;
    po.batch_invariant = batch_invariant_;
    const Predictor predictor(bundle_, po);
    LOG(INFO) << "compute: " << predictor.policy().ToString() << " ("
              << predictor.prepared_weights() << " weights prepared at load)";
    for (const std::string& note : predictor.plan_notes()) LOG(WARNING) << "compute: " << note;
    std::ifstream in_file;
    if (!input_.empty()) {
      CheckRegularFile(input_, "--input");
      in_file.open(input_);
      o_.input_name = input_;
    }
    std::ofstream out_file;
    if (!output_.empty()) {
      out_file.open(output_, std::ios::trunc);
      if (!out_file) throw AbortedError(StrCat("--output: cannot write '", output_, "'"));
      o_.output_name = StrCat("'", output_, "'");
    }
    PredictLines(predictor, input_.empty() ? std::cin : in_file,
                 output_.empty() ? std::cout : out_file, o_);
    // A close that fails (the last buffer on a full disk) fails the run too.
    errno = 0;
    if (out_file.is_open()) {
      out_file.close();
      if (out_file.fail()) {
        throw AbortedError(StrCat("cannot close ", o_.output_name, ": ",
                                  errno != 0 ? std::strerror(errno) : "write error"));
      }
    } else if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      throw AbortedError(StrCat("cannot write stdout: ", std::strerror(errno)));
    }
    return 0;
  }

 private:
  std::string bundle_, input_, output_;
  PredictLinesOptions o_;
  int64_t max_new_tokens_ = 512;
  std::string precision_;
  bool batch_invariant_ = false;
  KernelFlags kernels_;
};
GLOSSA_REGISTER_COMMAND(PredictCommand, 100);

}  // namespace
}  // namespace cli
}  // namespace glossa
