#include "glossa/models/data_dir.h"

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

}  // namespace

std::string FindDataDir(const std::string& name, const std::string& how_to_make) {
  const char* env = std::getenv("GLOSSA_DATA_DIR");
  if (env != nullptr && *env != '\0') return StrCat(env, "/", name);  // as given, checked on use
  std::vector<std::string> tried;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&FindDataDir), &info) != 0 && info.dli_fname != nullptr) {
    // <prefix>/lib/libglossa.so, resolved (the loader may report <prefix>/bin/../lib/...).
    char* real = ::realpath(info.dli_fname, nullptr);
    std::string lib = real != nullptr ? real : info.dli_fname;
    std::free(real);
    lib = lib.substr(0, lib.rfind('/'));
    const std::string installed = StrCat(lib.substr(0, lib.rfind('/') + 1), "share/glossa/", name);
    if (IsDirectory(installed)) return installed;
    tried.push_back(installed);
  }
  const std::string source = StrCat(GLOSSA_DEFAULT_DATA_DIR, "/", name);
  if (IsDirectory(source)) return source;
  tried.push_back(source);
  throw NotFoundError(StrCat("the data directory ", name, "/ is in none of ", Join(tried, ", "),
                             "; make it with ", how_to_make,
                             " or set GLOSSA_DATA_DIR to the directory holding ", name, "/"));
}

}  // namespace glossa
