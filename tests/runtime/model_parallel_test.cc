// Tensor parallelism on a 'model' mesh axis (issue 49): the Transformer's heads and feed-forward
// hidden units split over the ranks by the weight_split_dims_mapping in its Params, with one
// all-reduce per block on c10d. Ranks are threads of this process (tests/runtime/workers.h), each
// with its own Gloo process group, as processes would have; tests/tools/distributed_test.sh runs
// them as processes.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/mesh.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/gradient_sync.h"
#include "glossa/runtime/mesh.h"
#include "glossa/runtime/parallel_plan.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "tests/runtime/workers.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

// A 2-layer LM with 4 heads, 32 hidden units and 52 classes whose layers split all three over the
// 'model' axis (when `context` has one; whole otherwise), the embedding its rows and the softmax
// its classes (a sharded cross-entropy, with `label_smoothing`), dropout `dropout` at every site of its layers,
// Adam (or SGD, which a wrong gradient scale cannot hide from) with global-norm clipping.
std::unique_ptr<TransformerLmTask> TensorParallelLm(double dropout, bool sgd = false,
                                                    const BuildContext& context = BuildContext(),
                                                    int layers = 2, int splits = 1, int micro = 1,
                                                    double label_smoothing = 0) {
  Params p = TransformerLmTask::CommonParams(52, 16, 32, 4, layers);
  // The vocabulary too: the embedding's rows and the softmax's classes.
  p.Set("emb.weight_split_dims_mapping", WeightSplitMapping(2, 0, "model"));
  p.Set("softmax.weight_split_dims_mapping", WeightSplitMapping(2, 1, "model"));
  p.Set("softmax.label_smoothing", label_smoothing);
  p.Set("stack.splits", splits).Set("stack.num_micro_batches", micro);
  p.Set("name", "lm").Set("random_seed", 7);
  p.Set("train.learner.learning_rate", sgd ? 0.5 : 1e-2);
  p.Set("train.learner.lr_schedule", ConstantSchedule::Params());
  p.Set("train.learner.optimizer", sgd ? SGD::Params() : Adam::Params());
  p.Set("train.learner.clip_gradient_norm_to_value", 0.5);  // clipping sees the global gradient
  p.Set("stack.dropout_prob", dropout);
  TransformerLayer::SetTensorParallel(p.GetParams("stack.transformer_layer_params_tpl"), "model");
  return InstantiateLayer<TransformerLmTask>(p, context);
}

NestedMap Batch(const at::Tensor& ids) {
  return NestedMap{{"ids", ids},
                   {"labels", ids.roll(-1, 1)},
                   {"paddings", at::zeros({ids.size(0), ids.size(1)})}};
}

// Steps of `lm` on rows [lo, hi) of each batch; the losses (with `batch_group`, the weighted
// mean over its ranks).
std::vector<double> Train(TransformerLmTask& lm, const std::vector<at::Tensor>& batches, int64_t lo,
                          int64_t hi, Distributed* batch_group = nullptr) {
  const auto vars = LearnerVariables(lm);
  std::vector<double> losses;
  for (size_t s = 0; s < batches.size(); ++s) {
    GlobalStepContext ctx(static_cast<int64_t>(s));
    auto out = lm.FPropDefaultTheta(Batch(batches[s].slice(0, lo, hi)));
    double loss = out.metrics.at("loss").value.item<double>();
    if (batch_group != nullptr) {
      loss = batch_group->ReduceWeighted(
          {{"loss", {loss, out.metrics.at("loss").weight.item<double>()}}}).at("loss").first;
    }
    losses.push_back(loss);
    lm.learner().Apply({{"loss", Metric{out.loss, out.metrics.at("loss").weight}}}, vars,
                       static_cast<int64_t>(s));
  }
  return losses;
}

std::vector<at::Tensor> Batches(int steps, int rows, uint64_t seed) {
  std::vector<at::Tensor> out;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (int s = 0; s < steps; ++s) out.push_back(at::randint(3, 50, {rows, 12}, gen));
  return out;
}

struct RankRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> weights;
  std::map<std::string, bool> model_sharded;
};

// Each rank's weights against the one-process model's within 1e-5 relative: model-sharded ones
// this rank's block (`block(r)` of `m`), the rest whole. key/b is left out: its gradient cancels
// in the softmax up to rounding.
void ExpectWeights(const std::vector<LearnerVariable>& one, const std::vector<RankRun>& runs, int m,
                   const std::function<int(int)>& block) {
  for (const auto& v : one) {
    if (v.name.ends_with("key/b")) continue;
    const at::Tensor w = v.value.detach();
    for (int r = 0; r < static_cast<int>(runs.size()); ++r) {
      at::Tensor want = w;
      if (runs[r].model_sharded.at(v.name)) {
        const int64_t dim = ModelSplitDim(v.name, w.dim()), n = w.size(dim) / m;
        want = w.slice(dim, block(r) * n, block(r) * n + n);
      }
      const at::Tensor& got = runs[r].weights.at(v.name);
      ASSERT_EQ(got.sizes(), want.sizes()) << v.name << " on rank " << r;
      const double rel = ((got - want).abs().max() /
                          at::clamp_min(want.abs().max(), 1e-12)).item<double>();
      EXPECT_LT(rel, 1e-5) << v.name << " on rank " << r;
    }
  }
}

// A model axis that forgets to sum: the mutation the equivalence must catch.
class ForgetfulAxis : public MeshAxis {
 public:
  explicit ForgetfulAxis(MeshAxis& real) : real_(real) {}
  int size() const override { return real_.size(); }
  int index() const override { return real_.index(); }
  at::Tensor ExchangeBlocks(const at::Tensor& input) override { return real_.ExchangeBlocks(input); }
  void AllReduceSum(at::Tensor& t) override { (void)t; }

 private:
  MeshAxis& real_;
};

// model:2 and model:4 (every rank the whole batch of 8 rows, its 1/m of the heads and hidden
// units) train like the LM in one process: 20 Adam steps with global-norm clipping and dropout 0.1
// at every site (the attention weights' and hidden units' masks are each rank's block of the
// one-process masks), losses within 1e-6 and weights within 1e-5 relative; the split variables
// are 10 per layer (q, k and v w and b, post w, fc0 w and b, fc1 w) and 3 of the vocabulary, and
// they start as their block of
// the one-process initial values. A model axis whose all-reduce sums nothing diverges.
TEST(ModelParallel, HeadsAndHiddenUnitsOnRanksTrainLikeOneProcess) {
  const int steps = 20;
  const std::vector<at::Tensor> batches = Batches(steps, 8, 29);
  auto one = TensorParallelLm(0.1);
  const auto one_vars = LearnerVariables(*one);
  std::map<std::string, at::Tensor> init;
  for (const auto& v : one_vars) init[v.name] = v.value.detach().clone();
  const std::vector<double> one_losses = Train(*one, batches, 0, 8);
  EXPECT_LT(one_losses.back(), one_losses.front());
  for (const int m : {2, 4}) {
    SCOPED_TRACE(StrCat("model:", m));
    std::vector<RankRun> runs(m);
    RunWorkers(m, [&](Distributed& dist) {
      const int r = dist.rank();
      ParallelPlan plan(dist, StrCat("model:", m));
      DistributedMesh& mesh = plan.mesh();
      auto lm = TensorParallelLm(0.1, false, BuildContext().WithAxis("model", mesh.model_axis()));
      int split = 0;
      for (const auto& v : LearnerVariables(*lm)) {
        runs[r].model_sharded[v.name] = v.model_sharded;
        split += v.model_sharded;
        at::Tensor want = init.at(v.name);
        if (v.model_sharded) {
          const int64_t dim = ModelSplitDim(v.name, want.dim()), n = want.size(dim) / m;
          want = want.slice(dim, r * n, r * n + n);
        }
        EXPECT_TRUE(at::equal(v.value, want)) << v.name << " on rank " << r;
      }
      EXPECT_EQ(split, 2 * 10 + 3);
      auto sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, true);
      plan.Configure(*sync);
      lm->learner().SetGradientSync(sync);
      runs[r].losses = Train(*lm, batches, 0, 8);
      for (const auto& v : LearnerVariables(*lm)) runs[r].weights[v.name] = v.value.detach().clone();
      EXPECT_EQ(mesh.model_axis()->reductions() > 0, true);
    });
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(runs[0].losses[s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
      EXPECT_EQ(runs[m - 1].losses[s], runs[0].losses[s]) << "step " << s;
    }
    ExpectWeights(one_vars, runs, m, [](int r) { return r; });
  }
  // The mutation: the same ranks with an axis that does not sum.
  std::vector<double> forgetful(steps);
  RunWorkers(2, [&](Distributed& dist) {
    ParallelPlan plan(dist, "model:2");
    DistributedMesh& mesh = plan.mesh();
    ForgetfulAxis axis(*mesh.model_axis());
    auto lm = TensorParallelLm(0.1, false, BuildContext().WithAxis("model", &axis));
    auto sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, true);
    plan.Configure(*sync);
    lm->learner().SetGradientSync(sync);
    const auto losses = Train(*lm, batches, 0, 8);
    if (dist.rank() == 0) forgetful = losses;
  });
  EXPECT_GT(std::abs(forgetful[0] - one_losses[0]), 1e-3 * std::abs(one_losses[0]));
}

// The data × model mesh (--mesh=data:2,model:2): 4 ranks, rank r = 2d + m. Ranks {0, 1} and
// {2, 3} each hold the whole model once, split over their model axis, and read half of the batch;
// ranks {0, 2} and {1, 3} hold the same blocks and average their gradients. 20 steps with
// clipping and dropout 0.1 against one process, with Adam and with SGD: losses within 1e-6,
// weights within 1e-5.
TEST(ModelParallel, DataTimesModelMeshTrainsLikeOneProcess) {
  const int steps = 20;
  const std::vector<at::Tensor> batches = Batches(steps, 8, 31);
  for (const bool sgd : {false, true}) {
    SCOPED_TRACE(sgd ? "SGD" : "Adam");
    // Label smoothing in the SGD run (the sharded cross-entropy's sum over the classes).
    const double ls = sgd ? 0.1 : 0.0;
    auto one = TensorParallelLm(0.1, sgd, BuildContext(), 2, 1, 1, ls);
    const auto one_vars = LearnerVariables(*one);
    const std::vector<double> one_losses = Train(*one, batches, 0, 8);
    std::vector<RankRun> runs(4);
    RunWorkers(4, [&](Distributed& dist) {
      const int r = dist.rank();
      ParallelPlan plan(dist, "data:2,model:2");
      DistributedMesh& mesh = plan.mesh();
      EXPECT_EQ(mesh.model_index(), r % 2);
      EXPECT_EQ(mesh.batch_shard(), r / 2);
      BatchShardScope shard(mesh.batch_shard(), 2);  // as the trainer does
      auto lm = TensorParallelLm(0.1, sgd, BuildContext().WithAxis("model", mesh.model_axis()), 2,
                                 1, 1, ls);
      // Gradients reduced overlapped with the backward pass (Adam) and after it (SGD).
      auto sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, !sgd);
      plan.Configure(*sync);
      lm->learner().SetGradientSync(sync);
      const int d = mesh.batch_shard();
      runs[r].losses = Train(*lm, batches, 4 * d, 4 * d + 4, mesh.batch_group());
      for (const auto& v : LearnerVariables(*lm)) {
        runs[r].weights[v.name] = v.value.detach().clone();
        runs[r].model_sharded[v.name] = v.model_sharded;
      }
    });
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(runs[0].losses[s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
    }
    ExpectWeights(one_vars, runs, 2, [](int r) { return r % 2; });
    EXPECT_LT(one_losses.back(), one_losses.front());
  }
}

// The pipe × model and data × pipe × model meshes: the LM's 4 layers as 2 stages, each stage's
// heads and hidden units split over a model axis of 2 (rank r = (d·2 + s)·2 + m). A stage's
// layer norms are whole on both its model ranks; its projections are their blocks. 20 steps with
// clipping and dropout 0.1 (2 micro-batches per pipeline) against one process: losses within
// 1e-6, weights within 1e-5; each rank holds its stage's layers only.
TEST(ModelParallel, PipeTimesModelAndDataTimesPipeTimesModelTrainLikeOneProcess) {
  const int steps = 20;
  const std::vector<at::Tensor> batches = Batches(steps, 8, 37);
  auto one = TensorParallelLm(0.1, false, BuildContext(), 4);
  const auto one_vars = LearnerVariables(*one);
  const std::vector<double> one_losses = Train(*one, batches, 0, 8);
  for (const std::string mesh_text : {"pipe:2,model:2", "data:2,pipe:2,model:2"}) {
    SCOPED_TRACE(mesh_text);
    const MeshShape shape = ParseMesh(mesh_text, mesh_text[0] == 'd' ? 8 : 4);
    const int world = static_cast<int>(shape.world_size());
    std::vector<RankRun> runs(world);
    RunWorkers(world, [&](Distributed& dist) {
      const int r = dist.rank();
      ParallelPlan plan(dist, mesh_text);
      DistributedMesh& mesh = plan.mesh();
      BatchShardScope shard(mesh.batch_shard(), mesh.batch_shards());
      auto lm = TensorParallelLm(0.1, false,
                                 BuildContext().WithAxis("pipe", mesh.pipe_axis())
                                     .WithAxis("model", mesh.model_axis()),
                                 4, 2, 2);
      auto sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, true);
      plan.Configure(*sync);
      lm->learner().SetGradientSync(sync);
      const int rows = 8 / mesh.batch_shards(), b = mesh.batch_shard();
      runs[r].losses = Train(*lm, batches, rows * b, rows * b + rows, mesh.batch_group());
      for (const auto& v : LearnerVariables(*lm)) {
        runs[r].weights[v.name] = v.value.detach().clone();
        runs[r].model_sharded[v.name] = v.model_sharded;
      }
    }, 60);
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(runs[0].losses[s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
      EXPECT_EQ(runs[world - 1].losses[s], runs[0].losses[s]) << "step " << s;
    }
    for (const auto& v : one_vars) {
      if (v.name.ends_with("key/b")) continue;
      const int stage = LmStageOf(v.name, 2, 4);
      for (int r = 0; r < world; ++r) {
        const MeshShape::Coordinates c = shape.Of(r);
        const bool mine = stage < 0 || stage == c.pipe;
        ASSERT_EQ(runs[r].weights.count(v.name), mine ? 1u : 0u) << v.name << " on rank " << r;
        if (!mine) continue;
        at::Tensor want = v.value.detach();
        if (runs[r].model_sharded.at(v.name)) {
          const int64_t dim = ModelSplitDim(v.name, want.dim()), n = want.size(dim) / 2;
          want = want.slice(dim, c.model * n, c.model * n + n);
        }
        const at::Tensor& got = runs[r].weights.at(v.name);
        ASSERT_EQ(got.sizes(), want.sizes()) << v.name << " on rank " << r;
        const double rel = ((got - want).abs().max() /
                            at::clamp_min(want.abs().max(), 1e-12)).item<double>();
        EXPECT_LT(rel, 1e-5) << v.name << " on rank " << r;
      }
    }
  }
}

// The plan places every rank-local variable: on data:2 x pipe:2 x model:2, a stage's split
// projections are block m of 2 along their dim and written by both model ranks of data index 0;
// its layer norms are whole and written by model rank 0 only; the replicas of data index 1 write
// nothing; the other stage's variables are in no layout. The gradient rule scales a split
// variable by 1 / data and weighs its squares by 1 / (its copies: the data replicas).
TEST(ModelParallel, ThePlanPlacesPiecesAndWriters) {
  std::vector<ShardLayout> layouts(8);
  std::vector<std::set<std::string>> written(8);
  std::vector<std::string> described(8);
  std::vector<int> files(8);
  RunWorkers(8, [&](Distributed& dist) {
    const int r = dist.rank();
    ParallelPlan plan(dist, "data:2,pipe:2,model:2");
    auto lm = TensorParallelLm(0.0, false, plan.Context(), 4, 2, 2);
    plan.PlaceVariables(*lm);
    layouts[r] = plan.layout();
    for (const auto& [name, piece] : plan.layout()) {
      if (plan.Writes(name)) written[r].insert(name);
    }
    described[r] = plan.Describe();
    files[r] = plan.checkpoint_file();
    EXPECT_EQ(plan.checkpoint_files(), 4);
  }, 60);
  EXPECT_EQ(described[0], "mesh: data 2 x pipe 2 x model 2 (pipelines of 4 ranks, each "
                          "replicated 2 times)");
  const std::string proj = "lm/stack/x_layers_0/fflayer/fc0/w", ln = "lm/stack/x_layers_0/fflayer/ln/scale";
  for (int r = 0; r < 8; ++r) {
    const MeshShape::Coordinates c = MeshShape{.data = 2, .pipe = 2, .model = 2}.Of(r);
    EXPECT_EQ(files[r], c.data == 0 ? r : -1) << "rank " << r;
    const bool stage0 = c.pipe == 0;
    EXPECT_EQ(layouts[r].count(proj), stage0 ? 1u : 0u) << "rank " << r;
    if (!stage0) continue;
    EXPECT_EQ(layouts[r].at(proj), (ShardPiece{1, c.model, 2})) << "rank " << r;
    EXPECT_EQ(written[r].count(proj), c.data == 0 ? 1u : 0u) << "rank " << r;
    ASSERT_EQ(layouts[r].count(ln), 1u) << "rank " << r << ": " << layouts[r].begin()->first;
    EXPECT_EQ(layouts[r].at(ln), ShardPiece{}) << "rank " << r;
    EXPECT_EQ(written[r].count(ln), c.data == 0 && c.model == 0 ? 1u : 0u) << "rank " << r;
    // The embedding: split over the model axis, outside the pipeline.
    EXPECT_EQ(layouts[r].at("lm/emb/emb_var"), (ShardPiece{0, c.model, 2})) << "rank " << r;
  }
}

// Mappings that cannot split are refused naming the layer and what is wrong, and so is a
// pipeline on threads of a process on a model axis; without a model axis the same Params build
// the whole layer.
TEST(ModelParallel, SplitMappingsAreCheckedAndNamed) {
  Params ffn = TransformerFeedForwardLayer::Params();
  ffn.Set("name", "ffn").Set("input_dim", 8).Set("hidden_dim", 12);
  ffn.Set("weight_split_dims_mapping_list",
          ParamValue::List{ParamValue::List{nullptr, "model"}, ParamValue::List{nullptr, "model"}});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerFeedForwardLayer>(ffn), InvalidArgumentError,
                        "layer 'ffn': weight_split_dims_mapping_list: fc0 must split its output "
                        "columns and fc1 its input rows over the same axis");
  ffn.Set("weight_split_dims_mapping_list", ParamValue::List{ParamValue::List{nullptr, "model"}});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerFeedForwardLayer>(ffn), InvalidArgumentError,
                        "must list 2 mappings");
  ffn.Set("weight_split_dims_mapping_list",
          ParamValue::List{ParamValue::List{"model", "model"}, ParamValue::List{"model", nullptr}});
  EXPECT_ERROR_CONTAINS(InstantiateLayer<TransformerFeedForwardLayer>(ffn), InvalidArgumentError,
                        "dims 0 and 1 are both split");
  ffn.Set("weight_split_dims_mapping_list",
          ParamValue::List{ParamValue::List{nullptr, "model"}, ParamValue::List{"model", nullptr}});
  auto whole = InstantiateLayer<TransformerFeedForwardLayer>(ffn);  // no axis: whole
  EXPECT_EQ(whole->theta().GetTensor("fc0.w").sizes(), (std::vector<int64_t>{8, 12}));
  RunWorkers(5, [&](Distributed& dist) {
    ParallelPlan plan(dist, "model:5");
    DistributedMesh& mesh = plan.mesh();
    EXPECT_ERROR_CONTAINS(
        InstantiateLayer<TransformerFeedForwardLayer>(
            ffn, BuildContext().WithAxis("model", mesh.model_axis())),
        InvalidArgumentError,
        "layer 'ffn.fc0': output_dim 12 does not split over the 5 ranks of the 'model' axis");
    Params atten = MultiHeadedAttention::Params();
    atten.Set("name", "atten").Set("input_dim", 8).Set("num_heads", 2);
    atten.Set("weight_split_dims_mapping", ParamValue::List{nullptr, "model", nullptr});
    EXPECT_ERROR_CONTAINS(InstantiateLayer<MultiHeadedAttention>(
                              atten, BuildContext().WithAxis("model", mesh.model_axis())),
                          InvalidArgumentError,
                          "2 heads do not split over the 5 ranks of the 'model' axis");
    atten.Set("weight_split_dims_mapping", ParamValue::List{"model", nullptr, nullptr});
    EXPECT_ERROR_CONTAINS(InstantiateLayer<MultiHeadedAttention>(atten), InvalidArgumentError,
                          "may split the heads (dim 1) only, not dim 0");
  });
  RunWorkers(2, [&](Distributed& dist) {
    ParallelPlan plan(dist, "model:2");
    DistributedMesh& mesh = plan.mesh();
    // A pipeline whose stages run on threads of this process would interleave the axis's sums.
    EXPECT_ERROR_CONTAINS(
        TensorParallelLm(0.0, false, BuildContext().WithAxis("model", mesh.model_axis()), 4, 2, 2),
        FailedPreconditionError, "runs its 2 pipeline stages on threads of this process");
    // A model axis over a model that splits nothing: its ranks would compute the same thing.
    Params plain = SingleTaskModel::Params();
    plain.Set("name", "m").Set("task", TransformerLmTask::CommonParams(52, 16, 32, 4, 2));
    auto model = InstantiateLayer<BaseModel>(plain, plan.Context());
    EXPECT_ERROR_CONTAINS(plan.CheckModel(*model, "model:2", [](const std::string&) {}),
                          InvalidArgumentError,
                          "--mesh=model:2: the model splits no variable over the 'model' axis, so "
                          "its 2 ranks would compute the same thing");
  });
  Params softmax = SimpleFullSoftmax::Params();
  softmax.Set("name", "softmax").Set("input_dim", 4).Set("num_classes", 6);
  softmax.Set("weight_split_dims_mapping", WeightSplitMapping(2, 0, "model"));
  EXPECT_ERROR_CONTAINS(InstantiateLayer<SimpleFullSoftmax>(softmax), InvalidArgumentError,
                        "may split the classes (dim 1) only");
}

}  // namespace
}  // namespace glossa
