// The `glossa` command line as a library call, shared by the glossa program (tools/cli_main.cc)
// and `python3 -m glossa` (python/glossa/__main__.py), which trains Python model configurations
// (`--model=py:package.module.Class`) with the same runtime.
//
//   return glossa::RunCli({"glossa", "train", "--model=lm.austen.TransformerLmTiny", ...});
#pragma once

#include <string>
#include <vector>

namespace glossa {

struct CliOptions {
  // The command that re-runs this program, for the workers --nproc_per_node starts (they get the
  // same arguments after it). Empty: /proc/self/exe.
  std::vector<std::string> self_command;
};

// Runs `glossa <argv[1:]>` (argv[0] is the program name). Errors are printed as
// "glossa: <message>" on stderr; returns the exit status (0 only when the command did its job).
int RunCli(const std::vector<std::string>& argv, const CliOptions& options = {});

// For the commands that stop cleanly on SIGTERM/SIGINT (train, eval, decode): installs their
// handlers. The program calls it first thing in main, so that the only moments a signal takes its
// default action are before main (while the shared libraries load) and across the re-execution
// UseBestBlasKernels may do; RunCli calls it again.
void InstallStopHandlersFor(const std::vector<std::string>& argv);

// The model a command line names with --model=py:<module>.<Class> (or "--model py:..."), "" when
// it names none.
std::string PythonModelFlag(const std::vector<std::string>& argv);

}  // namespace glossa
