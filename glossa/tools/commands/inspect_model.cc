// `glossa inspect_model --model=...`: a model's Params text, its variables, and parameter counts.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <regex>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/model/base_model.h"
#include "glossa/runtime/executor.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

class InspectModelCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand("inspect_model", "Print a model's params and its variables.");
    AddModelFlags(c, f_, false, "Train");
    c->add_option("--inspect_model_part_regex", f_.part_regex,
                  "name:regex (repeatable): count the params of the variables whose name matches "
                  "regex as part `name`, e.g. --inspect_model_part_regex=stack:.*/stack/.*");
    AddIntFlag(c, "--inspect_model_topn", f_.topn, 0, 1000000, "Print the topn largest variables.");
    return c;
  }

  int Run(const CommandContext&) override {
    Params p = ModelParamsFromFlags(f_);
    const auto parts = Parts();
    std::cout << p.ToText() << "\n";
    auto model = InstantiateLayer<BaseModel>(p);
    std::cout << ModelAnalysis(*model);
    std::vector<std::pair<int64_t, std::string>> sizes;
    for (const auto& [info, t] : model->AllVariables()) sizes.emplace_back(t.numel(), info.full_name);
    for (const auto& [name, re] : parts) {
      int64_t n = 0;
      for (const auto& [numel, var] : sizes) {
        if (std::regex_match(var, re)) n += numel;
      }
      std::cout << "#params of " << name << ": " << n << "\n";
    }
    if (f_.topn > 0) {
      std::stable_sort(sizes.begin(), sizes.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      std::cout << "top " << f_.topn << " variables by size:\n";
      for (int64_t i = 0; i < std::min<int64_t>(f_.topn, sizes.size()); ++i) {
        std::cout << "  " << sizes[i].second << "    " << sizes[i].first << "\n";
      }
    }
    return 0;
  }

 private:
  std::vector<std::pair<std::string, std::regex>> Parts() const {
    std::vector<std::pair<std::string, std::regex>> parts;
    for (const auto& spec : f_.part_regex) {
      const size_t colon = spec.find(':');
      if (colon == std::string::npos || colon == 0) {
        throw InvalidArgumentError(
            StrCat("--inspect_model_part_regex: expected name:regex, got '", spec, "'"));
      }
      try {
        parts.emplace_back(spec.substr(0, colon), std::regex(spec.substr(colon + 1)));
      } catch (const std::regex_error& e) {
        throw InvalidArgumentError(
            StrCat("--inspect_model_part_regex '", spec, "': bad regex: ", e.what()));
      }
    }
    return parts;
  }

  ModelFlags f_;
};
GLOSSA_REGISTER_COMMAND(InspectModelCommand, 40);

}  // namespace
}  // namespace cli
}  // namespace glossa
