// CallWithCustomGradient: Lingvo's CallDefun on libtorch autograd. Runs `fwd` on a NestedMap of
// tensors; when `bak` is given it replaces autodiff for this call: the backward pass calls
// bak(xs, ys, dys) and uses the NestedMap it returns as the gradients of xs.
//
//   auto fwd = [](const NestedMap& x) { return NestedMap{{"y", 2 * x.GetTensor("x").pow(2)}}; };
//   NestedMap ys = CallWithCustomGradient(fwd, nullptr, NestedMap{{"x", x}});
//
// As in Lingvo, the step seed is reset to 0 inside `fwd` and inside `bak` (each is its own
// function) and restored afterwards; `bak` runs under the global step `fwd` saw, on whatever
// thread autograd uses. With `bak`, `fwd` runs without recording autograd history; every leaf of
// xs and ys must be a tensor, and `bak` must return a NestedMap compatible with xs (undefined
// tensors mean zero gradient).
#pragma once

#include <functional>

#include "glossa/core/nested_map.h"

namespace glossa {

using CustomFwdFn = std::function<NestedMap(const NestedMap& xs)>;
using CustomBakFn =
    std::function<NestedMap(const NestedMap& xs, const NestedMap& ys, const NestedMap& dys)>;

NestedMap CallWithCustomGradient(const CustomFwdFn& fwd, const CustomBakFn& bak,
                                 const NestedMap& xs);

// For recomputing under autograd inside a `bak`: each tensor detached into a fresh leaf that
// requires a gradient when it is floating; other leaves unchanged.
NestedMap DetachedLeaves(const NestedMap& m);

}  // namespace glossa
