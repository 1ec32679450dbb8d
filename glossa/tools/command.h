// The `glossa` subcommands: each lives in glossa/tools/commands/<name>.cc and registers itself.
// A command declares its flags on a CLI11 subcommand (binding them to its own members) and runs
// once they are parsed; glossa_main.cc only builds the app, parses and dispatches.
//
//   class BleuCommand : public Command {
//     CLI::App* Define(CLI::App& app) override { auto* c = app.add_subcommand("bleu", ...); ...}
//     int Run(const CommandContext& ctx) override { ... return 0; }
//   };
//   GLOSSA_REGISTER_COMMAND(BleuCommand, 60);  // 60: its place in --help
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace glossa {
namespace cli {

struct CommandContext {
  std::vector<std::string> argv;           // as given (argv[0] the program)
  std::vector<std::string> expanded_args;  // after --flagfile expansion, without argv[0]
};

class Command {
 public:
  virtual ~Command() = default;
  // Adds the subcommand and its flags to `app`; returns the subcommand.
  virtual CLI::App* Define(CLI::App& app) = 0;
  // Runs the parsed command; returns the exit status (0 only when it did its job). Errors are
  // glossa::Error exceptions (printed as one line by RunCli).
  virtual int Run(const CommandContext& ctx) = 0;
};

// Registers a command factory; `order` places it in --help. Returns true (for static init).
bool RegisterCommand(int order, std::function<std::unique_ptr<Command>()> make);
// New instances of every registered command, in order.
std::vector<std::unique_ptr<Command>> MakeCommands();

#define GLOSSA_REGISTER_COMMAND(Class, order)                                               \
  static const bool kGlossaCommandRegistered_##Class [[maybe_unused]] =                     \
      ::glossa::cli::RegisterCommand(order, [] { return std::make_unique<Class>(); })

}  // namespace cli
}  // namespace glossa
