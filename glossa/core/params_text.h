// Lingvo's params text format (docs/params_text_format.md), behind Params::ToText,
// ToTextWithDocs and FromText (glossa/core/params.h), which are what callers use.
#pragma once

#include <string>
#include <string_view>

#include "glossa/core/params.h"

namespace glossa {
namespace internal {

// One `key : value` line per leaf, sorted by key; with_docs puts each param's doc string above
// its line as `# ` comments (the result still reads back).
std::string ParamsText(const Params& p, bool with_docs);
// A copy of `base` with `text` merged in, values parsed by the kind of the current value:
// InvalidArgument naming the line, NotFound for an unknown key (base is never changed).
Params ParamsWithText(const Params& base, std::string_view text);

}  // namespace internal
}  // namespace glossa
