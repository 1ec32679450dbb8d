// ProjectionLayer: validation, padded rows and gradients.
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

TEST(Projection, ValidatesParamsAndShapes) {
  EXPECT_ERROR_CONTAINS(
      Make<ProjectionLayer>(ProjectionLayer::Params(),
                            "input_dim : 2\noutput_dim : 3\nactivation : 'RELUU'"),
      InvalidArgumentError, "unknown activation RELUU (did you mean: [LEAKY_RELU,RELU,RELU6])");
  EXPECT_THROW(Make<ProjectionLayer>(ProjectionLayer::Params(), "input_dim : 0\noutput_dim : 3"),
               InvalidArgumentError);
  auto fc = Make<FCLayer>(FCLayer::Params(), "input_dim : 2\noutput_dim : 3");
  EXPECT_TRUE(fc->params().GetBool("has_bias"));
  EXPECT_ERROR_CONTAINS(fc->FProp(fc->theta(), at::randn({4, 3})), InvalidArgumentError,
                        "inputs must end in input_dim 2");
}

TEST(Projection, PaddedRowsAreZeroAndUnpaddedBatchesPassGradientsThrough) {
  auto fc = Make<FCLayer>(FCLayer::Params(), "input_dim : 2\noutput_dim : 3\nactivation : 'NONE'");
  at::Tensor x = at::randn({2, 4, 2});
  at::Tensor none = at::zeros({2, 4}), some = none.clone();
  some[1][3] = 1.0;
  at::Tensor y = fc->FProp(fc->theta(), x, some);
  EXPECT_TRUE(at::equal(y[1][3], at::zeros({3})));
  EXPECT_TRUE(at::equal(y[0], fc->FProp(fc->theta(), x, none)[0]));
  EXPECT_FALSE(at::equal(fc->FProp(fc->theta(), x, none)[1][3], at::zeros({3})));
  // No padding: the same values and weight gradient as with no paddings at all.
  at::Tensor w = fc->theta().GetTensor("w");
  at::Tensor g0 = torch::autograd::grad({fc->FProp(fc->theta(), x, none).square().sum()}, {w})[0];
  at::Tensor g1 = torch::autograd::grad({fc->FProp(fc->theta(), x, {}).square().sum()}, {w})[0];
  EXPECT_TRUE(at::equal(g0, g1));
}

}  // namespace
}  // namespace glossa
