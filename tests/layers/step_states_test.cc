// The running batch's decoding states (glossa/layers/step_states.h): rows kept, joined
// right-aligned, and old columns dropped, on a stack of two layers of hand-made caches.
#include "glossa/layers/step_states.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "glossa/base/errors.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// n rows of `steps` steps (capacity 8), key[i, s] = 100 (tag) + 10 i + s, value = -key.
NestedMap States(int64_t n, int64_t steps, double tag, int64_t layers = 2) {
  NestedValue::List per_layer;
  for (int64_t l = 0; l < layers; ++l) {
    at::Tensor key = at::zeros({n, 8, 1, 2});
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t s = 0; s < steps; ++s) key[i][s].fill_(100 * tag + 10 * i + s + l);
    }
    NestedMap kv;
    kv.Put("key", key);
    kv.Put("value", -key);
    NestedMap m;
    m.Put("unordered", kv);
    m.Put("rows", at::arange(n, at::kLong).unsqueeze(1).expand({n, 8}).contiguous());
    m.Put("length", at::full({n}, steps, at::kLong));
    per_layer.push_back(std::move(m));
  }
  NestedMap s;
  s.Put("x_layers", std::move(per_layer));
  return s;
}

at::Tensor Key(const NestedMap& s, int64_t layer) {
  return s.at("x_layers").AsList()[layer].AsMap().GetItem("unordered").AsMap().GetTensor("key");
}
at::Tensor Rows(const NestedMap& s, int64_t layer) {
  return s.at("x_layers").AsList()[layer].AsMap().GetTensor("rows");
}

TEST(StepStates, JoinKeepAndDropMoveEveryLayersColumns) {
  const NestedMap a = States(2, 5, 1), b = States(3, 2, 2);
  EXPECT_EQ(StateSteps(a), 5);
  EXPECT_EQ(StateRows(b), 3);
  int64_t shift_a = -1, shift_b = -1;
  const NestedMap j = JoinStateRows(a, b, &shift_a, &shift_b);
  EXPECT_EQ(shift_a, 0);
  EXPECT_EQ(shift_b, 3);  // b's 2 steps end where a's 5 do
  EXPECT_EQ(StateRows(j), 5);
  EXPECT_EQ(StateSteps(j), 5);
  for (int64_t l = 0; l < 2; ++l) {
    const at::Tensor k = Key(j, l);
    EXPECT_GE(k.size(1), 6);  // room for the next step
    EXPECT_EQ(k[1][4][0][0].item<float>(), 100 + 10 + 4 + l);  // a's row 1, step 4
    EXPECT_EQ(k[2][3][0][1].item<float>(), 200 + 0 + 0 + l);   // b's row 0, its step 0
    EXPECT_EQ(k[4][4][0][0].item<float>(), 200 + 20 + 1 + l);  // b's row 2, its step 1
    EXPECT_EQ(k[3][2].abs().sum().item<float>(), 0);           // before b's first step
    EXPECT_TRUE(at::equal(Rows(j, l).select(1, 3), at::arange(5, at::kLong)));
  }
  // b joined to a (a longer): a moves instead.
  const NestedMap j2 = JoinStateRows(b, a, &shift_b, &shift_a);
  EXPECT_EQ(shift_b, 3);
  EXPECT_EQ(shift_a, 0);
  EXPECT_EQ(Key(j2, 0)[0][3][0][0].item<float>(), 200);
  // Keep rows 4 and 1, in that order.
  const NestedMap kept = KeepStateRows(j, {4, 1});
  EXPECT_EQ(StateRows(kept), 2);
  EXPECT_EQ(Key(kept, 1)[0][4][0][0].item<float>(), 200 + 20 + 1 + 1);
  EXPECT_EQ(Key(kept, 1)[1][4][0][0].item<float>(), 100 + 10 + 4 + 1);
  EXPECT_TRUE(at::equal(Rows(kept, 0).select(1, 0), at::arange(2, at::kLong)));
  // Drop the first 3 columns: column s becomes s - 3, the rest zeros.
  const NestedMap dropped = DropStateSteps(kept, 3);
  EXPECT_EQ(StateSteps(dropped), 2);
  EXPECT_EQ(Key(dropped, 0)[0][0][0][0].item<float>(), 200 + 20 + 0);
  EXPECT_EQ(Key(dropped, 0)[1][1][0][0].item<float>(), 100 + 10 + 4);
  EXPECT_EQ(Key(dropped, 0).narrow(1, 2, 6).abs().sum().item<float>(), 0);
  EXPECT_EQ(StateSteps(DropStateSteps(kept, 0)), 5);
  // Refused: rows out of range, dropping more than there is, layers or caches that differ.
  EXPECT_ERROR_CONTAINS(KeepStateRows(j, {5}), InvalidArgumentError, "row 5 of 5");
  EXPECT_ERROR_CONTAINS(DropStateSteps(j, 6), InvalidArgumentError, "dropping 6 of 5");
  EXPECT_ERROR_CONTAINS(JoinStateRows(a, States(1, 1, 3, 1), &shift_a, &shift_b),
                        InvalidArgumentError, "2 and 1 layers");
  EXPECT_ERROR_CONTAINS(KeepStateRows(NestedMap(), {0}), InvalidArgumentError, "x_layers");
}

// The buffered form: joining copies the joining rows into spare room, removing moves the last
// row into the hole, and the view is what the free functions give.
TEST(StepStates, RunningStatesJoinInPlaceAndMoveTheLastRowIntoAHole) {
  RunningStates r;
  int64_t shift_r = -1, shift_j = -1;
  r.Join(States(2, 5, 1), &shift_r, &shift_j);
  EXPECT_EQ(shift_r, 0);
  EXPECT_EQ(shift_j, 0);
  EXPECT_EQ(r.rows(), 2);
  EXPECT_EQ(r.steps(), 5);
  r.Join(States(3, 2, 2), &shift_r, &shift_j);  // fewer steps: copied into room for more rows
  EXPECT_EQ(shift_r, 0);
  EXPECT_EQ(shift_j, 3);
  EXPECT_EQ(r.rows(), 5);
  const NestedMap want = JoinStateRows(States(2, 5, 1), States(3, 2, 2), &shift_r, &shift_j);
  for (int64_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(at::equal(Key(r.View(), l).narrow(1, 0, 5), Key(want, l).narrow(1, 0, 5))) << l;
    EXPECT_TRUE(at::equal(Rows(r.View(), l).narrow(1, 0, 5), Rows(want, l).narrow(1, 0, 5))) << l;
  }
  r.Join(States(1, 1, 3), &shift_r, &shift_j);  // room enough now: no reallocation
  const void* after = Key(r.View(), 0).data_ptr();
  EXPECT_EQ(r.rows(), 6);
  EXPECT_EQ(shift_j, 4);
  EXPECT_EQ(Key(r.View(), 1)[5][4][0][0].item<float>(), 300 + 1);
  EXPECT_EQ(after, Key(r.View(), 0).data_ptr());
  // Remove row 1: row 5 moves into it; removing the last row moves nothing.
  EXPECT_EQ(r.RemoveRow(1), 5);
  EXPECT_EQ(r.rows(), 5);
  EXPECT_EQ(Key(r.View(), 0)[1][4][0][0].item<float>(), 300);
  EXPECT_EQ(Key(r.View(), 0)[1][0].abs().sum().item<float>(), 0);
  EXPECT_EQ(r.RemoveRow(4), -1);
  EXPECT_EQ(r.rows(), 4);
  EXPECT_ERROR_CONTAINS(r.RemoveRow(4), InvalidArgumentError, "row 4 of 4");
  // A joining batch with more steps than the running one moves the running rows instead.
  r.Join(States(1, 7, 4), &shift_r, &shift_j);
  EXPECT_EQ(shift_r, 2);
  EXPECT_EQ(shift_j, 0);
  EXPECT_EQ(r.steps(), 7);
  EXPECT_EQ(Key(r.View(), 0)[0][2 + 4][0][0].item<float>(), 100 + 4);
  r.DropSteps(2);
  EXPECT_EQ(r.steps(), 5);
  EXPECT_EQ(Key(r.View(), 0)[0][4][0][0].item<float>(), 100 + 4);
  // A step that grew the caches hands back its own tensors, which are adopted.
  EXPECT_ERROR_CONTAINS(r.Adopt(KeepStateRows(r.View(), {0, 1})), InvalidArgumentError,
                        "2 layers of 2 rows, not 2 of 5");
  NestedMap grown = KeepStateRows(r.View(), {0, 1, 2, 3, 4});
  ASSERT_NE(Key(r.View(), 0).data_ptr(), Key(grown, 0).data_ptr());
  r.Adopt(grown);
  EXPECT_EQ(Key(r.View(), 0).data_ptr(), Key(grown, 0).data_ptr());
  r.Clear();
  EXPECT_EQ(r.rows(), 0);
  EXPECT_EQ(r.steps(), 0);
}

}  // namespace
}  // namespace glossa
