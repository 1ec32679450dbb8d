// The glossa program: glossa::RunCli (glossa/tools/cli.h). A Python model configuration
// (--model=py:package.module.Class) is run by `python3 -m glossa` with the same arguments: this
// program re-executes itself as that, with the glossa Python package on PYTHONPATH.
#include <glog/logging.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "glossa/base/file.h"
#include "glossa/runtime/blas_kernels.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/tools/cli.h"

namespace {

// Where the glossa Python package is: next to an installed program (<prefix>/bin/glossa ->
// <prefix>/lib/python3/dist-packages), else the build tree's python/.
std::string GlossaPythonDir() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string dir(exe);
    dir = dir.substr(0, dir.rfind('/'));
    const std::string installed = dir + "/../lib/python3/dist-packages";
    if (glossa::FileExists(installed + "/glossa/__init__.py")) return installed;
  }
#ifdef GLOSSA_BUILD_PYTHON_DIR
  return GLOSSA_BUILD_PYTHON_DIR;
#else
  return "";
#endif
}

[[noreturn]] void RunInPython(const std::vector<std::string>& args, const std::string& model) {
  const std::string dir = GlossaPythonDir();
  if (dir.empty() || !glossa::FileExists(dir + "/glossa/__init__.py")) {
    std::cerr << "glossa: --model=" << model
              << " is a Python model configuration, but this glossa was built without its Python "
                 "package (install pybind11-dev and python3-dev, then rebuild)\n";
    std::exit(1);
  }
  const char* old = std::getenv("PYTHONPATH");
  const std::string path = old != nullptr && *old ? dir + ":" + old : dir;
  setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<std::string> command = {"/usr/bin/python3", "-m", "glossa"};
  command.insert(command.end(), args.begin() + 1, args.end());
  std::vector<char*> cargs;
  for (auto& a : command) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execv(cargs[0], cargs.data());
  std::cerr << "glossa: cannot run " << cargs[0] << " for --model=" << model << ": "
            << std::strerror(errno) << "\n";
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  // First: a stop from here on is a clean stop (docs/training.md, "Stopping").
  glossa::InstallStopHandlersFor(std::vector<std::string>(argv, argv + argc));
  glossa::UseBestBlasKernels(argv);  // may re-execute this program (glossa/runtime/blas_kernels.h)
  const std::vector<std::string> args(argv, argv + argc);
  const std::string py_model = glossa::PythonModelFlag(args);
  if (!py_model.empty()) RunInPython(args, py_model);
  FLAGS_logtostderr = true;  // --logtostderr=false: files, as glog's default
  google::InitGoogleLogging(argv[0]);
  std::ios::sync_with_stdio(true);
  return glossa::RunCli(args);
}
