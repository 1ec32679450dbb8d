// The `glossa` command line: builds the app, lets every registered command (one file each under
// glossa/tools/commands/) declare its subcommand and flags, parses, and runs the one given.
// Errors print one line naming what was wrong and exit non-zero.
#include <CLI/CLI.hpp>
#include <glog/logging.h>

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/tools/cli.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace {

using cli::Command;
// glog's flags, given before or after the subcommand.
struct GlogFlags {
  std::string logtostderr = "true", vmodule;
  int64_t v = 0;

  void Define(CLI::App& app) {
    app.add_option("--logtostderr", logtostderr,
                   "glog: log to stderr (true, the default) or to files in $GLOG_log_dir / /tmp.")
        ->check(CLI::IsMember({"true", "false", "1", "0"}));
    cli::AddIntFlag(&app, "--v", v, 0, 100, "glog: show VLOG(n) messages up to this level.");
    app.add_option("--vmodule", vmodule, "glog: per-module VLOG levels, e.g. saver=2,summary*=1.");
  }

  void Apply() const {
    FLAGS_logtostderr = logtostderr == "true" || logtostderr == "1";
    FLAGS_v = static_cast<int>(v);
    for (const auto& spec : Split(vmodule, ',')) {
      if (spec.empty()) continue;
      const size_t eq = spec.find('=');
      char* end = nullptr;
      const long level = eq == std::string::npos ? 0 : std::strtol(spec.c_str() + eq + 1, &end, 10);
      if (eq == std::string::npos || eq == 0 || end == nullptr || *end != '\0') {
        throw InvalidArgumentError(StrCat("--vmodule: expected module=level, got '", spec, "'"));
      }
      google::SetVLOGLevel(spec.substr(0, eq).c_str(), static_cast<int>(level));
    }
  }
};

// The command line after --flagfile expansion; `--logdir=` with nothing after '=' would take the
// next argument as its value, so an empty value is an error.
std::vector<std::string> ExpandedArgs(const std::vector<std::string>& argv) {
  std::vector<std::string> args(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
  args = cli::ExpandFlagfiles(args);
  for (const auto& a : args) {
    if (a.size() > 3 && a.rfind("--", 0) == 0 && a.back() == '=' && a.find('=') == a.size() - 1) {
      throw InvalidArgumentError(StrCat(a.substr(0, a.size() - 1), " has an empty value"));
    }
  }
  return args;
}

// A flag the command does not have: one line naming it and the nearest flags it has.
int UnknownFlag(const CLI::App& app, const CLI::ExtrasError& e) {
  const CLI::App* cmd = &app;
  for (const CLI::App* sub : app.get_subcommands()) {
    if (sub->parsed()) cmd = sub;
  }
  std::string hint;
  for (const auto& extra : app.remaining()) {  // the subcommand's extras fall through to app
    hint = cli::FlagSuggestion(cmd, extra);
    if (!hint.empty()) break;
  }
  std::cerr << e.what() << hint << " (see " << (cmd == &app ? "" : cmd->get_name() + " ")
            << "--help)\n";
  return e.get_exit_code();
}

// NaN passes every range check (each comparison with it is false) and Inf passes one-sided ones:
// every float flag of every command takes finite numbers only ("nan", "inf", "1e999" refused).
void RequireFiniteFloats(CLI::App* app) {
  static const CLI::Validator finite(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end != text.c_str() && !std::isfinite(v)) {
          return "must be a finite number, got " + text;
        }
        return "";
      },
      "");
  for (CLI::Option* o : app->get_options()) {
    // "FLOAT", or "FLOAT:<a validator's description>" (e.g. a CLI::Range, which NaN passes).
    const std::string type = o->get_type_name();
    if (type == "FLOAT" || type.rfind("FLOAT:", 0) == 0) o->check(finite);
  }
  for (CLI::App* sub : app->get_subcommands({})) RequireFiniteFloats(sub);
}

int Run(const std::vector<std::string>& argv) {
  CLI::App app{"Glossa: build, train, evaluate and serve neural sequence models.", "glossa"};
  app.footer(
      "Examples:\n"
      "  glossa train  --model=lm.austen.TransformerLmTiny --logdir=runs/austen_tiny\n"
      "  glossa eval   --model=lm.austen.TransformerLmTiny --logdir=runs/austen_tiny "
      "--dataset=Dev --once\n"
      "  glossa export --model=lm.austen.TransformerLmTiny --logdir=runs/austen_tiny "
      "--out=/tmp/austen && echo 'It is a truth' | glossa predict --bundle=/tmp/austen\n"
      "Every command documents its flags under `glossa <command> --help`; "
      "--flagfile=F reads --flag=value lines from F. Docs: docs/tutorial.md.");
  // Flag errors are one line, like every other error.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string(e.what()) + " (see --help)\n";
  });
  app.require_subcommand(1);
  GlogFlags glog;
  glog.Define(app);
  std::vector<std::string> libraries;
  app.add_option("--load_library", libraries,
                 "A shared library of your own (models, layers, commands, built against the "
                 "installed glossa) to load first; repeat it for several. $GLOSSA_LIBRARIES "
                 "(':'-separated) are loaded before them.")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.fallthrough();  // glog's flags and --load_library after the subcommand
  std::vector<std::unique_ptr<Command>> commands = cli::MakeCommands();
  std::vector<CLI::App*> subcommands;
  for (auto& c : commands) subcommands.push_back(c->Define(app));
  RequireFiniteFloats(&app);

  const cli::CommandContext ctx{argv, ExpandedArgs(argv)};
  std::vector<std::string> reversed(ctx.expanded_args.rbegin(), ctx.expanded_args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ExtrasError& e) {
    return UnknownFlag(app, e);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  glog.Apply();
  cli::LoadLibraries(libraries);
  for (size_t i = 0; i < commands.size(); ++i) {
    if (subcommands[i]->parsed()) return commands[i]->Run(ctx);
  }
  return 0;
}

}  // namespace

void InstallStopHandlersFor(const std::vector<std::string>& argv) {
  if (argv.size() > 1 && (argv[1] == "train" || argv[1] == "eval" || argv[1] == "decode")) {
    cli::InstallStopHandlers();
  }
}

int RunCli(const std::vector<std::string>& argv, const CliOptions& options) {
  if (!options.self_command.empty()) cli::SelfCommand() = options.self_command;
  // Commands that stop cleanly on SIGTERM/SIGINT take them from the start: a signal while the
  // model is built is seen by the executor or job once it runs.
  InstallStopHandlersFor(argv);
  try {
    return Run(argv);
  } catch (const Error& e) {
    std::cerr << "glossa: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "glossa: internal error: " << e.what() << "\n";
    return 2;
  }
}

std::string PythonModelFlag(const std::vector<std::string>& argv) {
  for (size_t i = 1; i < argv.size(); ++i) {
    std::string value;
    if (argv[i].rfind("--model=", 0) == 0) {
      value = argv[i].substr(8);
    } else if (argv[i] == "--model" && i + 1 < argv.size()) {
      value = argv[i + 1];
    }
    if (value.rfind("py:", 0) == 0) return value;
  }
  return "";
}

}  // namespace glossa
