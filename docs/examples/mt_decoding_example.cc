// docs/mt.md's incremental decoding: the three calls a search makes, here in a greedy decoder of a
// small untrained mt::TransformerModel, checked against the teacher-forced forward pass.
// Compiled into the test binary (tests/CMakeLists.txt).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "glossa/tasks/mt/mt.h"

namespace {

using glossa::NestedMap;

TEST(DocsExample, IncrementalDecodingStepByStep) {
  glossa::Params p = glossa::mt::TransformerModel::CommonParams(/*vocab_size=*/20, 16, 32, 2, 2);
  p.Set("name", "mt").Set("random_seed", 5);
  auto model = glossa::InstantiateLayer<glossa::mt::TransformerModel>(p);
  glossa::EvalModeScope eval_mode;
  at::NoGradGuard no_grad;
  // Two sources of 6 tokens (the second padded after 4), one hypothesis each.
  const NestedMap src{{"ids", at::randint(3, 20, {2, 6}, at::kLong)},
                      {"paddings", at::cat({at::zeros({1, 6}), at::zeros({1, 6}).index_fill_(
                                                                   1, at::arange(4, 6), 1.0)})}};
  const int64_t num_hyps = 2;
  const glossa::mt::TransformerDecoder* decoder = &model->decoder();
  const NestedMap model_theta = model->theta();
  const NestedMap& theta = model_theta.GetItem("decoder").AsMap();
  const NestedMap encoder_outputs =
      model->encoder().FProp(model_theta.GetItem("encoder").AsMap(), src);
  at::Tensor ids = at::full({num_hyps}, 1, at::kLong);  // <s>
  int64_t step = 0;
  const NestedMap source = decoder->PrecomputeSource(theta, encoder_outputs, num_hyps);
  NestedMap states = decoder->InitDecodeStates(num_hyps);       // per-layer k/v caches, preallocated
  auto [log_probs, next] = decoder->ExtendStep(theta, source, ids, step, states);  // [N, V]
  // Greedy: the best token is the next step's input; the caches grow by one position a step.
  std::vector<at::Tensor> inputs{ids}, step_log_probs{log_probs};
  for (step = 1; step < 4; ++step) {
    ids = step_log_probs.back().argmax(-1);
    inputs.push_back(ids);
    states = next;
    std::tie(log_probs, next) = decoder->ExtendStep(theta, source, ids, step, states);
    step_log_probs.push_back(log_probs);
  }
  EXPECT_EQ(log_probs.sizes(), (std::vector<int64_t>{num_hyps, 20}));
  // The same tokens through the teacher-forced forward pass give the same log-probs.
  const at::Tensor prefix = at::stack(inputs, 1);
  const at::Tensor full = at::log_softmax(
      decoder->Logits(theta, encoder_outputs, prefix, at::zeros({num_hyps, 4})), -1);
  for (int64_t t = 0; t < 4; ++t) {
    EXPECT_TRUE(at::allclose(step_log_probs[t], full.select(1, t), 1e-5, 1e-5)) << "step " << t;
  }
}

}  // namespace
