// LSTM: padded steps carry the state; the reverse direction.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "glossa/core/step_seed.h"
#include "glossa/base/strings.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/block.h"
#include "glossa/layers/conv.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/revnet.h"
#include "glossa/layers/rnn.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(LSTM, PaddedStepsCarryTheStateAndReverseRuns) {
  auto rnn =
      Make<RNNLayer>(RNNLayer::Params(), "cell.num_input_nodes : 3\ncell.num_output_nodes : 4");
  at::Tensor x = at::randn({5, 2, 3});
  at::Tensor paddings = at::zeros({5, 2, 1});
  paddings.index_put_({at::indexing::Slice(3, at::indexing::None), 1}, 1.0);
  auto [out, final_state] = rnn->FProp(rnn->theta(), x, paddings);
  // Sequence 1 ends at step 3: its outputs stay at the last real step and the final state is it.
  EXPECT_TRUE(at::equal(out[4][1], out[2][1]));
  EXPECT_TRUE(at::equal(final_state.GetTensor("m")[1], out[2][1]));
  EXPECT_FALSE(at::equal(out[4][0], out[2][0]));
  // The padded steps' inputs do not matter.
  at::Tensor x2 = x.clone();
  x2.index_put_({at::indexing::Slice(3, at::indexing::None), 1}, 9.0);
  EXPECT_TRUE(at::equal(rnn->FProp(rnn->theta(), x2, paddings).first[2][1], out[2][1]));
  auto rev = Make<RNNLayer>(RNNLayer::Params(),
                            "cell.num_input_nodes : 3\ncell.num_output_nodes : 4\nreverse : True");
  auto [rout, rstate] = rev->FProp(rev->theta(), x);
  EXPECT_TRUE(at::equal(rstate.GetTensor("m"), rout[0]));  // the last step run is t = 0
  EXPECT_ERROR_CONTAINS(rnn->FProp(rnn->theta(), at::randn({5, 2})), InvalidArgumentError,
                        "inputs must be [T, B, D]");
}

}  // namespace
}  // namespace glossa
