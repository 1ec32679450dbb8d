// Channels and GPipe: the pipelined stack against the same cells run one micro-batch at a time
// (and against the plain whole-batch stack without dropout), outputs and gradients, for 1, 2 and 4
// stages and 1, 2 and 4 micro-batches, dropout off and on; accumulators, failures, validation.
#include "glossa/layers/gpipe.h"
#include "glossa/layers/gpipe_transformer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <atomic>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/channel.h"
#include "glossa/layers/dropout.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/block.h"
#include "glossa/layers/moe.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/summary/summary.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(Channel, DeliversInOrderAcrossThreads) {
  Channel ch("a->b", at::kFloat, {2}, "a", "b");
  std::thread sender([&] {
    for (int i = 0; i < 50; ++i) ch.Send(at::full({2}, static_cast<double>(i)));
  });
  for (int i = 0; i < 50; ++i) EXPECT_EQ(ch.Recv()[0].item<double>(), i);
  sender.join();
}

TEST(Channel, ChecksDtypeAndShapeAndUnblocksOnClose) {
  Channel ch("enc->dec", at::kFloat, {2, 3}, "enc", "dec");
  EXPECT_ERROR_CONTAINS(ch.Send(at::zeros({2, 4})), InvalidArgumentError,
                        "channel 'enc->dec' (enc -> dec) carries Float[2, 3], got Float[2, 4]");
  EXPECT_ERROR_CONTAINS(ch.Send(at::zeros({2, 3}, at::kDouble)), InvalidArgumentError,
                        "got Double[2, 3]");
  std::atomic<bool> threw{false};
  std::thread receiver([&] {
    try {
      ch.Recv();
    } catch (const AbortedError& e) {
      threw = std::string(e.what()).find("stage 1 failed") != std::string::npos;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ch.Close("stage 1 failed");
  receiver.join();
  EXPECT_TRUE(threw);
}

constexpr int64_t kLayers = 4, kDim = 8;

Params StackParams(int64_t stages, int64_t micro_batches, double dropout) {
  Params p = GPipeTransformerStack::Params();
  p.Set("name", "gpipe").Set("random_seed", 9).Set("dtype", DType::kFloat64);
  p.Set("num_layers", kLayers).Set("mdl_dim", kDim).Set("num_atten_heads", 2).Set("hidden_dim", 16);
  p.Set("mask_self_atten", true).Set("dropout_prob", dropout);
  p.Set("splits", stages).Set("num_micro_batches", micro_batches);
  return p;
}

struct Result {
  std::vector<at::Tensor> tensors;  // y, dx, then every weight gradient
};

// Forward and backward of `forward` at global step 3; the loss weights are fixed.
Result ForwardBackward(
    const NestedMap& theta, const at::Tensor& x,
    const std::function<at::Tensor(const NestedMap&, const at::Tensor&)>& forward) {
  GlobalStepContext step(3);
  at::Tensor xin = x.detach().requires_grad_(true);
  at::Tensor y = forward(theta, xin);
  at::Tensor w = at::cos(at::arange(y.numel(), at::kDouble)).view(y.sizes());
  std::vector<at::Tensor> wrt = {xin};
  for (const auto& t : theta.FlattenTensors()) wrt.push_back(t);
  Result r;
  r.tensors.push_back(y.detach());
  for (auto& g : torch::autograd::grad({(y * w).sum()}, wrt)) r.tensors.push_back(g);
  return r;
}

// The reference: the same cells, one micro-batch at a time on this thread, with the pipeline's
// seeds (overwrite global step = step · M + t, each cell from the seed of its name).
at::Tensor Reference(const PipeliningLayer& layer, const NestedMap& theta, const at::Tensor& x,
                     const at::Tensor& paddings, int64_t m) {
  const int64_t size = x.size(0) / m;
  const auto cells = layer.GetChildren("cells");
  const auto& thetas = theta.at("cells").AsList();
  std::vector<at::Tensor> outs;
  for (int64_t t = 0; t < m; ++t) {
    SetOverWriteGlobalStep(GetGlobalStep() * m + t);
    at::Tensor h = x.narrow(0, t * size, size);
    for (size_t c = 0; c < cells.size(); ++c) {
      ResetStepSeed(GenerateSeedFromName(cells[c]->path()));
      h = static_cast<const TransformerLayer*>(cells[c])
              ->FProp(thetas[c].AsMap(), h, paddings.narrow(0, t * size, size))
              .first;
    }
    ClearOverWriteGlobalStep();
    outs.push_back(h);
  }
  return at::cat(outs, 0);
}

void ExpectSame(const Result& a, const Result& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_TRUE(at::allclose(a.tensors[i], b.tensors[i], 1e-10, 1e-12)) << "tensor " << i;
  }
}

TEST(GPipeTransformerStack, MatchesTheCellsRunMicroBatchByMicroBatch) {
  at::Tensor x = at::randn({4, 5, kDim}, at::kDouble);
  at::Tensor paddings = at::zeros({4, 5});
  paddings[1][4] = 1.0;
  paddings[3][3] = 1.0;
  for (double dropout : {0.0, 0.3}) {
    for (int64_t stages : {1, 2, 4}) {
      for (int64_t m : {1, 2, 4}) {
        SCOPED_TRACE(StrCat("dropout ", dropout, " stages ", stages, " micro-batches ", m));
        auto layer = InstantiateLayer<GPipeTransformerStack>(StackParams(stages, m, dropout));
        ASSERT_EQ(layer->num_stages(), stages);
        NestedMap theta = layer->theta();
        Result piped = ForwardBackward(theta, x, [&](const NestedMap& th, const at::Tensor& in) {
          return layer->FProp(th, in, paddings);
        });
        Result ref = ForwardBackward(theta, x, [&](const NestedMap& th, const at::Tensor& in) {
          return Reference(*layer, th, in, paddings, m);
        });
        ExpectSame(piped, ref);
        if (dropout == 0.0) {
          // Without dropout, also the plain stack on the whole batch.
          Result whole = ForwardBackward(theta, x, [&](const NestedMap& th, const at::Tensor& in) {
            return Reference(*layer, th, in, paddings, 1);
          });
          ExpectSame(piped, whole);
        }
      }
    }
  }
  // Dropout is on, and its masks differ per micro-batch: 1 and 2 micro-batches differ.
  auto one = InstantiateLayer<GPipeTransformerStack>(StackParams(2, 1, 0.3));
  auto two = InstantiateLayer<GPipeTransformerStack>(StackParams(2, 2, 0.3));
  GlobalStepContext step(3);
  EXPECT_FALSE(
      at::allclose(one->FProp(one->theta(), x, paddings), two->FProp(two->theta(), x, paddings)));
}

// TransformerStack's splits: any stages and micro-batching give splits 1's outputs and gradients,
// dropout on (each layer draws from its own seed and a micro-batch its rows of the whole batch's
// masks); a batch num_micro_batches does not divide runs as the most micro-batches that do.
TEST(TransformerStackSplits, LeaveTheMathAsItWas) {
  auto stack = [](const ParamValue& splits, int64_t m) {
    Params p = TransformerStack::Params();
    p.Set("name", "stack").Set("random_seed", 9).Set("dtype", DType::kFloat64);
    p.Set("num_layers", kLayers).Set("mdl_dim", kDim).Set("num_atten_heads", 2);
    p.Set("hidden_dim", 16).Set("mask_self_atten", true).Set("dropout_prob", 0.3);
    p.Set("splits", splits).Set("num_micro_batches", m);
    return InstantiateLayer<TransformerStack>(p);
  };
  auto whole = stack(ParamValue(int64_t{1}), 1);
  const NestedMap theta = whole->theta();
  EXPECT_TRUE(whole->RemoteScopes().empty());
  for (const int64_t batch : {int64_t{4}, int64_t{6}}) {
    at::Tensor x = at::randn({batch, 5, kDim}, at::kDouble);
    at::Tensor paddings = at::zeros({batch, 5});
    paddings[1][4] = 1.0;
    const Result ref = ForwardBackward(theta, x, [&](const NestedMap& th, const at::Tensor& in) {
      return whole->FProp(th, in, paddings);
    });
    for (const auto& [splits, m] :
         std::vector<std::pair<ParamValue, int64_t>>{{ParamValue(int64_t{2}), 2},
                                                     {ParamValue(int64_t{4}), 4},
                                                     {ParamValue(ParamValue::List{
                                                          ParamValue(int64_t{1}),
                                                          ParamValue(int64_t{4})}),
                                                      1}}) {
      SCOPED_TRACE(StrCat("batch ", batch, ", splits ", splits.is_list() ? std::string("[1, 4]") : StrCat(splits.AsInt()), ", ", m, " micro-batches"));
      auto piped = stack(splits, m);
      ExpectSame(ForwardBackward(theta, x, [&](const NestedMap& th, const at::Tensor& in) {
                   return piped->FProp(th, in, paddings);
                 }),
                 ref);
    }
  }
  // The masks are on: another step draws others.
  at::Tensor x = at::randn({4, 5, kDim}, at::kDouble);
  at::Tensor a, b;
  {
    GlobalStepContext step(1);
    a = whole->FProp(theta, x);
  }
  {
    GlobalStepContext step(2);
    b = whole->FProp(theta, x);
  }
  EXPECT_FALSE(at::allclose(a, b));
  Params bad = TransformerStack::Params();
  bad.Set("name", "s").Set("num_layers", 2).Set("mdl_dim", 8).Set("has_aux_atten", true);
  bad.Set("splits", 2);
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerStack>(bad), InvalidArgumentError,
                        "take no cross-attention inputs");
}

// MoE layers inside a pipeline (Lingvo composes GPipe and GShard): each micro-batch routes its own
// groups and its cells' aux losses leave the pipeline as one loss, the micro-batches' mean of the
// stages' sums, whose gradient the backward's recompute re-injects. So a stack of [dense, MoE,
// dense, MoE] layers pipelined over 2 stages of 2 micro-batches with g groups each gives splits
// 1's outputs, aux loss and gradients (of y·w + 3·aux) over the whole batch in 2g groups (the
// same groups), residual and attention dropout on. The aux loss's gradient counts: without it the
// gate's gradient differs.
TEST(TransformerStackSplits, MoeLayersCarryTheirAuxLossOutOfThePipeline) {
  auto stack = [](int64_t splits, int64_t m, int64_t groups) {
    Params p = TransformerStack::Params();
    p.Set("name", "stack").Set("random_seed", 9).Set("dtype", DType::kFloat64);
    p.Set("num_layers", 4).Set("mdl_dim", kDim).Set("num_atten_heads", 2);
    p.Set("hidden_dim", 16).Set("mask_self_atten", true).Set("dropout_prob", 0.3);
    Params dense = TransformerStack::Params().GetParams("transformer_layer_params_tpl").Copy();
    Params moe = dense.Copy();
    moe.Set("tr_fflayer_tpl", TransformerShardedMoeLayer::Params()
                                  .Set("hidden_dim", 12)
                                  .Set("num_experts", 4)
                                  .Set("num_groups", groups)
                                  .Set("expert_capacity_factor", 1.5)
                                  .Set("residual_dropout_prob", 0.3));
    p.Set("transformer_layer_params_tpl", ParamValue::List{dense, moe, dense, moe});
    p.Set("splits", splits).Set("num_micro_batches", m);
    return InstantiateLayer<TransformerStack>(p);
  };
  auto run = [](const TransformerStack& s, const NestedMap& theta, const at::Tensor& x,
                const at::Tensor& paddings, double aux_weight) {
    GlobalStepContext step(3);
    AuxLossContext aux;
    const at::Tensor y = s.FProp(theta, x, paddings);
    EXPECT_FALSE(aux.losses().empty());
    const at::Tensor a = aux.Sum();
    const at::Tensor w = at::cos(at::arange(y.numel(), at::kDouble)).view(y.sizes());
    const std::vector<at::Tensor> wrt = theta.FlattenTensors();
    Result r;
    r.tensors = {y.detach(), a.detach()};
    for (auto& g : torch::autograd::grad({(y * w).sum() + aux_weight * a}, wrt)) {
      r.tensors.push_back(g);
    }
    return r;
  };
  auto whole = stack(1, 1, 4);
  auto piped = stack(2, 2, 2);
  EXPECT_EQ(piped->theta().FlattenTensors().size(), whole->theta().FlattenTensors().size());
  NestedMap theta = whole->theta();
  for (auto& t : theta.FlattenTensors()) t.requires_grad_(true);
  at::manual_seed(4);
  const at::Tensor x = at::randn({4, 6, kDim}, at::kDouble);
  at::Tensor paddings = at::zeros({4, 6});
  paddings[3][5] = 1.0;
  const Result ref = run(*whole, theta, x, paddings, 3.0);
  EXPECT_GT(ref.tensors[1].item<double>(), 0.0);
  ExpectSame(run(*piped, theta, x, paddings, 3.0), ref);
  // The aux loss's gradient is in there: without it some gradient (the gates') differs.
  const Result no_aux = run(*whole, theta, x, paddings, 0.0);
  bool differs = false;
  for (size_t i = 2; i < ref.tensors.size(); ++i) {
    differs = differs || !at::allclose(ref.tensors[i], no_aux.tensors[i], 1e-10, 1e-12);
  }
  EXPECT_TRUE(differs);
}

// Without gradients in one process a pipelined stack runs its cells in order on the calling thread
// over the whole batch, as splits 1 does (what eval, decode and bundles run, from the training
// Params): the same outputs, and packed inputs, which a pipeline refuses, are taken.
TEST(TransformerStackSplits, WithoutGradientsTheCellsRunInOrderAsSplitsOne) {
  auto make = [](int64_t splits) {
    Params p = TransformerStack::Params();
    p.Set("name", "s").Set("num_layers", 4).Set("mdl_dim", 8).Set("hidden_dim", 16);
    p.Set("num_atten_heads", 2).Set("random_seed", 3).Set("splits", splits);
    p.Set("num_micro_batches", 2);
    return InstantiateLayer<TransformerStack>(p);
  };
  auto piped = make(2), whole = make(1);
  at::manual_seed(1);
  const at::Tensor x = at::randn({4, 5, 8});
  const at::Tensor paddings = at::zeros({4, 5});
  const at::Tensor segments = at::tensor({1, 1, 2, 2, 2}).repeat({4, 1});
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(piped->FProp(piped->theta(), x, paddings),
                        whole->FProp(whole->theta(), x, paddings)));
  EXPECT_TRUE(at::equal(
      piped->FProp(piped->theta(), x, paddings, {}, {}, segments),
      whole->FProp(whole->theta(), x, paddings, {}, {}, segments)));
  at::AutoGradMode grad(true);
  EXPECT_ERROR_CONTAINS(piped->FProp(piped->theta(), x, paddings, {}, {}, segments),
                        FailedPreconditionError, "cannot run in a pipeline");
}

TEST(GPipeTransformerStack, SplitsAsEndIndices) {
  Params p = StackParams(1, 2, 0.0);
  p.Set("splits", ParamValue::List{ParamValue(int64_t{1}), ParamValue(int64_t{4})});
  auto layer = InstantiateLayer<GPipeTransformerStack>(p);
  EXPECT_EQ(layer->stage_ends(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(InstantiateLayer<GPipeTransformerStack>(StackParams(3, 1, 0.0))->stage_ends(),
            (std::vector<int64_t>{2, 3, 4}));
}

TEST(GPipeTransformerStack, RejectsBadSplitsAndMicroBatches) {
  Params p = StackParams(1, 1, 0.0);
  p.Set("splits", ParamValue::List{ParamValue(int64_t{2}), ParamValue(int64_t{2})});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<GPipeTransformerStack>(p), InvalidArgumentError,
                        "splits must be increasing and > 0, got 2 after 2");
  p.Set("splits", ParamValue::List{ParamValue(int64_t{1}), ParamValue(int64_t{3})});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<GPipeTransformerStack>(p), InvalidArgumentError,
                        "the last split must equal num_layers 4, got 3");
  EXPECT_ERROR_CONTAINS(InstantiateLayer<GPipeTransformerStack>(StackParams(5, 1, 0.0)),
                        InvalidArgumentError, "splits must be in [1, num_layers 4], got 5");
  auto three = InstantiateLayer<GPipeTransformerStack>(StackParams(2, 3, 0.0));
  EXPECT_ERROR_CONTAINS(three->FProp(three->theta(), at::randn({4, 5, kDim}, at::kDouble)),
                        InvalidArgumentError, "the batch 4 does not split into 3 micro-batches");
  Params q = StackParams(2, 3, 0.0);
  q.Set("micro_batch_size", 2);
  auto mbs = InstantiateLayer<GPipeTransformerStack>(q);
  EXPECT_ERROR_CONTAINS(mbs->FProp(mbs->theta(), at::randn({4, 5, kDim}, at::kDouble)),
                        InvalidArgumentError,
                        "micro_batch_size 2 x num_micro_batches 3 does not match the batch 4");
  q.Set("num_micro_batches", 1);  // micro_batch_size alone sets the count: 4 / 2
  auto ok = InstantiateLayer<GPipeTransformerStack>(q);
  EXPECT_EQ(ok->FProp(ok->theta(), at::randn({4, 5, kDim}, at::kDouble)).sizes(),
            (std::vector<int64_t>{4, 5, kDim}));
}

// A cell that multiplies by a weight, counts its calls in an accumulator and can fail.
class CountingAccumulator : public Accumulator {
 public:
  at::Tensor DefaultValue() const override { return at::zeros({}); }
};

class CountingCell : public BaseLayer, public Block {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseLayer::Params();
    p.Set("cls", ClsOf<CountingCell>());
    p.Define("fail_after", -1, "Throw on this many-th call (-1: never).");
    p.Define("fail_in_replay", false, "Throw when called with accumulators disabled.");
    p.Define("plain_dropout", false, "Hold a plain DropoutLayer child (keep_prob 0.5).");
    return p;
  }
  explicit CountingCell(const glossa::Params& p) : BaseLayer(p) {
    CreateVariable("w", WeightParams({3}, WeightInit::Constant(2.0)));
    RegisterAccumulator("count", std::make_unique<CountingAccumulator>());
    fail_after_ = p.GetInt("fail_after");
    fail_in_replay_ = p.GetBool("fail_in_replay");
    if (params().GetBool("plain_dropout")) {
      CreateChild("dropout", DropoutLayer::Params().Set("keep_prob", 0.5));
    }
  }
  at::Tensor FProp(const NestedMap& theta, const at::Tensor& x) const {
    Accumulator& acc = GetAccumulator("count");
    acc.SetValue(acc.GetValue() + 1);
    summary::Scalar("cell_calls", 1.0, SummaryReduce::kSum);
    if (++calls_ == fail_after_ || (fail_in_replay_ && acc.IsDisabled())) {
      throw InternalError(StrCat("cell '", path(), "' failed"));
    }
    return x * theta.GetTensor("w");
  }
  at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                        const at::Tensor&) const override {
    return FProp(theta, x);
  }

 private:
  mutable std::atomic<int64_t> calls_{0};
  int64_t fail_after_;
  bool fail_in_replay_;
};
GLOSSA_REGISTER_CLASS(CountingCell, "glossa.testing.CountingCell");

std::unique_ptr<PipeliningLayer> CountingPipeline(int64_t fail_after, bool fail_in_replay = false) {
  ParamValue::List cells;
  for (int i = 0; i < 3; ++i) {
    cells.push_back(
        CountingCell::Params().Set("fail_after", fail_after).Set("fail_in_replay", fail_in_replay));
  }
  Params p = PipeliningLayer::Params();
  p.Set("name", "pipe").Set("cell_tpl", cells).Set("num_stages", 2).Set("num_micro_batches", 3);
  return InstantiateLayer<PipeliningLayer>(p);
}

TEST(PipeliningLayer, AccumulatorsCountOncePerMicroBatch) {
  auto pipe = CountingPipeline(-1);
  EXPECT_EQ(pipe->stage_ends(), (std::vector<int64_t>{2, 3}));
  at::Tensor x = at::ones({6, 3}).requires_grad_(true);
  at::Tensor y = pipe->FProp(pipe->theta(), x);
  EXPECT_TRUE(at::allclose(y, at::full({6, 3}, 8.0)));
  y.sum().backward();  // recomputes every stage: accumulators must not count again
  EXPECT_TRUE(at::allclose(x.grad(), at::full({6, 3}, 8.0)));
  const NestedMap acc = pipe->GetAccumulatorValues();
  for (const auto& v : acc.at("cells").AsList()) {
    EXPECT_EQ(v.AsMap().GetTensor("count").item<double>(), 3.0);
  }
}

TEST(PipeliningLayer, SummariesFromStageThreadsReachTheCallersContext) {
  auto pipe = CountingPipeline(-1);
  SummaryContext ctx;
  at::Tensor x = at::ones({6, 3}).requires_grad_(true);
  {
    SummaryNameScope scope("outer");
    SummaryLoop loop;
    at::Tensor y = pipe->FProp(pipe->theta(), x);
    y.sum().backward();  // the recompute records nothing
  }
  const auto all = ctx.MergeAll();
  ASSERT_TRUE(all.count("cell_calls/outer"));
  EXPECT_EQ(all.at("cell_calls/outer").item<double>(), 9.0);  // 3 cells x 3 micro-batches
}

TEST(PipeliningLayer, OneSummaryValuePerPipelineCallOutsideALoop) {
  auto pipe = CountingPipeline(-1);
  SummaryContext ctx;
  pipe->FProp(pipe->theta(), at::ones({6, 3}));
  // The micro-batches reduce as a loop: 9 calls summed, not the last micro-batch's value.
  const auto all = ctx.MergeAll();
  ASSERT_TRUE(all.count("cell_calls/"));
  EXPECT_EQ(all.at("cell_calls/").item<double>(), 9.0);
}

TEST(PipeliningLayer, AFailingStageFailsTheCallWithoutHanging) {
  auto pipe = CountingPipeline(2);  // every cell throws on its second micro-batch
  EXPECT_ERROR_CONTAINS(pipe->FProp(pipe->theta(), at::ones({6, 3})), InternalError, "failed");
}

TEST(PipeliningLayer, AFailureInTheBackwardFailsItAndLeavesAccumulatorsWorking) {
  auto pipe = CountingPipeline(-1, /*fail_in_replay=*/true);  // the backward's recompute throws
  at::Tensor x = at::ones({6, 3}).requires_grad_(true);
  at::Tensor y = pipe->FProp(pipe->theta(), x);
  EXPECT_ERROR_CONTAINS(y.sum().backward(), InternalError, "failed");
  // The accumulators were re-enabled: another forward counts, and does not fail.
  pipe->FProp(pipe->theta(), at::ones({6, 3}));
  const NestedMap acc = pipe->GetAccumulatorValues();
  for (const auto& v : acc.at("cells").AsList()) {
    EXPECT_EQ(v.AsMap().GetTensor("count").item<double>(), 6.0);
  }
}

TEST(PipeliningLayer, FreesItsSavedBoundariesWithTheGraph) {
  auto pipe = CountingPipeline(-1);
  at::Tensor x = at::ones({6, 3}).requires_grad_(true);
  std::weak_ptr<torch::autograd::Node> node;
  {
    at::Tensor y = pipe->FProp(pipe->theta(), x);
    node = y.grad_fn();
    y.sum().backward();
  }
  EXPECT_TRUE(node.expired());
}

TEST(PipeliningLayer, RejectsBlocksThatCannotBeReplayed) {
  // A MoE cell is taken: the pipeline carries its aux loss out (TransformerStackSplits,
  // MoeLayersCarryTheirAuxLossOutOfThePipeline); RevNet, which cannot, refuses it (revnet_test).
  Params moe = TransformerShardedMoeLayer::Params();
  moe.Set("input_dim", 4).Set("hidden_dim", 8).Set("num_experts", 2);
  Params p = PipeliningLayer::Params();
  p.Set("name", "pipe").Set("cell_tpl", ParamValue::List{ParamValue(moe)});
  EXPECT_NO_THROW(InstantiateLayer<PipeliningLayer>(p));
  p.Set("cell_tpl",
        ParamValue::List{ParamValue(CountingCell::Params().Set("plain_dropout", true))});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<PipeliningLayer>(p), InvalidArgumentError,
                        "cannot be inside pipeline 'pipe': plain dropout draws new masks");
  // Plain dropout is a block of a SequentialLayer, which runs once, but not inside a replaying
  // pipeline, however deep.
  Params seq = SequentialLayer::Params().Set(
      "sub", ParamValue::List{ParamValue(DropoutLayer::Params().Set("keep_prob", 0.5))});
  seq.Set("name", "seq");
  EXPECT_NO_THROW(InstantiateLayer<SequentialLayer>(seq));
  p.Set("cell_tpl", ParamValue::List{ParamValue(seq)});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<PipeliningLayer>(p), InvalidArgumentError,
                        "cannot be inside pipeline 'pipe': plain dropout draws new masks");
}

TEST(PipeliningLayer, PaddingsMustFollowTheBatch) {
  auto layer = InstantiateLayer<GPipeTransformerStack>(StackParams(2, 2, 0.0));
  EXPECT_ERROR_CONTAINS(
      layer->FProp(layer->theta(), at::randn({4, 5, kDim}, at::kDouble), at::zeros({2, 5})),
      InvalidArgumentError, "paddings must have the batch (4) as dim 0");
}

TEST(PipeliningLayer, RejectsCellsThatAreNotBlocksOrPipelines) {
  Params p = PipeliningLayer::Params();
  p.Set("name", "pipe").Set("cell_tpl", ParamValue::List{EmbeddingLayer::Params()
                                                               .Set("vocab_size", 4)
                                                               .Set("embedding_dim", 3)});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<PipeliningLayer>(p), InvalidArgumentError,
                        "cannot be a block of pipeline 'pipe': its class does not implement the "
                        "Block interface");
  // A pipeline is a block (of a SequentialLayer, say), but not a cell of another pipeline.
  const Params inner =
      PipeliningLayer::Params().Set("cell_tpl", ParamValue::List{CountingCell::Params()});
  Params seq = SequentialLayer::Params().Set("sub", ParamValue::List{inner});
  seq.Set("name", "seq");
  auto s = InstantiateLayer<SequentialLayer>(seq);
  EXPECT_TRUE(at::allclose(s->FProp(s->theta(), at::ones({2, 3})), at::full({2, 3}, 2.0)));
  p.Set("cell_tpl", ParamValue::List{inner});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<PipeliningLayer>(p), InvalidArgumentError,
                        "cannot be inside pipeline 'pipe': a pipeline's stage threads");
}

}  // namespace
}  // namespace glossa
