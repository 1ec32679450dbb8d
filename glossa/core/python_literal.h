// Internal: the subset of Python literals that Lingvo's params text holds in list and dict values
// (what its ast.literal_eval sees): None, True/False, numbers, strings with Python's escapes,
// lists, tuples (kept as lists) and dicts, nested at most 100 deep. Malformed text is an error
// naming where it went wrong.
#pragma once

#include <string_view>

#include "glossa/core/param_value.h"

namespace glossa {
namespace internal {

ParamValue ParsePythonLiteral(std::string_view text);

}  // namespace internal
}  // namespace glossa
