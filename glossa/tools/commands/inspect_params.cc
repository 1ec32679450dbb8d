// `glossa inspect_params <key>`: a registered class's Params with their docs.
#include <CLI/CLI.hpp>

#include <iostream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

class InspectParamsCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand("inspect_params",
                                 "Print a registered class's params with their docs.");
    c->add_option("key", key_, "Registry key, e.g. glossa.layers.ProjectionLayer (see list)")
        ->required();
    c->add_option("--params_file", params_file_, "A params text file to apply first.");
    c->add_option("--params_override", params_override_,
                  "'key : value' lines (';' or newline separated) applied last.");
    return c;
  }

  int Run(const CommandContext&) override {
    const auto& entry = ClassRegistry::Get(key_);
    if (!entry.default_params) {
      throw FailedPreconditionError(StrCat("class '", key_, "' declares no static Params()"));
    }
    Params p = entry.default_params();
    if (!params_file_.empty()) {
      try {
        if (!FileExists(params_file_)) {
          throw NotFoundError(StrCat("cannot open params file '", params_file_, "'"));
        }
        p.FromText(ReadFileToString(params_file_, 64 << 20));
      } catch (const Error& e) {
        ThrowError(e.code(), StrCat(params_file_, ": ", e.message()));
      }
    }
    if (!params_override_.empty()) {
      try {
        p.FromText(OverrideText(params_override_));
      } catch (const Error& e) {
        ThrowError(e.code(), StrCat("--params_override: ", e.message()));
      }
    }
    std::cout << p.ToTextWithDocs();
    return 0;
  }

 private:
  std::string key_, params_file_, params_override_;
};
GLOSSA_REGISTER_COMMAND(InspectParamsCommand, 20);

}  // namespace
}  // namespace cli
}  // namespace glossa
