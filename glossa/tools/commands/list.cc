// `glossa list`: the registered classes.
#include <CLI/CLI.hpp>

#include <iostream>

#include "glossa/core/registry.h"
#include "glossa/tools/command.h"

namespace glossa {
namespace cli {
namespace {

class ListCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    return app.add_subcommand("list", "List the registered classes.");
  }
  int Run(const CommandContext&) override {
    const auto keys = ClassRegistry::Keys();
    if (keys.empty()) std::cout << "(no classes registered)\n";
    for (const auto& k : keys) std::cout << k << "  (" << ClassRegistry::Get(k).type_name << ")\n";
    return 0;
  }
};
GLOSSA_REGISTER_COMMAND(ListCommand, 10);

}  // namespace
}  // namespace cli
}  // namespace glossa
