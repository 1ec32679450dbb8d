// `python3 -m glossa`: the glossa command line inside the Python module (glossa/__main__.py calls
// it). The one file of the binding that includes tools/ (tests/lint/check_rooms.py allows it):
// the module runs the program's own dispatcher, not a copy of it.
#include <signal.h>

#include <string>
#include <vector>

#include "python/common.h"

#include "glossa/tools/cli.h"

namespace glossa_py {

void DefineCli(py::module_& m) {
  m.def(
      "cli_main",
      [](const std::vector<std::string>& argv, const std::vector<std::string>& self_command) {
        InitLogging();
        // The command installs its own SIGINT/SIGTERM handlers (stop and save); Python's come
        // back after it.
        struct sigaction old_int {}, old_term {};
        sigaction(SIGINT, nullptr, &old_int);
        sigaction(SIGTERM, nullptr, &old_term);
        int rc = 0;
        {
          py::gil_scoped_release release;
          rc = glossa::RunCli(argv, glossa::CliOptions{self_command});
        }
        sigaction(SIGINT, &old_int, nullptr);
        sigaction(SIGTERM, &old_term, nullptr);
        return rc;
      },
      py::arg("argv"), py::arg("self_command") = std::vector<std::string>{},
      "The glossa command line (argv[0] is the program name); returns the exit status.");

}

}  // namespace glossa_py
