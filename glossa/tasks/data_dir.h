// Where a registered model's data lives. The first of these that is a directory, in this order:
//   1. $GLOSSA_DATA_DIR/<name>, when GLOSSA_DATA_DIR is set (taken as given, checked on use);
//   2. next to the program that runs: <bin>/../share/glossa/<name> (an installation), or, when the
//      program is in a build tree (<bin>/../CMakeCache.txt exists), <build>/../data/<name> (the
//      checkout holding that build tree, wherever it was moved or copied);
//   3. next to libglossa: <lib>/../share/glossa/<name> (an installation used by another program);
//   4. the checkout the library was built from: <source>/data/<name>;
//   5. the working directory: data/<name>.
#pragma once

#include <string>
#include <vector>

namespace glossa {

// NotFound naming every place tried and `how_to_make` (e.g. "scripts/prepare_bible_mt.sh") when
// the directory is nowhere.
std::string FindDataDir(const std::string& name, const std::string& how_to_make);

// The places FindDataDir tries for `name`, in order (without GLOSSA_DATA_DIR).
std::vector<std::string> DataDirCandidates(const std::string& name);

}  // namespace glossa
