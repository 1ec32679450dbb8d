// Conv2D and pooling: output paddings and padded frames.
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

TEST(Conv2D, OutputPaddingsFollowTheStride) {
  auto conv = Make<Conv2DLayer>(Conv2DLayer::Params(),
                                "filter_shape : [3, 1, 1, 2]\nfilter_stride : [2, 1]");
  at::Tensor x = at::randn({2, 7, 3, 1});
  at::Tensor paddings = at::zeros({2, 7});
  paddings.index_put_({1, at::indexing::Slice(3, at::indexing::None)}, 1.0);
  auto [y, out_paddings] = conv->FProp(conv->theta(), x, paddings);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 4, 3, 2}));  // SAME: ceil(7 / 2)
  EXPECT_TRUE(at::equal(out_paddings[1], at::tensor({0.0f, 0.0f, 1.0f, 1.0f})));
  EXPECT_TRUE(y[1][2].eq(0).all().item<bool>());
  auto valid =
      Make<Conv2DLayer>(Conv2DLayer::Params(), "filter_shape : [3, 3, 1, 2]\npadding : 'VALID'");
  EXPECT_EQ(valid->FProp(valid->theta(), x).first.sizes(), (std::vector<int64_t>{2, 5, 1, 2}));
  EXPECT_ERROR_CONTAINS(Make<Conv2DLayer>(Conv2DLayer::Params(), "padding : 'FULL'"),
                        InvalidArgumentError, "padding must be 'SAME' or 'VALID'");
  EXPECT_ERROR_CONTAINS(conv->FProp(conv->theta(), at::randn({2, 7, 3, 4})), InvalidArgumentError,
                        "inputs must be [B, H, W, 1]");
}

TEST(Pooling, PaddedFramesNeverWinOrCount) {
  auto pool =
      Make<PoolingLayer>(PoolingLayer::Params(), "window_shape : [2, 1]\nwindow_stride : [2, 1]");
  at::Tensor x = at::tensor({-1.0f, -2.0f, 5.0f, 7.0f}).view({1, 4, 1, 1});
  at::Tensor paddings = at::tensor({0.0f, 0.0f, 0.0f, 1.0f}).view({1, 4});
  auto [y, out_paddings] = pool->FProp(pool->theta(), x, paddings);
  // Frame 3 (7) is padded, so 5 wins the second window; the output frames are not padded.
  EXPECT_TRUE(at::equal(y.view({2}), at::tensor({-1.0f, 5.0f})));
  EXPECT_TRUE(at::equal(out_paddings, at::zeros({1, 2})));
  auto avg =
      Make<PoolingLayer>(PoolingLayer::Params(),
                         "window_shape : [2, 1]\nwindow_stride : [2, 1]\npooling_type : 'AVG'");
  at::Tensor paddings2 = at::tensor({0.0f, 0.0f, 0.0f, 1.0f}).view({1, 4});
  auto [ya, pa] = avg->FProp(avg->theta(), x, paddings2);
  EXPECT_FLOAT_EQ(ya.view({2})[0].item<float>(), -1.5f);
  EXPECT_FLOAT_EQ(ya.view({2})[1].item<float>(), 5.0f);  // the padded 7 is not averaged in
}

// A small model as nested Params: embedding -> transformer encoder -> softmax.

}  // namespace
}  // namespace glossa
