#include "glossa/tasks/data_dir.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

#ifndef GLOSSA_DEFAULT_DATA_DIR
#define GLOSSA_DEFAULT_DATA_DIR "data"
#endif

namespace glossa {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string RealPath(const std::string& path) {
  char* real = ::realpath(path.c_str(), nullptr);
  std::string out = real != nullptr ? real : path;
  std::free(real);
  return out;
}

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::vector<std::string> DataDirCandidates(const std::string& name) {
  std::vector<std::string> out;
  auto add = [&](const std::string& dir) {
    for (const auto& o : out) {
      if (o == dir) return;
    }
    out.push_back(dir);
  };
  // The program that runs (a copy of a checkout runs its own build's program).
  const std::string exe = RealPath("/proc/self/exe");
  if (exe.find('/') != std::string::npos) {
    const std::string prefix = Parent(Parent(exe));  // <prefix>/bin/glossa, <build>/bin/glossa
    add(StrCat(prefix, "/share/glossa/", name));
    if (IsFile(StrCat(prefix, "/CMakeCache.txt"))) add(StrCat(Parent(prefix), "/data/", name));
  }
  // The library (an installation used from another program, such as python3).
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&FindDataDir), &info) != 0 && info.dli_fname != nullptr) {
    const std::string lib = Parent(RealPath(info.dli_fname));  // <prefix>/lib/libglossa.so
    add(StrCat(Parent(lib), "/share/glossa/", name));
  }
  add(StrCat(GLOSSA_DEFAULT_DATA_DIR, "/", name));  // the checkout it was built from
  add(StrCat("data/", name));                        // the working directory
  return out;
}

std::string FindDataDir(const std::string& name, const std::string& how_to_make) {
  const char* env = std::getenv("GLOSSA_DATA_DIR");
  if (env != nullptr && *env != '\0') return StrCat(env, "/", name);  // as given, checked on use
  const std::vector<std::string> tried = DataDirCandidates(name);
  for (const auto& dir : tried) {
    if (IsDirectory(dir)) return dir;
  }
  throw NotFoundError(StrCat("the data directory ", name, "/ is in none of ", Join(tried, ", "),
                             " (docs/formats.md: where data is found); make it with ", how_to_make,
                             " or set GLOSSA_DATA_DIR to the directory holding ", name, "/"));
}

}  // namespace glossa
