// Fused scoring in a decoder's search: scorers applied in order, each one's states under its key,
// the decoder never seeing them.
#include "glossa/search/fusion.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(Fusion, ScorersAdjustInOrderAndKeepTheirStatesApart) {
  const at::Tensor dec_lp = at::log_softmax(at::randn({3, 5}, at::kDouble), -1);
  const at::Tensor lm_lp = at::log_softmax(at::randn({3, 5}, at::kDouble), -1);
  int decoder_calls = 0;
  DecodeStepFn decoder = [&](const at::Tensor&, int64_t step, const NestedMap& states) {
    ++decoder_calls;
    EXPECT_FALSE(states.contains("lm_fusion"));  // the scorers' states are not the decoder's
    EXPECT_FALSE(states.contains("double"));
    NestedMap next;
    next.Put("t", at::full({}, static_cast<double>(step + 1), at::kDouble));
    return std::make_pair(dec_lp, next);
  };
  FusedScorer lm = LmShallowFusion(
      [](int64_t n) {
        NestedMap s;
        s.Put("n", at::full({}, static_cast<double>(n), at::kDouble));
        return s;
      },
      [&](const at::Tensor&, int64_t, const NestedMap& s) {
        NestedMap next;
        next.Put("n", s.GetTensor("n") + 1);
        return std::make_pair(lm_lp, next);
      },
      0.25);
  // A second scorer that doubles what it is given: order matters (2·(dec + w·lm)).
  FusedScorer twice{"double", [](int64_t) { return NestedMap(); },
                    [](const at::Tensor&, int64_t, const at::Tensor& lp, const NestedMap& s) {
                      return std::make_pair(lp * 2, s);
                    }};
  const DecodeStepFn step = FuseScorers(decoder, {lm, twice});
  NestedMap dec_states;
  dec_states.Put("t", at::zeros({}, at::kDouble));
  const NestedMap states = FuseInitStates(dec_states, {lm, twice}, 3);
  EXPECT_EQ(states.GetTensor("lm_fusion.n").item<double>(), 3.0);
  auto [lp, next] = step(at::zeros({3}, at::kLong), 0, states);
  EXPECT_EQ(decoder_calls, 1);
  EXPECT_TRUE(at::equal(lp, (dec_lp + 0.25 * lm_lp) * 2));
  EXPECT_EQ(next.GetTensor("lm_fusion.n").item<double>(), 4.0);
  EXPECT_EQ(next.GetTensor("t").item<double>(), 1.0);
  EXPECT_TRUE(next.contains("double"));
  // Without scorers the decoder's own step is returned.
  auto [plain, plain_next] = FuseScorers(decoder, {})(at::zeros({3}, at::kLong), 0, dec_states);
  EXPECT_TRUE(at::equal(plain, dec_lp));
  EXPECT_FALSE(plain_next.contains("lm_fusion"));
}

}  // namespace
}  // namespace glossa
