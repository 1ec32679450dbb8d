// Where a registered model's data lives: $GLOSSA_DATA_DIR/<name> when GLOSSA_DATA_DIR is set,
// else the installation's <prefix>/share/glossa/<name> (found from libglossa's own location), else
// the source tree's data/<name> (a build tree).
#pragma once

#include <string>

namespace glossa {

// NotFound naming every place tried and `how_to_make` (e.g. "scripts/prepare_bible_mt.sh") when
// the directory is nowhere.
std::string FindDataDir(const std::string& name, const std::string& how_to_make);

}  // namespace glossa
