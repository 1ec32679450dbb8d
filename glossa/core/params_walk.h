// Rewriting a Params tree in place: every nested Params, fields and elements of list fields.
//
//   ForEachNestedParams(p, [](Params& q) { if (q.Contains("splits")) q.Set("splits", 1); });
#pragma once

#include <functional>

#include "glossa/core/params.h"

namespace glossa {

// Calls fn on `p` and then on every Params nested in it (as a field, or an element of a list
// field), each able to change it in place.
void ForEachNestedParams(Params& p, const std::function<void(Params&)>& fn);

}  // namespace glossa
