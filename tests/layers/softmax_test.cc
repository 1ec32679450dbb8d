// SimpleFullSoftmax: class probabilities and validation.
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

TEST(SimpleFullSoftmax, ClassProbabilitiesAndValidation) {
  auto sm = Make<SimpleFullSoftmax>(SimpleFullSoftmax::Params(), "input_dim : 4\nnum_classes : 3");
  at::Tensor x = at::randn({2, 4});
  at::Tensor ids = at::tensor({2, 0}, at::kLong);
  NestedMap by_ids = sm->FProp(sm->theta(), x, ids);
  at::Tensor probs = at::one_hot(ids, 3).to(at::kFloat);
  NestedMap by_probs = sm->FProp(sm->theta(), x, {}, {}, {}, probs);
  EXPECT_TRUE(
      at::allclose(by_ids.GetTensor("per_example_xent"), by_probs.GetTensor("per_example_xent")));
  EXPECT_EQ(by_ids.GetTensor("total_weight").item<double>(), 2.0);
  EXPECT_ERROR_CONTAINS(sm->FProp(sm->theta(), x, at::tensor({3, 0}, at::kLong)),
                        InvalidArgumentError, "class_ids must be in [0, 3)");
  EXPECT_ERROR_CONTAINS(sm->FProp(sm->theta(), x, ids, {}, {}, probs), InvalidArgumentError,
                        "exactly one of");
  EXPECT_ERROR_CONTAINS(sm->FProp(sm->theta(), x, at::tensor({1}, at::kLong)), InvalidArgumentError,
                        "class_ids must be integers shaped");
}

}  // namespace
}  // namespace glossa
