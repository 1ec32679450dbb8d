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

// The states of a running batch kept in buffers with room for more rows and steps, so that a
// step writes in place and a row joining or leaving copies that row only (the functions above
// copy every row). View() is what ExtendStepProjected reads; Adopt() takes what it returned (its
// own tensors when it had to grow the caches).
//
//   RunningStates s(stack->InitStates(0, at::kFloat));
//   s.Join(prefilled, &shift_running, &shift_joining);
//   auto [y, next] = stack->ExtendStepProjected(theta, x, s.View(), aux, {}, paddings);
//   s.Adopt(next);
//   s.RemoveRow(3);  // the last row moves into row 3
class RunningStates {
 public:
  RunningStates() = default;
  int64_t rows() const { return rows_; }
  int64_t steps() const { return steps_; }
  NestedMap View() const;
  void Adopt(const NestedMap& after_step);
  // Adds `joining`'s rows after the others, right-aligned as JoinStateRows does (only the joining
  // rows are copied when they have no more steps than the running ones).
  void Join(const NestedMap& joining, int64_t* shift_running, int64_t* shift_joining);
  // Removes row i: the last row moves into its place. Returns the row that moved (or -1).
  int64_t RemoveRow(int64_t i);
  // DropStateSteps on every row.
  void DropSteps(int64_t steps);
  void Clear();

 private:
  struct Layer {
    at::Tensor key, value, rows;  // [capacity rows, capacity steps, ...]
  };
  std::vector<Layer> layers_;
  int64_t rows_ = 0, steps_ = 0;
};

}  // namespace glossa
