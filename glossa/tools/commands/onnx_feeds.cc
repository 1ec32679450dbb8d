// `glossa onnx_feeds`: the feeds of a bundle's ONNX network (glossa export --onnx) for lines of
// text, tokenized by the bundle's own tokenizer, as one JSON object
// {"<input>": {"type": "int64" | "float32", "dims": [..], "data": [..]}, ...}: what
// bench/onnx/ort_run.js reads, and what any ONNX Runtime binding takes once each entry is an array
// of `dims` (numpy: np.array(f["data"], dtype=f["type"]).reshape(f["dims"])).
#include <CLI/CLI.hpp>

#include <ATen/ATen.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/inference/bundle.h"
#include "glossa/tools/command.h"

namespace glossa {
namespace cli {
namespace {

nlohmann::json Feed(const at::Tensor& t) {
  nlohmann::json f;
  const at::Tensor c = t.contiguous();
  f["dims"] = c.sizes().vec();
  if (c.scalar_type() == at::kLong) {
    f["type"] = "int64";
    f["data"] = std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  } else {
    const at::Tensor x = c.to(at::kFloat);
    f["type"] = "float32";
    f["data"] = std::vector<float>(x.data_ptr<float>(), x.data_ptr<float>() + x.numel());
  }
  return f;
}

class OnnxFeedsCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand(
        "onnx_feeds",
        "The feeds of a bundle's ONNX network (glossa export --onnx) for lines of text from stdin "
        "or --input, as JSON (the format of bench/onnx/ort_run.js).");
    c->add_option("--bundle", bundle_, "The bundle directory (glossa export --onnx).")->required();
    c->add_option("--graph", graph_,
                  "lm_score (an LM's; ids, labels, paddings) or mt_encoder (an MT model's; "
                  "src_ids, src_paddings); default: the one the bundle has.");
    c->add_option("--input", input_, "Text lines (default: stdin).");
    c->add_option("--output", output_, "The JSON file (default: stdout).");
    return c;
  }

  int Run(const CommandContext&) override {
    const LoadedBundle b = LoadBundle(bundle_);
    const std::string dir = JoinPath(bundle_, "onnx");
    if (graph_.empty()) {
      for (const char* g : {"lm_score", "mt_encoder"}) {
        if (graph_.empty() && FileExists(JoinPath(dir, StrCat(g, ".onnx")))) graph_ = g;
      }
      if (graph_.empty()) {
        throw NotFoundError(StrCat("onnx_feeds: bundle '", bundle_,
                                   "' has no onnx/lm_score.onnx or onnx/mt_encoder.onnx: export "
                                   "it with glossa export --onnx"));
      }
    }
    if (graph_ == "mt_decoder_step") {
      throw InvalidArgumentError(
          "onnx_feeds: mt_decoder_step is run by a search, one step at a time: its caches are "
          "the previous step's outputs, reordered by the hypotheses kept (docs/inference.md); "
          "mt_encoder's feeds start it");
    }
    if (graph_ != "lm_score" && graph_ != "mt_encoder") {
      throw InvalidArgumentError(
          StrCat("onnx_feeds: --graph must be lm_score or mt_encoder, got '", graph_, "'"));
    }
    if (!FileExists(JoinPath(dir, graph_ + ".onnx"))) {
      throw NotFoundError(StrCat("onnx_feeds: bundle '", bundle_, "' has no onnx/", graph_,
                                 ".onnx (export it with glossa export --onnx)"));
    }
    if (b.tokenizer == nullptr) {
      throw FailedPreconditionError(StrCat("onnx_feeds: bundle '", bundle_, "' has no tokenizer"));
    }
    const std::vector<std::string> lines = ReadLines();
    nlohmann::json feeds;
    if (graph_ == "lm_score") {
      // As the "default" subgraph scores them: <s> + the tokens as ids, the tokens + </s> as
      // labels, padded to the longest.
      int64_t longest = 0;
      for (const auto& l : lines) longest = std::max<int64_t>(longest, static_cast<int64_t>(l.size()));
      const NestedMap in = b.tokenizer->StringsToIds(lines, longest + 1, /*pad_to_longest=*/true);
      feeds["ids"] = Feed(in.GetTensor("ids"));
      feeds["labels"] = Feed(in.GetTensor("labels"));
      feeds["paddings"] = Feed(in.GetTensor("paddings"));
    } else {
      // As the "translate" subgraph encodes them: the tokens + </s>, 0-padded to the longest.
      std::vector<std::vector<int64_t>> rows;
      size_t longest = 1;
      for (const auto& l : lines) {
        rows.push_back(b.tokenizer->StringToIds(l));
        rows.back().push_back(b.tokenizer->eos_id());
        longest = std::max(longest, rows.back().size());
      }
      const auto n = static_cast<int64_t>(rows.size());
      at::Tensor ids = at::zeros({n, static_cast<int64_t>(longest)}, at::kLong);
      at::Tensor paddings = at::ones({n, static_cast<int64_t>(longest)}, at::kFloat);
      for (int64_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < rows[i].size(); ++j) {
          ids[i][static_cast<int64_t>(j)] = rows[i][j];
          paddings[i][static_cast<int64_t>(j)] = 0.0;
        }
      }
      feeds["src_ids"] = Feed(ids);
      feeds["src_paddings"] = Feed(paddings);
    }
    const std::string text = feeds.dump() + "\n";
    if (output_.empty()) {
      std::cout << text << std::flush;
    } else {
      AtomicWriteFile(output_, text);
    }
    return 0;
  }

 private:
  std::vector<std::string> ReadLines() const {
    std::ifstream file;
    if (!input_.empty()) {
      CheckRegularFile(input_, "--input");
      file.open(input_);
    }
    std::istream& in = input_.empty() ? std::cin : file;
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(line);
    }
    if (lines.empty()) {
      throw InvalidArgumentError(StrCat("onnx_feeds: no lines in ",
                                        input_.empty() ? std::string("stdin") : input_));
    }
    return lines;
  }

  std::string bundle_, graph_, input_, output_;
};
GLOSSA_REGISTER_COMMAND(OnnxFeedsCommand, 95);

}  // namespace
}  // namespace cli
}  // namespace glossa
