// Declared FLOPs (Lingvo's FPropMeta flops, per token) and the stage ends a pipeline derives from
// them. A layer class declares its forward FLOPs per token as a function of its Params
// (RegisterDeclaredFlops, at static initialization beside GLOSSA_REGISTER_CLASS); a pipeline whose
// `splits` is an int balances its stages by them (StageEndsOf), so that a stack of unequal layers
// (dense and MoE, say) does not leave one stage waiting on another. A class that declares none
// gives no figure, and its pipeline splits evenly.
//
//   const std::vector<int64_t> ends = StageEndsOf(where, p.Get("splits"), layer_params);
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "glossa/core/params.h"

namespace glossa {

using DeclaredFlopsFn = std::function<std::optional<double>(const Params&)>;
// Declares `fn` for the layers of registry key `cls_key`; returns true (for a static initializer).
bool RegisterDeclaredFlops(const std::string& cls_key, DeclaredFlopsFn fn);
// The forward FLOPs per token of a layer of Params `p` (by its class), or nullopt when its class
// declares none.
std::optional<double> DeclaredFlopsPerToken(const Params& p);

// The ends of `stages` contiguous stages over cells costing `costs`, the first stage also
// costing `first_extra` and the last `last_extra` (what runs beside them: a task's embedding and
// softmax), the costliest stage as cheap as it can be: EvenStageEnds when that split is one of
// the cheapest (equal cells split evenly), else the one that fills the stages front to back.
std::vector<int64_t> BalancedStageEnds(const std::vector<double>& costs, int64_t stages,
                                       double first_extra = 0, double last_extra = 0);

// Stage ends from a pipeline's `splits` over `cells` (their Params): a list is taken as given
// (StageEndsFromSplits checks it); an int derives them, balanced by the cells' declared FLOPs and
// `end_flops` (per token, beside the first and the last stage; evenly when a cell declares none).
// InvalidArgument naming `where` for bad splits.
std::vector<int64_t> StageEndsOf(const std::string& where, const ParamValue& splits,
                                 const std::vector<Params>& cells,
                                 std::pair<double, double> end_flops = {0, 0});

}  // namespace glossa
