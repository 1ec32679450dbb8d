// The decoding states of a running batch whose rows join and leave at step boundaries
// (continuous batching, glossa/model/generation.h). They act on a TransformerStack's states
// ({x_layers: [MultiHeadedAttention's {unordered: {key, value}, rows, length}]}) of a batch that
// never reorders its rows (sampling, not beam search), so row i's step s is slot i's column s.
// A row that joins after the others keeps its steps right-aligned with theirs, the columns before
// its first step zeros; the caller masks them (ExtendStepProjected's paddings).
//
//   NestedMap s = JoinStateRows(running, joining, &shift_running, &shift_joining);
//   s = KeepStateRows(s, {0, 2});      // rows 1 and 3 finished
//   s = DropStateSteps(s, 64);         // no row reads columns [0, 64) any more
#pragma once

#include <cstdint>
#include <vector>

#include "glossa/core/nested_map.h"

namespace glossa {

// The steps cached (every row's) and the rows.
int64_t StateSteps(const NestedMap& states);
int64_t StateRows(const NestedMap& states);
// The rows `keep`, in that order.
NestedMap KeepStateRows(const NestedMap& states, const std::vector<int64_t>& keep);
// a's rows, then b's, both of max(a's steps, b's steps) steps: the shorter one's columns move
// later by *shift_a or *shift_b (the other is 0) and its first columns are zeros. The layers must
// agree (InvalidArgument otherwise).
NestedMap JoinStateRows(const NestedMap& a, const NestedMap& b, int64_t* shift_a, int64_t* shift_b);
// Every row without its first `steps` columns (none reads them any more): column s becomes
// s - steps.
NestedMap DropStateSteps(const NestedMap& states, int64_t steps);

}  // namespace glossa
