// EmbeddingLayer: out-of-range and float ids are errors.
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

TEST(Embedding, RejectsOutOfRangeAndFloatIds) {
  auto emb = Make<EmbeddingLayer>(EmbeddingLayer::Params(), "vocab_size : 5\nembedding_dim : 2");
  EXPECT_EQ(emb->EmbLookup(emb->theta(), at::tensor({0, 4}, at::kLong).view({1, 2})).sizes(),
            (std::vector<int64_t>{1, 2, 2}));
  EXPECT_ERROR_CONTAINS(emb->EmbLookup(emb->theta(), at::tensor({5}, at::kLong)),
                        InvalidArgumentError, "ids must be in [0, 5), found 5");
  EXPECT_ERROR_CONTAINS(emb->EmbLookup(emb->theta(), at::tensor({-1}, at::kLong)),
                        InvalidArgumentError, "found -1");
  EXPECT_ERROR_CONTAINS(emb->EmbLookup(emb->theta(), at::tensor({1.0})), InvalidArgumentError,
                        "ids must be integers");
}

// FProp(seq_length) reads rows of a table the layer keeps: they are the signal FPropWithPosition
// computes for those positions, bit for bit, as the table grows, in each fprop dtype.
TEST(PositionalEmbedding, TableRowsAreTheComputedSignalBitForBit) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    glossa::Params p = PositionalEmbeddingLayer::Params();
    p.Set("fprop_dtype", dtype);
    auto pos = Make<PositionalEmbeddingLayer>(p, "embedding_dim : 9");
    for (const int64_t n : {0, 5, 64, 65, 300, 7, 130}) {
      const at::Tensor got = pos->FProp(pos->theta(), n);
      const at::Tensor want = pos->FPropWithPosition(pos->theta(), at::arange(n, at::kFloat));
      ASSERT_EQ(got.sizes(), want.sizes()) << n;
      EXPECT_EQ(got.scalar_type(), dtype == DType::kFloat32 ? at::kFloat : at::kBFloat16);
      EXPECT_TRUE(at::equal(got, want)) << n;
    }
  }
  auto pos = Make<PositionalEmbeddingLayer>(PositionalEmbeddingLayer::Params(), "embedding_dim : 4");
  EXPECT_ERROR_CONTAINS(pos->FProp(pos->theta(), -1), InvalidArgumentError, "seq_length -1 < 0");
}

}  // namespace
}  // namespace glossa
