// Internal: how Params values print in Lingvo's formats (text format, str(), containers).
#pragma once

#include <string>
#include <string_view>

#include "glossa/core/param_value.h"

namespace glossa {
class Params;
namespace internal {

// Lingvo's _QuoteString: the quote that needs less escaping (' on a tie), escaping only that quote
// and backslash; newlines verbatim.
std::string QuoteString(std::string_view s);
// Inverse of QuoteString for a complete quoted value (Lingvo's _UnquoteString).
std::string UnquoteString(std::string_view quoted);
// A leaf value as the text format writes it after `key : `.
std::string TextValue(const ParamValue& v);
// A value inside a list or dict literal (Python's repr of Lingvo's GetRepr of the value).
std::string ContainerRepr(const ParamValue& v);
// Python's str() of a value, as TextDiff prints it.
std::string PyStr(const ParamValue& v);
// Lingvo's Params._ToString(nested_depth).
std::string ParamsToString(const Params& p, int depth);

}  // namespace internal
}  // namespace glossa
