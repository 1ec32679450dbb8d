// `glossa list_models`: the registered models.
#include <CLI/CLI.hpp>

#include <iostream>

#include "glossa/model/model_registry.h"
#include "glossa/tools/command.h"

namespace glossa {
namespace cli {
namespace {

class ListModelsCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    return app.add_subcommand("list_models", "List the registered models.");
  }
  int Run(const CommandContext&) override {
    for (const auto& k : ModelKeys()) std::cout << k << "\n";
    return 0;
  }
};
GLOSSA_REGISTER_COMMAND(ListModelsCommand, 30);

}  // namespace
}  // namespace cli
}  // namespace glossa
