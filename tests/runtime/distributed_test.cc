// Distributed (glossa/runtime/distributed.h) over c10d's TCPStore and ProcessGroupGloo on
// 127.0.0.1: two workers as two threads of this process, each with its own store client and
// process group, as two processes would have.
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/gradient_sync.h"
#include "glossa/runtime/mesh.h"
#include "glossa/runtime/parallel_plan.h"
#include "glossa/runtime/data_parallel.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <future>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/input/input_generator.h"
#include "glossa/layers/mesh.h"
#include "glossa/layers/moe.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"
#include "tests/runtime/workers.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(Distributed, BroadcastAndBucketedMeanMatchTheirDefinitions) {
  for (int64_t bucket_bytes : {int64_t{16}, int64_t{1000}, int64_t{25} << 20}) {
    RunWorkers(2, [&](Distributed& dist) {
      const int r = dist.rank();
      // Broadcast: rank 0's values everywhere.
      at::Tensor w = at::full({3, 4}, static_cast<double>(r + 1), at::kFloat);
      dist.Broadcast({w});
      EXPECT_TRUE(at::equal(w, at::full({3, 4}, 1.0, at::kFloat)));
      // Mean over ranks of tensors of several shapes and dtypes, one non-contiguous (each rank's
      // values from its own generator: the global one is shared by the threads).
      auto make = [](int seed) {
        at::Generator g = at::make_generator<at::CPUGeneratorImpl>(100 + seed);
        return std::vector<at::Tensor>{at::randn({5, 7}, g), at::randn({3}, g, at::kDouble),
                                       at::randn({4, 6}, g).t(), at::randn({129}, g)};
      };
      std::vector<at::Tensor> grads = make(r);
      std::vector<at::Tensor> want;
      const std::vector<at::Tensor> g0 = make(0), g1 = make(1);
      for (size_t i = 0; i < g0.size(); ++i) want.push_back((g0[i] + g1[i]) / 2);
      const int64_t sent = dist.AllReduceMean(grads, bucket_bytes);
      EXPECT_EQ(sent, (35 + 24 + 129) * 4 + 3 * 8) << "bucket " << bucket_bytes;
      for (size_t i = 0; i < grads.size(); ++i) {
        EXPECT_TRUE(at::allclose(grads[i], want[i], 1e-6, 1e-6))
            << "bucket " << bucket_bytes << " tensor " << i;
      }
    });
  }
}

TEST(Distributed, WeightedMetricsAndGather) {
  RunWorkers(3, [](Distributed& dist) {
    const int r = dist.rank();
    // loss 1, 2, 3 with weights 10, 20, 30: (10 + 40 + 90) / 60.
    auto m = dist.ReduceWeighted({{"loss", {r + 1.0, 10.0 * (r + 1)}}, {"n", {1.0, 1.0}}});
    EXPECT_NEAR(m["loss"].first, 140.0 / 60.0, 1e-12);
    EXPECT_DOUBLE_EQ(m["loss"].second, 60.0);
    EXPECT_DOUBLE_EQ(m["n"].second, 3.0);
    const auto all = dist.AllGatherStrings(std::string(static_cast<size_t>(r) + 1, 'x'));
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ(all[2], "xxx");
    dist.Barrier();
  });
}

TEST(Distributed, MismatchedConfigurationsAreNamed) {
  try {
    RunWorkers(3, [](Distributed& dist) {
      dist.CheckSame("model params", dist.rank() == 2 ? "dim : 8" : "dim : 4");
    });
    ADD_FAILURE() << "expected FailedPrecondition";
  } catch (const FailedPreconditionError& e) {
    EXPECT_NE(std::string(e.message()).find("disagree on model params: rank(s) 2 differ"),
              std::string::npos)
        << e.message();
  }
}

TEST(Distributed, AMissingRankFailsWithinTheTimeout) {
  // World size 2, only rank 0 starts: the rendezvous gives up after the timeout, naming it.
  DistributedOptions o;
  o.master_port = 0;
  o.world_size = 2;
  o.rank = 0;
  o.timeout_seconds = 1.5;
  EXPECT_ERROR_CONTAINS(Distributed d(o), AbortedError, "rank 0 of 2 at 127.0.0.1");
}

// A small LM (dropout off) with Adam at a constant learning rate.
std::unique_ptr<TransformerLmTask> SmallLm() {
  Params p = TransformerLmTask::CommonParams(50, 16, 32, 2, 2);
  p.Set("name", "lm").Set("random_seed", 3);
  p.Set("train.learner.learning_rate", 1e-2);
  p.Set("train.learner.lr_schedule", ConstantSchedule::Params());
  p.Set("train.learner.optimizer", Adam::Params());
  p.Set("train.learner.clip_gradient_norm_to_value", 0.5);  // clipping sees the global gradient
  return InstantiateLayer<TransformerLmTask>(p);
}

NestedMap LmBatch(const at::Tensor& ids) {
  return NestedMap{{"ids", ids},
                   {"labels", ids.roll(-1, 1)},
                   {"paddings", at::zeros({ids.size(0), ids.size(1)})}};
}

// Issue 16's equivalence: 2 workers with half the batch each, gradients averaged, give the same
// losses and weights after 20 steps as 1 worker with the whole batch.
TEST(Distributed, TwoWorkersWithHalfBatchesTrainLikeOneWithTheWholeBatch) {
  const int steps = 20;
  std::vector<at::Tensor> batches;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (int s = 0; s < steps; ++s) batches.push_back(at::randint(3, 50, {8, 12}, gen));
  // One worker, batch 8.
  auto one = SmallLm();
  std::vector<double> one_losses;
  {
    const auto vars = LearnerVariables(*one);
    for (int s = 0; s < steps; ++s) {
      GlobalStepContext ctx(s);
      auto r = one->FPropDefaultTheta(LmBatch(batches[s]));
      one_losses.push_back(r.metrics.at("loss").value.item<double>());
      one->learner().Apply({{"loss", Metric{r.loss, r.metrics.at("loss").weight}}}, vars, s);
    }
  }
  // Two workers, batch 4 each (rows 0-3 and 4-7); the gradients reduced after the backward pass
  // (a function), and in DDP's overlapped buckets (DataParallelGradientSync, 4 KB buckets so
  // that several start while the backward pass still runs).
  for (const char* mode : {"function", "overlapped"}) {
  SCOPED_TRACE(mode);
  const bool overlapped = std::string(mode) == "overlapped";
  std::vector<std::vector<double>> losses(2);
  std::vector<std::vector<at::Tensor>> weights(2);
  std::vector<DataParallelGradientSync::Stats> stats(2);
  RunWorkers(2, [&](Distributed& dist) {
    const int r = dist.rank();
    auto lm = SmallLm();
    const auto vars = LearnerVariables(*lm);
    std::vector<at::Tensor> values;
    for (const auto& v : vars) values.push_back(v.value);
    dist.Broadcast(values);
    std::shared_ptr<DataParallelGradientSync> sync;
    if (overlapped) {
      sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, /*overlap=*/true);
      lm->learner().SetGradientSync(sync);
    } else {
      lm->learner().SetGradientReducer(
          [&](const std::vector<at::Tensor>& g) { dist.AllReduceMean(g, 1 << 12); });
    }
    for (int s = 0; s < steps; ++s) {
      GlobalStepContext ctx(s);
      auto out = lm->FPropDefaultTheta(LmBatch(batches[s].slice(0, 4 * r, 4 * r + 4)));
      auto m = dist.ReduceWeighted({{"loss", {out.metrics.at("loss").value.item<double>(),
                                               out.metrics.at("loss").weight.item<double>()}}});
      losses[r].push_back(m.at("loss").first);
      lm->learner().Apply({{"loss", Metric{out.loss, out.metrics.at("loss").weight}}}, vars, s);
    }
    for (const auto& v : vars) weights[r].push_back(v.value.detach().clone());
    if (sync) stats[r] = sync->stats();
  });
  if (overlapped) {
    EXPECT_EQ(stats[0].steps, steps);
    EXPECT_GT(stats[0].buckets, steps);  // several buckets per step
    EXPECT_GT(stats[0].early_buckets, 0) << "no bucket started during the backward pass";
    EXPECT_LE(stats[0].early_buckets, stats[0].buckets);
    EXPECT_EQ(stats[0].bytes, stats[1].bytes);
  }
  const auto one_vars = LearnerVariables(*one);
  for (int s = 0; s < steps; ++s) {
    EXPECT_NEAR(losses[0][s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
    EXPECT_DOUBLE_EQ(losses[0][s], losses[1][s]) << "step " << s;
  }
  ASSERT_EQ(weights[0].size(), one_vars.size());
  for (size_t i = 0; i < one_vars.size(); ++i) {
    const at::Tensor w = one_vars[i].value.detach();
    EXPECT_TRUE(at::equal(weights[0][i], weights[1][i])) << one_vars[i].name;
    // The attention key bias adds the same q·b to every logit of a query, which the softmax
    // cancels: its gradient is 0 up to rounding, and Adam scales that rounding noise to full-size
    // steps in both runs alike. Every other variable must agree.
    const std::string& name = one_vars[i].name;
    if (name.size() > 5 && name.substr(name.size() - 5) == "key/b") continue;
    const double rel = ((weights[0][i] - w).abs().max() /
                        at::clamp_min(w.abs().max(), 1e-12)).item<double>();
    EXPECT_LT(rel, 1e-6) << one_vars[i].name;
  }
  // The run moved the weights (the comparison is not of initial values).
  EXPECT_LT(one_losses.back(), one_losses.front());
  }
}

// A rank that is gone (its process group and store client closed, as when killed) makes the
// others' next collective fail with Aborted naming it, not hang.
TEST(Distributed, ALostRankIsNamedByTheSurvivors) {
  try {
    RunWorkers(
        2,
        [](Distributed& dist) {
          dist.Barrier();
          if (dist.rank() == 1) return;  // "dies": its Distributed is destroyed
          at::Tensor t = at::ones({1000});
          dist.AllReduceSum({t});
        },
        /*timeout=*/20);
    ADD_FAILURE() << "expected Aborted";
  } catch (const AbortedError& e) {
    EXPECT_NE(std::string(e.message()).find("lost rank(s): 1"), std::string::npos)
        << e.message();
    EXPECT_NE(std::string(e.message()).find("failed on rank 0 of 2"), std::string::npos)
        << e.message();
  }
}

// A failure that reaches a rank through live ranks names the rank that is gone, as pipeline x
// expert ranks meet it (a killed expert rank's stage neighbour, waiting on a transfer from a rank of
// the other stage, once named that live rank, or rank 0 after the store's host had exited): rank
// 2 leaves; rank 0 (the store's host) and rank 1 fail in groups with it; rank 3, which waits only
// on rank 1 (in another group), fails when rank 1 exits, after rank 0's own diagnosis is over.
TEST(Distributed, AFailureThatComesThroughLiveRanksNamesTheLostOne) {
  std::vector<std::string> errors(4);
  RunWorkers(4, [&](Distributed& dist) {
    const int r = dist.rank();
    std::unique_ptr<Distributed> with_2, pipe;
    if (r == 0 || r == 2) with_2 = dist.Subgroup("with_2_of_0", {0, 2});
    if (r == 1 || r == 2) pipe = dist.Subgroup("with_2_of_1", {1, 2});
    std::unique_ptr<Distributed> chain = r == 1 || r == 3 ? dist.Subgroup("chain", {1, 3}) : nullptr;
    dist.Barrier();
    if (r == 2) return;  // "dies": its groups close
    try {
      if (r == 3) {
        at::Tensor x = at::zeros({2});
        chain->Recv(x, 0);  // from world rank 1
      } else {
        at::Tensor t = at::ones({8});
        (r == 0 ? with_2 : pipe)->AllReduceSum({t});
      }
      errors[r] = "no failure";
    } catch (const AbortedError& e) {
      errors[r] = e.what();
    }
  }, /*timeout=*/2);
  for (int r : {0, 1, 3}) {
    EXPECT_NE(errors[r].find("lost rank(s): 2 "), std::string::npos) << "rank " << r << ": "
                                                                      << errors[r];
  }
  EXPECT_NE(errors[3].find("recv from rank 0 failed on rank 3 (1 of 2 in group chain)"),
            std::string::npos) << errors[3];
  EXPECT_NE(errors[3].find("reached this rank through ranks that did"), std::string::npos)
      << errors[3];
}

TEST(Distributed, AgreeingAndGatheringWeightedMetricsWithDifferentNames) {
  RunWorkers(2, [](Distributed& dist) {
    EXPECT_TRUE(dist.AnyTrue(dist.rank() == 1));
    EXPECT_FALSE(dist.AnyTrue(false));
    // Rank 1 had an empty shard: it reports nothing, and rank 0's values stand.
    std::map<std::string, std::pair<double, double>> mine;
    if (dist.rank() == 0) mine = {{"log_pplx", {2.5, 100}}, {"acc", {0.5, 10}}};
    else mine = {{"log_pplx", {1.5, 300}}};
    auto m = dist.GatherWeighted(mine);
    EXPECT_DOUBLE_EQ(m.at("log_pplx").first, (250.0 + 450.0) / 400.0);
    EXPECT_DOUBLE_EQ(m.at("log_pplx").second, 400.0);
    EXPECT_DOUBLE_EQ(m.at("acc").first, 0.5);
  });
}

TEST(DataParallel, ShardingDividesTheGlobalBatchAndNamesWhatDoesNotDivide) {
  Params p = TransformerLmTask::CommonParams(50, 16, 32, 2, 2);
  Params input = TextLmInput::Params();
  input.Set("bucket_batch_limit", ParamValue::List{8, 4});
  Params model;
  model.Define("task", p, "");
  model.GetParams("task").Set("input", input);
  model.GetParams("task").Set("num_splits", 2);
  Params a = model.Copy();
  EXPECT_TRUE(ShardParamsForReplicas(a, 2, 1).empty());
  EXPECT_EQ(a.GetInt("task.input.num_input_replicas"), 2);
  EXPECT_EQ(a.GetInt("task.input.input_replica_id"), 1);
  EXPECT_EQ(a.Get("task.input.bucket_batch_limit").AsList()[0].AsInt(), 4);
  EXPECT_EQ(a.Get("task.input.bucket_batch_limit").AsList()[1].AsInt(), 2);
  EXPECT_EQ(a.GetInt("task.num_splits"), 1);  // the towers spread over the ranks
  Params b = model.Copy();
  EXPECT_ERROR_CONTAINS(ShardParamsForReplicas(b, 3, 0), InvalidArgumentError,
                        "task.num_splits = 2 towers cannot be spread over 3 workers");
  b.Set("task.num_splits", 1);
  const std::vector<std::string> notes = ShardParamsForReplicas(b, 3, 0);
  ASSERT_EQ(notes.size(), 2u);  // 8 and 4 are rounded up to 3 and 2 per worker
  EXPECT_EQ(notes[0], "task.input.bucket_batch_limit = 8 does not divide among 3 workers: each "
                      "reads 3, 9 in all");
  EXPECT_EQ(b.Get("task.input.bucket_batch_limit").AsList()[1].AsInt(), 2);
  Params c = model.Copy();
  ShardParamsForReplicas(c, 1, 0);
  EXPECT_EQ(c, model);
}

TEST(DataParallel, DecodeOutputsSurviveSerialization) {
  NestedMap m;
  m.Set("src.ids", at::arange(6, at::kLong).view({2, 3}));
  m.Set("scores", at::rand({2, 4}));
  m.Set("empty", at::zeros({0, 5}, at::kInt));
  const std::vector<NestedMap> back = DeserializeNestedMaps(SerializeNestedMaps({m, m}));
  ASSERT_EQ(back.size(), 2u);
  for (const auto& [k, v] : m.FlattenItems()) {
    EXPECT_TRUE(at::equal(back[1].GetTensor(k), v.AsTensor())) << k;
    EXPECT_EQ(back[1].GetTensor(k).scalar_type(), v.AsTensor().scalar_type()) << k;
  }
  std::string bytes = SerializeNestedMaps({m});
  bytes.resize(bytes.size() - 3);
  EXPECT_ERROR_CONTAINS(DeserializeNestedMaps(bytes), DataLossError, "truncated");
}

TEST(Distributed, AllToAllSendsBlockJToRankJ) {
  RunWorkers(3, [](Distributed& dist) {
    const int r = dist.rank();
    // Block j of rank r holds 100·r + 10·j + (0, 1) in two rows of two.
    at::Tensor in = at::empty({6, 2}, at::kFloat);
    for (int j = 0; j < 3; ++j) in.slice(0, 2 * j, 2 * j + 2).fill_(100 * r + 10 * j);
    in.add_(at::arange(12, at::kFloat).view({6, 2}) % 2);
    const at::Tensor out = dist.AllToAll(in);
    for (int i = 0; i < 3; ++i) {
      at::Tensor want = at::full({2, 2}, 100 * i + 10 * r, at::kFloat) +
                        at::arange(4, at::kFloat).view({2, 2}) % 2;
      EXPECT_TRUE(at::equal(out.slice(0, 2 * i, 2 * i + 2), want)) << "rank " << r << " from " << i;
    }
    try {
      dist.AllToAll(at::zeros({4, 2}));
      ADD_FAILURE() << "4 rows split into 3 blocks";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("does not split into 3"), std::string::npos);
    }
  });
}

// Point to point, as pipeline stages use it (a chain 0 -> 1 -> 2 through a mesh axis): every
// micro-batch arrives in send order with its values, a mismatched peer is refused, and a stage
// whose sender is gone fails after the timeout naming the lost rank.
TEST(Distributed, PointToPointDeliversInOrderAndNamesALostPeer) {
  RunWorkers(3, [](Distributed& dist) {
    const int r = dist.rank();
    DistributedMeshAxis axis(dist);
    MeshAxis& pipe = axis;
    for (int t = 0; t < 5; ++t) {
      at::Tensor x = at::full({4, 3}, static_cast<float>(10 * t), at::kFloat);
      if (r > 0) pipe.RecvFrom(x, r - 1);
      EXPECT_TRUE(at::equal(x, at::full({4, 3}, static_cast<float>(10 * t + r), at::kFloat)))
          << "micro-batch " << t << " on rank " << r;
      if (r < 2) pipe.SendTo(x + 1, r + 1);
    }
    at::Tensor any = at::zeros({1});
    EXPECT_ERROR_CONTAINS(dist.Send(any, r), InvalidArgumentError, "is not another rank");
    EXPECT_ERROR_CONTAINS(dist.Recv(any, 3), InvalidArgumentError, "is not another rank");
  });
  // Rank 2 leaves without sending; rank 1's recv fails within the timeout, naming it. Rank 0 (the
  // store's host) stays until rank 1 has its answer.
  std::promise<void> answered;
  std::shared_future<void> done = answered.get_future().share();
  std::string error;
  RunWorkers(3, [&](Distributed& dist) {
    // Every rank is through the rendezvous before rank 2 leaves: leaving while rank 0 still
    // connected its pairs failed rank 0's rendezvous ("Connection closed by peer", seen beside two
    // CPU hogs), not the recv this checks.
    dist.Barrier();
    if (dist.rank() == 0) done.wait();
    if (dist.rank() != 1) return;
    at::Tensor x = at::zeros({2});
    try {
      dist.Recv(x, 2);
      error = "received";
    } catch (const AbortedError& e) {
      error = e.what();
    }
    answered.set_value();
  }, /*timeout=*/2);
  EXPECT_NE(error.find("recv from rank 2 failed on rank 1 of 3: lost rank(s): 2"),
            std::string::npos) << error;
}

// A send to a rank that has left: gloo starts the send on the calling thread and throws there once
// it has seen the peer's connection close ("Connection closed by peer"); that too is Aborted
// naming the lost rank, as a failed wait is (a killed pipeline stage's neighbour once exited with
// gloo's bare message instead). Sends before the close is seen may still succeed into the
// socket's buffer: rank 1 sends until one fails.
TEST(Distributed, ASendToALostPeerNamesIt) {
  std::promise<void> answered;
  std::shared_future<void> done = answered.get_future().share();
  std::string error, next;
  RunWorkers(3, [&](Distributed& dist) {
    dist.Barrier();
    if (dist.rank() == 0) done.wait();  // the store's host stays until rank 1 has its answer
    if (dist.rank() != 1) return;  // rank 2's Distributed, and its connections, close now
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    const at::Tensor x = at::zeros({1024});
    try {
      while (std::chrono::steady_clock::now() < deadline) dist.Send(x, 2);
      error = "every send succeeded for 60 s";
    } catch (const AbortedError& e) {
      error = e.what();
    } catch (const std::exception& e) {  // caught, so that rank 0 is always released
      error = StrCat("not Aborted: ", e.what());
    }
    // Now that the close is seen, the next send fails where gloo starts it.
    try {
      dist.Send(x, 2);
      next = "succeeded";
    } catch (const AbortedError& e) {
      next = e.what();
    } catch (const std::exception& e) {
      next = StrCat("not Aborted: ", e.what());
    }
    answered.set_value();
  }, /*timeout=*/2);
  for (const std::string* e : {&error, &next}) {
    EXPECT_NE(e->find("send to rank 2 failed on rank 1 of 3: lost rank(s): 2"), std::string::npos)
        << *e;
  }
}

// GShard's expert parallelism (TransformerShardedMoeLayer with num_devices = 2 on a 2-rank expert
// axis): each rank holds 2 of the 4 experts and routes its own half of the batch; outputs, aux
// losses and every gradient match the same layer with all experts in one process on the whole
// batch (float64, so the comparison is to rounding).
TEST(Distributed, ExpertParallelMoeMatchesAllExpertsInOneProcess) {
  auto make = [](int devices, const BuildContext& context = BuildContext()) {
    Params p = TransformerShardedMoeLayer::Params();
    p.Set("name", "moe").Set("random_seed", 11).Set("dtype", DType::kFloat64);
    p.FromText(StrCat("input_dim : 6\nhidden_dim : 10\nnum_experts : 4\nnum_groups : 4\n"
                      "expert_capacity_dim : 3\nuse_glu : True\nnum_devices : ", devices, "\n"));
    return InstantiateLayer<TransformerShardedMoeLayer>(p, context);
  };
  auto whole = make(1);
  const NestedMap full = whole->theta();
  at::manual_seed(5);
  const at::Tensor x = at::randn({4, 4, 6}, at::kDouble), w = at::randn({4, 4, 6}, at::kDouble);
  // One process, all experts, the whole batch in 2 × 2 groups.
  NestedMap theta = full.DeepCopy();
  std::vector<at::Tensor> ref_vars;
  for (const char* name : {"gate", "wi", "wo"}) {
    theta.Set(name, full.GetTensor(name).detach().clone().requires_grad_(true));
    ref_vars.push_back(theta.GetTensor(name));
  }
  const at::Tensor xr = x.clone().requires_grad_(true);
  at::Tensor ref_out, ref_aux;
  {
    AuxLossContext aux;
    ref_out = whole->FProp(theta, xr);  // 4 groups
    ref_aux = aux.Sum();
  }
  (ref_out * w).sum().backward();
  RunWorkers(2, [&](Distributed& dist) {
    const int r = dist.rank();
    DistributedMeshAxis axis(dist);
    auto sharded = make(2, BuildContext().WithAxis("expert", &axis));  // experts 2r, 2r + 1
    EXPECT_FALSE(sharded->UnmetMesh().has_value());
    NestedMap mine = sharded->theta();
    // Initialized as those experts' rows of the one-process layer's initial value.
    for (const char* name : {"wi", "wo"}) {
      EXPECT_TRUE(at::equal(mine.GetTensor(name), full.GetTensor(name).slice(0, 2 * r, 2 * r + 2)))
          << name << " on rank " << r;
    }
    std::vector<at::Tensor> vars;
    for (const char* name : {"gate", "wi", "wo"}) {
      at::Tensor v = full.GetTensor(name).detach();
      if (std::string(name) != "gate") v = v.slice(0, 2 * r, 2 * r + 2);  // experts 2r, 2r + 1
      mine.Set(name, v.clone().requires_grad_(true));
      vars.push_back(mine.GetTensor(name));
    }
    const at::Tensor xs = x.slice(0, 2 * r, 2 * r + 2).clone().requires_grad_(true);
    at::Tensor out, aux_loss;
    {
      AuxLossContext aux;
      out = sharded->FProp(mine, xs);  // 4 groups over 2 ranks: 2 here
      aux_loss = aux.Sum();
    }
    EXPECT_TRUE(at::allclose(out, ref_out.slice(0, 2 * r, 2 * r + 2), 1e-12, 1e-12)) << "rank " << r;
    (out * w.slice(0, 2 * r, 2 * r + 2)).sum().backward();
    EXPECT_TRUE(at::allclose(xs.grad(), xr.grad().slice(0, 2 * r, 2 * r + 2), 1e-12, 1e-12));
    // Expert gradients: this rank's experts, from every rank's tokens.
    for (int i : {1, 2}) {
      EXPECT_TRUE(at::allclose(vars[i].grad(), ref_vars[i].grad().slice(0, 2 * r, 2 * r + 2),
                               1e-12, 1e-12))
          << "rank " << r << " var " << i;
    }
    // The replicated gate: this rank's part of the whole batch's gradient, summed over ranks.
    at::Tensor gate = vars[0].grad().clone();
    dist.AllReduceSum({gate});
    EXPECT_TRUE(at::allclose(gate, ref_vars[0].grad(), 1e-12, 1e-12));
    // The aux loss is a mean over groups: the ranks' mean is the whole batch's.
    at::Tensor mean_aux = aux_loss.detach().clone().view({1});
    dist.AllReduceSum({mean_aux});
    EXPECT_NEAR(mean_aux.item<double>() / 2, ref_aux.item<double>(), 1e-12);
  });
  // Built for an expert axis of another size: refused at construction, naming both sizes.
  RunWorkers(2, [&](Distributed& dist) {
    DistributedMeshAxis axis(dist);
    EXPECT_ERROR_CONTAINS(make(4, BuildContext().WithAxis("expert", &axis)),
                          FailedPreconditionError,
                          "num_devices = 4 needs a mesh with an 'expert' axis of 4 ranks, but the "
                          "axis has 2");
  });
  // Without an expert axis the same Params build every expert in this process (what eval, decode
  // and export run): the one-process layer's variables, each call routing 4 / 2 groups as one
  // rank did, and the layer says which axis its Params name.
  auto whole_here = make(2);
  for (const char* name : {"gate", "wi", "wo"}) {
    EXPECT_TRUE(at::equal(whole_here->theta().GetTensor(name), full.GetTensor(name))) << name;
  }
  EXPECT_TRUE(at::allclose(whole_here->FProp(full, x), whole->FProp(full, x, {}, 2), 1e-12, 1e-12));
  ASSERT_TRUE(whole_here->UnmetMesh().has_value());
  EXPECT_EQ(whole_here->UnmetMesh()->variable, "moe/wi");
  EXPECT_EQ(whole_here->UnmetMesh()->axis, "expert");
  EXPECT_EQ(whole_here->UnmetMesh()->size, 2);
  EXPECT_FALSE(whole->UnmetMesh().has_value());
  // Experts that do not divide over the devices are refused at construction.
  Params bad = TransformerShardedMoeLayer::Params();
  bad.Set("name", "moe");
  bad.FromText("input_dim : 6\nhidden_dim : 10\nnum_experts : 4\nnum_devices : 3\n");
  EXPECT_THROW(InstantiateLayer<TransformerShardedMoeLayer>(bad), InvalidArgumentError);
}

// Each rank's batch has its own padded length (12 and 5 tokens a row here), so capacities from
// the factor would differ and the all-to-all's blocks with them: the ranks agree on the longest
// group's capacity (12 for groups of 12 at factor 1.5 × 2 over 4 experts), and each rank's
// output is what all 4 experts in one process give its batch at that capacity.
TEST(Distributed, ExpertParallelRanksOfDifferentLengthsAgreeOnTheCapacity) {
  auto make = [](int devices, int groups, int capacity, const BuildContext& context) {
    Params p = TransformerShardedMoeLayer::Params();
    p.Set("name", "moe").Set("random_seed", 11).Set("dtype", DType::kFloat64);
    p.FromText(StrCat("input_dim : 6\nhidden_dim : 10\nnum_experts : 4\nnum_groups : ", groups,
                      "\nexpert_capacity_dim : ", capacity, "\nnum_devices : ", devices, "\n"));
    return InstantiateLayer<TransformerShardedMoeLayer>(p, context);
  };
  at::manual_seed(9);
  const std::vector<at::Tensor> xs = {at::randn({2, 12, 6}, at::kDouble),
                                      at::randn({2, 5, 6}, at::kDouble)};
  RunWorkers(2, [&](Distributed& dist) {
    const int r = dist.rank();
    DistributedMeshAxis axis(dist);
    auto sharded = make(2, 4, 0, BuildContext().WithAxis("expert", &axis));  // factor 1.5
    auto whole = make(1, 2, 12, BuildContext());
    NestedMap theta = whole->theta();
    for (const char* name : {"wi", "wo"}) {
      EXPECT_TRUE(at::equal(sharded->theta().GetTensor(name),
                            theta.GetTensor(name).slice(0, 2 * r, 2 * r + 2)));
    }
    const at::Tensor y = sharded->FProp(sharded->theta(), xs[r]);
    EXPECT_TRUE(at::allclose(y, whole->FProp(theta, xs[r]), 1e-12, 1e-12)) << "rank " << r;
  });
}

// A 2-layer LM whose second layer is a 4-expert MoE block spread over `devices` ranks, routing
// `groups` groups over them; `splits` 2 pipelines the layers (the MoE block in stage 1);
// `model_split` splits the dense layer, both layers' attention, the embedding's rows and the
// softmax's classes over a 'model' axis (whole without one).
std::unique_ptr<TransformerLmTask> SmallMoeLm(int devices, int groups = 2, double dropout = 0.0,
                                              const BuildContext& context = BuildContext(),
                                              int splits = 1, bool model_split = false,
                                              int micro = 1) {
  Params p = TransformerLmTask::CommonParams(50, 16, 32, 2, 2);
  p.Set("name", "lm").Set("random_seed", 3).Set("aux_loss_weight", 0.01);
  p.Set("train.learner.learning_rate", 1e-2);
  p.Set("train.learner.lr_schedule", ConstantSchedule::Params());
  p.Set("train.learner.optimizer", Adam::Params());
  p.Set("train.learner.clip_gradient_norm_to_value", 0.5);  // clipping sees the global gradient
  Params dense = p.GetParams("stack.transformer_layer_params_tpl").Copy();
  Params moe = dense.Copy();
  moe.Set("tr_fflayer_tpl", TransformerShardedMoeLayer::Params()
                                .Set("hidden_dim", 24)
                                .Set("num_experts", 4)
                                .Set("num_groups", groups)
                                .Set("expert_capacity_factor", 1.5)
                                .Set("residual_dropout_prob", dropout)
                                .Set("relu_dropout_prob", dropout)
                                .Set("num_devices", devices));
  // Dropout everywhere it can be (the dense layers' own from CommonParams are set below too).
  for (Params* l : {&dense, &moe}) {
    l->Set("tr_atten_tpl.residual_dropout_prob", dropout);
    l->Set("tr_atten_tpl.atten_dropout_prob", dropout);
  }
  dense.Set("tr_fflayer_tpl.residual_dropout_prob", dropout);
  dense.Set("tr_fflayer_tpl.relu_dropout_prob", dropout);
  if (model_split) {
    TransformerLayer::SetTensorParallel(dense, "model");
    moe.Set("tr_atten_tpl.atten_tpl.weight_split_dims_mapping", WeightSplitMapping(3, 1, "model"));
    p.Set("emb.weight_split_dims_mapping", WeightSplitMapping(2, 0, "model"));
    p.Set("softmax.weight_split_dims_mapping", WeightSplitMapping(2, 1, "model"));
  }
  p.Set("stack.transformer_layer_params_tpl", ParamValue::List{dense, moe});
  p.Set("stack.splits", splits).Set("stack.num_micro_batches", micro);
  return InstantiateLayer<TransformerLmTask>(p, context);
}

// `steps` Adam steps of `lm` on rows [lo, hi) of each batch, each at its global step; the losses
// (with `dist`, the weighted mean over its ranks).
std::vector<double> TrainSteps(TransformerLmTask& lm, const std::vector<at::Tensor>& batches,
                               int64_t lo, int64_t hi, Distributed* dist = nullptr) {
  const auto vars = LearnerVariables(lm);
  std::vector<double> losses;
  for (size_t s = 0; s < batches.size(); ++s) {
    GlobalStepContext ctx(static_cast<int64_t>(s));
    auto out = lm.FPropDefaultTheta(LmBatch(batches[s].slice(0, lo, hi)));
    const double loss = out.metrics.at("loss").value.item<double>();
    if (dist != nullptr) {
      auto m = dist->ReduceWeighted({{"loss", {loss, out.metrics.at("loss").weight.item<double>()}}});
      losses.push_back(m.at("loss").first);
    } else {
      losses.push_back(loss);
    }
    lm.learner().Apply({{"loss", Metric{out.loss, out.metrics.at("loss").weight}}}, vars,
                       static_cast<int64_t>(s));
  }
  return losses;
}

// Each rank's weights against the one-process model's, within 1e-5 relative: dense ones whole,
// expert ones the rank's block of `per` experts starting at expert_block(r) · per.
void ExpectRanksHoldTheWeights(const std::vector<LearnerVariable>& one_vars,
                               const std::vector<std::map<std::string, at::Tensor>>& weights,
                               int per, const std::function<int(int)>& expert_block) {
  for (const auto& v : one_vars) {
    // key/b: its gradient cancels in softmax up to rounding (see above); every other variable
    // must agree.
    if (v.name.size() > 5 && v.name.substr(v.name.size() - 5) == "key/b") continue;
    const at::Tensor w = v.value.detach();
    for (int r = 0; r < static_cast<int>(weights.size()); ++r) {
      const bool expert = weights[r].at(v.name).size(0) != w.size(0);
      const int e = expert_block(r);
      const at::Tensor want = expert ? w.slice(0, per * e, per * e + per) : w;
      const double rel = ((weights[r].at(v.name) - want).abs().max() /
                          at::clamp_min(want.abs().max(), 1e-12)).item<double>();
      EXPECT_LT(rel, 1e-5) << v.name << " on rank " << r;
    }
  }
}

// Issue 36's equivalence: an MoE LM with its 4 experts on n = 2 ranks (2 each) and on n = 4
// (1 each), each rank 8/n rows of the batch and one of the n routing groups, trains like the same
// LM in one process with all 4 experts, the whole batch and n groups: 20 Adam steps with
// global-norm clipping, losses within 1e-6 and weights within 1e-5 relative (float32 sums in
// another order; the bound), with the gradients reduced after the backward pass and
// overlapped with it, without dropout and with dropout 0.1 at every site (attention weights,
// residuals, the experts' hidden activations: each rank's masks are its rows, or its experts,
// of the one-process masks; BatchShardScope). Dense weights are averaged over the ranks; expert weights are not (each
// rank's expert gradient already sums every rank's tokens through the all-to-all).
TEST(Distributed, ExpertParallelMoeLmTrainsLikeOneProcess) {
  const int steps = 20;
  std::vector<at::Tensor> batches;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(13);
  for (int s = 0; s < steps; ++s) batches.push_back(at::randint(3, 50, {8, 12}, gen));
  for (const auto& [n, dropout] : {std::pair{2, 0.0}, {4, 0.0}, {2, 0.1}, {4, 0.1}}) {
    SCOPED_TRACE(StrCat(n, " ranks, dropout ", dropout));
    const int per = 4 / n, rows = 8 / n;  // experts and batch rows per rank
    auto one = SmallMoeLm(1, n, dropout);
    std::map<std::string, at::Tensor> init;
    for (const auto& v : LearnerVariables(*one)) init[v.name] = v.value.detach().clone();
    const auto one_vars = LearnerVariables(*one);
    const std::vector<double> one_losses = TrainSteps(*one, batches, 0, 8);
    for (const bool overlapped : {false, true}) {
      SCOPED_TRACE(overlapped ? "overlapped" : "after the backward pass");
      std::vector<std::vector<double>> losses(n);
      std::vector<std::map<std::string, at::Tensor>> weights(n);
      std::vector<int> sharded_vars(n, 0);
      RunWorkers(n, [&](Distributed& dist) {
        const int r = dist.rank();
        DistributedMeshAxis axis(dist);
        // As the trainer does: this rank's rows draw their rows of one process's dropout masks.
        BatchShardScope shard(r, n);
        auto lm = SmallMoeLm(n, n, dropout, BuildContext().WithAxis("expert", &axis));
        const auto vars = LearnerVariables(*lm);
        // The same seed gives every variable the one-process model's start: dense ones whole,
        // this rank's block of experts here.
        for (const auto& v : vars) {
          const at::Tensor& src = init.at(v.name);
          EXPECT_TRUE(at::equal(v.value, v.expert_sharded ? src.slice(0, per * r, per * r + per)
                                                          : src))
              << v.name << " on rank " << r;
          sharded_vars[r] += v.expert_sharded;
        }
        lm->learner().SetGradientSync(
            std::make_shared<DataParallelGradientSync>(dist, 1 << 12, overlapped));
        losses[r] = TrainSteps(*lm, batches, rows * r, rows * r + rows, &dist);
        for (const auto& v : vars) weights[r][v.name] = v.value.detach().clone();
      });
      EXPECT_EQ(sharded_vars[0], 2);  // wi and wo
      for (int s = 0; s < steps; ++s) {
        EXPECT_NEAR(losses[0][s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
      }
      ExpectRanksHoldTheWeights(one_vars, weights, per, [](int r) { return r; });
      EXPECT_LT(one_losses.back(), one_losses.front());
    }
  }
}

// The data × expert mesh (--mesh=data:2,expert:2): 4 ranks, rank r = 2d + e. Ranks {0, 1} and
// {2, 3} each hold the 4 experts once (2 per rank) and exchange tokens among themselves; ranks
// {0, 2} and {1, 3} hold the same experts and sum their gradients; dense weights are averaged over
// all 4. Each rank trains on a quarter of the batch (one routing group of 2 rows), so the same LM
// in one process routes 4 groups of 2 rows: 20 Adam steps with global-norm clipping (the norm
// counts every expert once), without dropout and with dropout 0.1 at every site (the experts'
// masks are each rank's experts of its replica's groups of the one-process masks: a 2-D block),
// losses within 1e-6, weights within 1e-5.
TEST(Distributed, DataTimesExpertMeshTrainsLikeOneProcess) {
  const int steps = 20;
  std::vector<at::Tensor> batches;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(17);
  for (int s = 0; s < steps; ++s) batches.push_back(at::randint(3, 50, {8, 12}, gen));
  for (const double dropout : {0.0, 0.1}) {
    SCOPED_TRACE(StrCat("dropout ", dropout));
    auto one = SmallMoeLm(1, 4, dropout);
    const auto one_vars = LearnerVariables(*one);
    const std::vector<double> one_losses = TrainSteps(*one, batches, 0, 8);
    std::vector<std::vector<double>> losses(4);
    std::vector<std::map<std::string, at::Tensor>> weights(4);
    std::vector<std::pair<int, int>> index(4);
    RunWorkers(4, [&](Distributed& dist) {
      const int r = dist.rank();
      ParallelPlan plan(dist, "data:2,expert:2");
      DistributedMesh& mesh = plan.mesh();
      index[r] = {mesh.data_index(), mesh.expert_index()};
      BatchShardScope shard(r, 4);  // as the trainer does: this rank's rows of the batch
      auto lm = SmallMoeLm(2, 2, dropout, BuildContext().WithAxis("expert", mesh.expert_axis()));
      const auto vars = LearnerVariables(*lm);
      auto sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, true);
      plan.Configure(*sync);
      lm->learner().SetGradientSync(sync);
      losses[r] = TrainSteps(*lm, batches, 2 * r, 2 * r + 2, &dist);
      for (const auto& v : vars) weights[r][v.name] = v.value.detach().clone();
    });
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(index[r], std::make_pair(r / 2, r % 2)) << "rank " << r;
    }
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(losses[0][s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
    }
    ExpectRanksHoldTheWeights(one_vars, weights, 2, [](int r) { return r % 2; });
    EXPECT_LT(one_losses.back(), one_losses.front());
  }
}

// MoE inside a pipeline on the pipe × expert mesh (--mesh=pipe:2,expert:2): 4 ranks, rank
// r = 2s + e. Stage 0 (ranks 0, 1) holds the dense layer, stage 1 (ranks 2, 3) the MoE layer, its 4
// experts 2 per rank, exchanging tokens within the stage; expert rank e reads rows [4e, 4e + 4) of
// the batch (one routing group), both stages of its pipeline the same rows. The stage's dense
// variables (the gate, attention) are averaged over its data x expert ranks, the experts summed
// over none (their gradients sum both ranks' tokens already). The MoE layer's aux loss leaves the
// pipeline as its output (the stages' sums meet in one all-reduce) and its gradient is re-injected
// in the backward's recompute. With 1 and with 2 micro-batches, against the LM in one process
// with all experts unpipelined (one group per micro-batch of each rank: 2 or 4 groups over the
// whole batch): 20 Adam steps with global-norm clipping and dropout 0.1 at every site (a
// micro-batch's experts draw their blocks of the one-process masks), losses within 1e-6, weights
// within 1e-5. Mutation: without the plan's rule (the stage's gate averaged over no one) the
// weights part from one process.
TEST(Distributed, PipeTimesExpertMeshTrainsLikeOneProcess) {
  const int steps = 20;
  std::vector<at::Tensor> batches;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(23);
  for (int s = 0; s < steps; ++s) batches.push_back(at::randint(3, 50, {8, 12}, gen));
  for (const int micro : {1, 2}) {
    SCOPED_TRACE(StrCat(micro, " micro-batch(es)"));
    // Each micro-batch of a rank routes its own group: 2 · micro groups over the whole batch.
    auto one = SmallMoeLm(1, 2 * micro, 0.1);
    const auto one_vars = LearnerVariables(*one);
    const std::vector<double> one_losses = TrainSteps(*one, batches, 0, 8);
    EXPECT_LT(one_losses.back(), one_losses.front());
    for (const bool mutated : micro == 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      SCOPED_TRACE(mutated ? "without the plan's rule" : "with the plan");
      std::vector<std::vector<double>> losses(4);
      std::vector<std::map<std::string, at::Tensor>> weights(4);
      std::vector<double> aux(4);
      RunWorkers(4, [&](Distributed& dist) {
        const int r = dist.rank();
        ParallelPlan plan(dist, "pipe:2,expert:2");
        ASSERT_EQ(plan.batch_shards(), 2);
        BatchShardScope shard(plan.batch_shard(), plan.batch_shards());
        auto lm = SmallMoeLm(2, 2, 0.1, plan.Context(), /*splits=*/2, false, micro);
        // The plan's rule: a stage's dense variable sums over the stage's 2 expert ranks (the
        // batch group) and is halved; an expert sums over no one (data 1) and is halved too.
        for (const auto& v : LearnerVariables(*lm)) {
          if (!v.rank_local()) continue;
          const auto rule = plan.RankLocal(v);
          EXPECT_DOUBLE_EQ(rule.scale, 0.5) << v.name;
          EXPECT_EQ(rule.group, v.expert_sharded ? plan.data_group() : plan.batch_group()) << v.name;
          EXPECT_DOUBLE_EQ(rule.norm_weight, v.expert_sharded ? 1.0 : 0.5) << v.name;
        }
        auto sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, true);
        if (!mutated) plan.Configure(*sync);
        lm->learner().SetGradientSync(sync);
        {
          GlobalStepContext step(0);
          aux[r] = lm->FPropDefaultTheta(LmBatch(batches[0].slice(0, 4 * (r % 2), 4 * (r % 2) + 4)))
                       .metrics.at("aux_loss").value.item<double>();
        }
        losses[r] = TrainSteps(*lm, batches, 4 * (r % 2), 4 * (r % 2) + 4, &dist);
        for (const auto& v : LearnerVariables(*lm)) weights[r][v.name] = v.value.detach().clone();
      });
      // Every stage sees the pipeline's aux loss (stage 0 has no MoE layer of its own).
      EXPECT_EQ(aux[0], aux[2]);
      EXPECT_EQ(aux[1], aux[3]);
      EXPECT_GT(aux[0], 0.0);
      double worst = 0;
      for (const auto& v : one_vars) {
        if (v.name.size() > 5 && v.name.substr(v.name.size() - 5) == "key/b") continue;
        const at::Tensor w = v.value.detach();
        int holders = 0;
        for (int r = 0; r < 4; ++r) {
          if (!weights[r].count(v.name)) continue;
          ++holders;
          const at::Tensor& mine = weights[r].at(v.name);
          const int e = r % 2;
          const at::Tensor want = mine.size(0) != w.size(0) ? w.slice(0, 2 * e, 2 * e + 2) : w;
          const double rel = ((mine - want).abs().max() /
                              at::clamp_min(want.abs().max(), 1e-12)).item<double>();
          worst = std::max(worst, rel);
          if (!mutated) {
            EXPECT_LT(rel, 1e-5) << v.name << " on rank " << r;
          }
        }
        // A stage's layers on its 2 ranks (the embedding stage 0's, the final layer norm and the
        // softmax stage 1's), the rest on all 4.
        EXPECT_EQ(holders, LmStageOf(v.name, 2, 2) >= 0 ? 2 : 4) << v.name;
      }
      if (mutated) {
        EXPECT_GT(worst, 1e-3);
        continue;
      }
      for (int s = 0; s < steps; ++s) {
        EXPECT_NEAR(losses[0][s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
      }
    }
  }
  // A pipeline on threads of one process cannot sit on an expert axis (its exchanges would
  // interleave): refused, naming the mesh that can run it.
  RunWorkers(2, [&](Distributed& dist) {
    DistributedMeshAxis axis(dist);
    EXPECT_ERROR_CONTAINS(SmallMoeLm(2, 2, 0.0, BuildContext().WithAxis("expert", &axis), 2),
                          FailedPreconditionError,
                          "'expert' axis exchanges would interleave in a different order on each "
                          "rank: put the stages on ranks (--mesh=pipe:2,expert:2)");
  });
}

// The expert x model mesh (--mesh=expert:2,model:2): 4 ranks, rank r = 2e + m. The dense layer,
// both layers' attention, the embedding and the softmax split over the model axis (block m of
// 2); the MoE layer's 4 experts sit 2 per expert rank (block e), each model shard exchanging
// tokens within its own expert group ({0, 2} and {1, 3}), the MoE layer computed alike on a
// shard's model ranks. Expert rank e reads rows [4e, 4e + 4) of the batch (one routing group),
// its model ranks the same rows. A model-split variable is averaged over its shard's expert ranks
// (the batch group), an expert over no one (its gradient sums both ranks' tokens already); each
// has 2 copies in the global norm. Against the LM in one process with every expert and nothing
// split: 20 Adam steps with global-norm clipping and dropout 0.1 at every site, losses within
// 1e-6, weights within 1e-5. Mutation: without the plan's rule the weights part from one process.
TEST(Distributed, ExpertTimesModelMeshTrainsLikeOneProcess) {
  const int steps = 20;
  std::vector<at::Tensor> batches;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(41);
  for (int s = 0; s < steps; ++s) batches.push_back(at::randint(3, 50, {8, 12}, gen));
  auto one = SmallMoeLm(1, 2, 0.1, BuildContext(), 1, /*model_split=*/true);
  const auto one_vars = LearnerVariables(*one);
  const std::vector<double> one_losses = TrainSteps(*one, batches, 0, 8);
  EXPECT_LT(one_losses.back(), one_losses.front());
  for (const bool mutated : {false, true}) {
    SCOPED_TRACE(mutated ? "without the plan's rule" : "with the plan");
    std::vector<std::vector<double>> losses(4);
    std::vector<std::map<std::string, at::Tensor>> weights(4);
    std::vector<std::map<std::string, std::pair<bool, bool>>> sharded(4);  // expert, model
    RunWorkers(4, [&](Distributed& dist) {
      const int r = dist.rank();
      ParallelPlan plan(dist, "expert:2,model:2");
      ASSERT_EQ(plan.batch_shards(), 2);
      ASSERT_EQ(plan.batch_shard(), r / 2);
      BatchShardScope shard(plan.batch_shard(), plan.batch_shards());
      auto lm = SmallMoeLm(2, 2, 0.1, plan.Context(), 1, /*model_split=*/true);
      int experts = 0, splits = 0;
      for (const auto& v : LearnerVariables(*lm)) {
        sharded[r][v.name] = {v.expert_sharded, v.model_sharded};
        if (!v.rank_local()) continue;
        experts += v.expert_sharded;
        splits += v.model_sharded;
        const auto rule = plan.RankLocal(v);
        EXPECT_DOUBLE_EQ(rule.scale, 0.5) << v.name;
        EXPECT_EQ(rule.group, v.expert_sharded ? plan.data_group() : plan.batch_group()) << v.name;
        EXPECT_DOUBLE_EQ(rule.norm_weight, 0.5) << v.name;
      }
      // The dense layer's q, k, v (w and b), post, fc0 (w and b) and fc1 w; the MoE layer's 7
      // attention projections; the embedding, softmax weight and bias.
      EXPECT_EQ(splits, 10 + 7 + 3);
      EXPECT_GT(experts, 0);
      auto sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, true);
      if (!mutated) plan.Configure(*sync);
      lm->learner().SetGradientSync(sync);
      const int e = r / 2;
      losses[r] = TrainSteps(*lm, batches, 4 * e, 4 * e + 4, plan.batch_group());
      for (const auto& v : LearnerVariables(*lm)) weights[r][v.name] = v.value.detach().clone();
    });
    double worst = 0;
    for (const auto& v : one_vars) {
      if (v.name.ends_with("key/b")) continue;  // its gradient cancels in the softmax
      const at::Tensor w = v.value.detach();
      for (int r = 0; r < 4; ++r) {
        const auto [expert, model] = sharded[r].at(v.name);
        at::Tensor want = w;
        if (expert) want = w.slice(0, 2 * (r / 2), 2 * (r / 2) + 2);
        if (model) {
          const int64_t dim = ModelSplitDim(v.name, w.dim()), n = w.size(dim) / 2;
          want = w.slice(dim, (r % 2) * n, (r % 2) * n + n);
        }
        const at::Tensor& mine = weights[r].at(v.name);
        ASSERT_EQ(mine.sizes(), want.sizes()) << v.name << " on rank " << r;
        const double rel = ((mine - want).abs().max() /
                            at::clamp_min(want.abs().max(), 1e-12)).item<double>();
        worst = std::max(worst, rel);
        if (!mutated) {
          EXPECT_LT(rel, 1e-5) << v.name << " on rank " << r;
        }
      }
    }
    if (mutated) {
      EXPECT_GT(worst, 1e-3);
      continue;
    }
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(losses[0][s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
      EXPECT_EQ(losses[1][s], losses[0][s]) << "step " << s;  // a shard's model ranks agree
    }
  }
}

// A 4-layer LM whose stack is pipelined over `splits` stages of `micro` micro-batches, with
// dropout `dropout` at every site of its layers.
std::unique_ptr<TransformerLmTask> SmallPipeLm(int splits, int micro, double dropout,
                                               bool sgd = false,
                                               const BuildContext& context = BuildContext()) {
  Params p = TransformerLmTask::CommonParams(50, 16, 32, 2, 4);
  p.Set("name", "lm").Set("random_seed", 5);
  p.Set("train.learner.learning_rate", sgd ? 0.5 : 1e-2);
  p.Set("train.learner.lr_schedule", ConstantSchedule::Params());
  p.Set("train.learner.optimizer", sgd ? SGD::Params() : Adam::Params());
  p.Set("train.learner.clip_gradient_norm_to_value", 0.5);  // clipping sees the global gradient
  p.Set("stack.dropout_prob", dropout);
  p.Set("stack.splits", splits).Set("stack.num_micro_batches", micro);
  return InstantiateLayer<TransformerLmTask>(p, context);
}

// Issue 36's pipeline equivalence: the LM's 4 layers as 2 stages on 2 ranks and as 4 stages on 4
// ranks (4 micro-batches of 2 rows; activations and gradients by c10d send/recv) train like the
// unpipelined LM in one process: 20 Adam steps with global-norm clipping and dropout 0.1 in
// every layer, losses within 1e-6 and weights within 1e-5 relative, with the replicated
// gradients reduced after the backward pass and overlapped with it. Each rank holds only its
// stage's layers (and their slots); the same pipeline on threads in one process agrees too.
TEST(Distributed, PipelineStagesOnRanksTrainLikeOneProcess) {
  const int steps = 20;
  std::vector<at::Tensor> batches;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(19);
  for (int s = 0; s < steps; ++s) batches.push_back(at::randint(3, 50, {8, 12}, gen));
  auto one = SmallPipeLm(1, 1, 0.1);
  const auto one_vars = LearnerVariables(*one);
  const std::vector<double> one_losses = TrainSteps(*one, batches, 0, 8);
  EXPECT_LT(one_losses.back(), one_losses.front());
  for (const int n : {2, 4}) {
    SCOPED_TRACE(StrCat(n, " stages"));
    {
      auto threads = SmallPipeLm(n, 4, 0.1);  // the stages on threads of one process
      const std::vector<double> losses = TrainSteps(*threads, batches, 0, 8);
      for (int s = 0; s < steps; ++s) {
        EXPECT_NEAR(losses[s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
      }
    }
    for (const bool overlapped : {false, true}) {
      SCOPED_TRACE(overlapped ? "overlapped" : "after the backward pass");
      std::vector<std::vector<double>> losses(n);
      std::vector<std::map<std::string, at::Tensor>> weights(n);
      std::vector<std::vector<std::string>> remote(n);
      RunWorkers(n, [&](Distributed& dist) {
        const int r = dist.rank();
        ParallelPlan plan(dist, StrCat("pipe:", n));
        auto lm = SmallPipeLm(n, 4, 0.1, false, plan.Context());
        remote[r] = lm->RemoteScopes();
        auto sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, overlapped);
        plan.Configure(*sync);
        lm->learner().SetGradientSync(sync);
        losses[r] = TrainSteps(*lm, batches, 0, 8, &dist);
        for (const auto& v : LearnerVariables(*lm)) {
          // A stage's variables are its layers' (stage 0's also the embedding, the last's the
          // final layer norm and the softmax: Lingvo's placement), tagged; nothing replicated.
          EXPECT_TRUE(v.pipeline_stage) << v.name;
          EXPECT_EQ(LmStageOf(v.name, n, 4), r) << v.name;
          weights[r][v.name] = v.value.detach().clone();
        }
      });
      for (int s = 0; s < steps; ++s) {
        EXPECT_NEAR(losses[0][s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
        EXPECT_EQ(losses[n - 1][s], losses[0][s]) << "step " << s;
      }
      for (const auto& v : one_vars) {
        // key/b: its gradient cancels in softmax up to rounding; every other variable must agree.
        if (v.name.size() > 5 && v.name.substr(v.name.size() - 5) == "key/b") continue;
        const int stage = LmStageOf(v.name, n, 4);
        const at::Tensor want = v.value.detach();
        for (int r = 0; r < n; ++r) {
          const bool mine = stage < 0 || stage == r;
          ASSERT_EQ(weights[r].count(v.name), mine ? 1u : 0u) << v.name << " on rank " << r;
          if (!mine) continue;
          const double rel = ((weights[r].at(v.name) - want).abs().max() /
                              at::clamp_min(want.abs().max(), 1e-12)).item<double>();
          EXPECT_LT(rel, 1e-5) << v.name << " on rank " << r;
        }
      }
      // Rank 0 lacks the later stages' layers, the final layer norm and the softmax; the last
      // rank the embedding.
      const std::set<std::string> first(remote[0].begin(), remote[0].end());
      EXPECT_EQ(first.size(), static_cast<size_t>(4 - 4 / n + 2)) << Join(remote[0], ", ");
      for (const std::string& s : {StrCat("lm/stack/x_layers_", 4 / n), std::string("lm/softmax"),
                                  std::string("lm/stack/final_ln")}) {
        EXPECT_TRUE(first.count(s)) << s << " not in " << Join(remote[0], ", ");
      }
      const std::set<std::string> last(remote[n - 1].begin(), remote[n - 1].end());
      EXPECT_TRUE(last.count("lm/emb")) << Join(remote[n - 1], ", ");
    }
  }
}

// A pipe or expert axis with one fault: the mutations the equivalences above must catch.
class FaultyAxis : public MeshAxis {
 public:
  enum Fault { kLoseGradients, kNoExchange };
  FaultyAxis(MeshAxis& real, Fault fault) : real_(real), fault_(fault) {}
  int size() const override { return real_.size(); }
  int index() const override { return real_.index(); }
  // kNoExchange: every block stays on its rank (the tokens never reach their experts).
  at::Tensor ExchangeBlocks(const at::Tensor& input) override {
    return fault_ == kNoExchange ? input.clone() : real_.ExchangeBlocks(input);
  }
  void SendTo(const at::Tensor& t, int dst) override { real_.SendTo(t, dst); }
  // kLoseGradients: what rank 0 receives (on 2 stages, only the gradients) arrives as zeros.
  void RecvFrom(at::Tensor& out, int src) override {
    real_.RecvFrom(out, src);
    if (fault_ == kLoseGradients && real_.index() == 0) out.zero_();
  }
  void Broadcast(at::Tensor& t, int root) override { real_.Broadcast(t, root); }
  void AllReduceSum(at::Tensor& t) override { real_.AllReduceSum(t); }

 private:
  MeshAxis& real_;
  Fault fault_;
};

// The largest relative difference between a rank's weights and the one-process model's (an
// expert variable against its block of `per` experts at expert_block · per).
double WorstWeightDifference(const std::vector<LearnerVariable>& one,
                             const std::map<std::string, at::Tensor>& rank, int per = 0,
                             int expert_block = 0) {
  double worst = 0;
  for (const auto& v : one) {
    if (!rank.count(v.name)) continue;
    const at::Tensor& got = rank.at(v.name);
    at::Tensor want = v.value.detach();
    if (got.size(0) != want.size(0)) want = want.slice(0, per * expert_block, per * expert_block + per);
    worst = std::max(worst, ((got - want).abs().max() /
                             at::clamp_min(want.abs().max(), 1e-12)).item<double>());
  }
  return worst;
}

// A mutation check per axis: a pipe axis that loses the gradients on their way back to stage 0,
// and an expert axis whose all-to-all keeps every token on its own rank, train away from one
// process (weights apart by more than 1e-3 after 10 steps), where the real axes stay within 1e-5
// (the equivalences above).
TEST(Distributed, AFaultyPipeOrExpertAxisPartsFromOneProcess) {
  const int steps = 10;
  std::vector<at::Tensor> batches;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(29);
  for (int s = 0; s < steps; ++s) batches.push_back(at::randint(3, 50, {8, 12}, gen));
  {
    auto one = SmallPipeLm(1, 1, 0.1);
    TrainSteps(*one, batches, 0, 8);
    const auto one_vars = LearnerVariables(*one);
    std::vector<double> worst(2);
    RunWorkers(2, [&](Distributed& dist) {
      ParallelPlan plan(dist, "pipe:2");
      FaultyAxis lossy(*plan.mesh().pipe_axis(), FaultyAxis::kLoseGradients);
      auto lm = SmallPipeLm(2, 4, 0.1, false, BuildContext().WithAxis("pipe", &lossy));
      auto sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, true);
      plan.Configure(*sync);
      lm->learner().SetGradientSync(sync);
      TrainSteps(*lm, batches, 0, 8, &dist);
      std::map<std::string, at::Tensor> weights;
      for (const auto& v : LearnerVariables(*lm)) weights[v.name] = v.value.detach();
      worst[dist.rank()] = WorstWeightDifference(one_vars, weights);
    });
    EXPECT_GT(worst[0], 1e-3) << "stage 0 trained as if its gradients had arrived";
  }
  {
    auto one = SmallMoeLm(1, 2, 0.0);
    TrainSteps(*one, batches, 0, 8);
    const auto one_vars = LearnerVariables(*one);
    std::vector<double> worst(2);
    RunWorkers(2, [&](Distributed& dist) {
      const int r = dist.rank();
      DistributedMeshAxis axis(dist);
      FaultyAxis stay(axis, FaultyAxis::kNoExchange);
      BatchShardScope shard(r, 2);
      auto lm = SmallMoeLm(2, 2, 0.0, BuildContext().WithAxis("expert", &stay));
      lm->learner().SetGradientSync(std::make_shared<DataParallelGradientSync>(dist, 1 << 12, true));
      TrainSteps(*lm, batches, 4 * r, 4 * r + 4, &dist);
      std::map<std::string, at::Tensor> weights;
      for (const auto& v : LearnerVariables(*lm)) weights[v.name] = v.value.detach();
      worst[r] = WorstWeightDifference(one_vars, weights, 2, r);
    });
    EXPECT_GT(std::max(worst[0], worst[1]), 1e-3) << "tokens that never left their rank";
  }
}

// The data × pipe mesh (--mesh=data:2,pipe:2): 4 ranks, rank r = 2d + s. Ranks {0, 1} and {2, 3}
// are two pipelines of the LM's 4 layers (2 per stage), each on half the batch; ranks {0, 2} and
// {1, 3} hold the same stage and average its gradients. 20 steps with clipping and dropout 0.1
// against one process, with Adam and with SGD (which a wrong gradient scale cannot hide from):
// losses within 1e-6, weights within 1e-5.
TEST(Distributed, DataTimesPipeMeshTrainsLikeOneProcess) {
  const int steps = 20;
  std::vector<at::Tensor> batches;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(23);
  for (int s = 0; s < steps; ++s) batches.push_back(at::randint(3, 50, {8, 12}, gen));
  for (const bool sgd : {false, true}) {
    SCOPED_TRACE(sgd ? "SGD" : "Adam");
    auto one = SmallPipeLm(1, 1, 0.1, sgd);
    const auto one_vars = LearnerVariables(*one);
    const std::vector<double> one_losses = TrainSteps(*one, batches, 0, 8);
    std::vector<std::vector<double>> losses(4);
    std::vector<std::map<std::string, at::Tensor>> weights(4);
    RunWorkers(4, [&](Distributed& dist) {
      const int r = dist.rank();
      ParallelPlan plan(dist, "data:2,pipe:2");
      DistributedMesh& mesh = plan.mesh();
      EXPECT_EQ(mesh.pipe_index(), r % 2);
      EXPECT_EQ(mesh.batch_shard(), r / 2);
      BatchShardScope shard(mesh.batch_shard(), 2);  // as the trainer does
      auto lm = SmallPipeLm(2, 2, 0.1, sgd, BuildContext().WithAxis("pipe", mesh.pipe_axis()));
      auto sync = std::make_shared<DataParallelGradientSync>(dist, 1 << 12, true);
      plan.Configure(*sync);
      lm->learner().SetGradientSync(sync);
      const int d = mesh.batch_shard();
      losses[r] = TrainSteps(*lm, batches, 4 * d, 4 * d + 4, &dist);
      for (const auto& v : LearnerVariables(*lm)) weights[r][v.name] = v.value.detach().clone();
    });
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(losses[0][s], one_losses[s], 1e-6 * std::abs(one_losses[s])) << "step " << s;
    }
    for (const auto& v : one_vars) {
      if (v.name.size() > 5 && v.name.substr(v.name.size() - 5) == "key/b") continue;
      const int stage = LmStageOf(v.name, 2, 4);
      const at::Tensor want = v.value.detach();
      for (int r = 0; r < 4; ++r) {
        const bool mine = stage < 0 || stage == r % 2;
        ASSERT_EQ(weights[r].count(v.name), mine ? 1u : 0u) << v.name << " on rank " << r;
        if (!mine) continue;
        const double rel = ((weights[r].at(v.name) - want).abs().max() /
                            at::clamp_min(want.abs().max(), 1e-12)).item<double>();
        EXPECT_LT(rel, 1e-5) << v.name << " on rank " << r;
      }
    }
    EXPECT_LT(one_losses.back(), one_losses.front());
  }
}

// A pipeline's ranks compute on rank 0's batch, whatever their own readers gave them, and stop
// together when rank 0's input ends; without a pipe axis the batch is left alone.
TEST(Distributed, PipelineRanksShareRankZerosBatch) {
  RunWorkers(2, [&](Distributed& dist) {
    const int r = dist.rank();
    NestedMap batch;
    batch.Set("ids", at::full({2, 3 + r}, r, at::kLong));
    batch.Set("paddings", at::zeros({2, 3 + r}));
    EXPECT_TRUE(ShareBatchOverPipe(nullptr, true, batch));  // no axis
    EXPECT_EQ(batch.GetTensor("ids").size(1), 3 + r);
    DistributedMeshAxis axis(dist);
    EXPECT_TRUE(ShareBatchOverPipe(&axis, true, batch));
    EXPECT_TRUE(at::equal(batch.GetTensor("ids"), at::zeros({2, 3}, at::kLong))) << "rank " << r;
    EXPECT_EQ(batch.GetTensor("paddings").sizes(), at::IntArrayRef({2, 3}));
    // Rank 0's input ended: every rank stops, though rank 1 still had a batch.
    EXPECT_FALSE(ShareBatchOverPipe(&axis, r != 0, batch)) << "rank " << r;
  });
}

// A pipeline placed on a pipe axis of another size, and stages that would change the
// activation's shape, are refused with what to do.
TEST(Distributed, PipelineStagesNeedOneRankEach) {
  RunWorkers(2, [&](Distributed& dist) {
    DistributedMeshAxis axis(dist);
    const BuildContext context = BuildContext().WithAxis("pipe", &axis);
    EXPECT_ERROR_CONTAINS(SmallPipeLm(4, 1, 0.0, false, context), FailedPreconditionError,
                          "has 4 pipeline stage(s), but the mesh's 'pipe' axis has 2 ranks");
    auto lm = SmallPipeLm(2, 1, 0.0, false, context);
    EXPECT_ERROR_CONTAINS(lm->GetChildAs<TransformerStack>("stack").InitStates(1, at::kFloat),
                          FailedPreconditionError,
                          "holds only pipeline stage");
  });
}

// The rank layout, defined by MeshShape alone: rank r = (d·S + s)·E + e, so a pipe mesh puts
// rank r at (r / S, r % S) and an expert mesh at (r / E, r % E); Of and RankAt are inverses.
TEST(Distributed, MeshShapeDefinesTheRankLayout) {
  MeshShape pipe;
  pipe.data = 3;
  pipe.pipe = 2;
  MeshShape expert;
  expert.data = 2;
  expert.expert = 4;
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(pipe.Of(r).data, r / 2);
    EXPECT_EQ(pipe.Of(r).pipe, r % 2);
    EXPECT_EQ(pipe.Of(r).expert, 0);
  }
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(expert.Of(r).data, r / 4);
    EXPECT_EQ(expert.Of(r).expert, r % 4);
    EXPECT_EQ(expert.Of(r).pipe, 0);
  }
  MeshShape all;
  all.data = 2;
  all.pipe = 3;
  all.expert = 2;
  std::set<std::tuple<int, int, int>> seen;
  for (int r = 0; r < all.world_size(); ++r) {
    const MeshShape::Coordinates c = all.Of(r);
    EXPECT_EQ(all.RankAt(c), r);
    seen.insert({c.data, c.pipe, c.expert});
  }
  EXPECT_EQ(seen.size(), 12u);
  EXPECT_EQ(all.Of(7).data, 1);  // 7 = (1·3 + 0)·2 + 1
  EXPECT_EQ(all.Of(7).pipe, 0);
  EXPECT_EQ(all.Of(7).expert, 1);
  EXPECT_EQ(all.Describe(), "data 2 x pipe 3 x expert 2");
  EXPECT_EQ(MeshShape().Describe(), "data 1");
  // The model axis is the fastest: a model group's ranks are neighbours.
  const MeshShape dpm{.data = 2, .pipe = 2, .model = 2};
  EXPECT_EQ(dpm.Describe(), "data 2 x pipe 2 x model 2");
  for (int r = 0; r < 8; ++r) {
    const MeshShape::Coordinates c = dpm.Of(r);
    EXPECT_EQ(c.model, r % 2);
    EXPECT_EQ(c.pipe, r / 2 % 2);
    EXPECT_EQ(c.data, r / 4);
    EXPECT_EQ(dpm.RankAt(c), r);
    EXPECT_EQ(dpm.BatchShard(c), r / 4);  // pipe and model ranks share their batches
  }
  EXPECT_EQ(dpm.batch_shards(), 2);
}

TEST(Distributed, MeshFlagNamesWhatIsWrong) {
  EXPECT_EQ(ParseMesh("", 4).expert, 4);
  EXPECT_EQ(ParseMesh("", 4).data, 1);
  const MeshShape m = ParseMesh("expert:2,data:3", 6);
  EXPECT_EQ(m.data, 3);
  EXPECT_EQ(m.expert, 2);
  EXPECT_EQ(ParseMesh("data:4", 4).expert, 1);
  EXPECT_ERROR_CONTAINS(ParseMesh("data:2,expert:2", 6), InvalidArgumentError,
                        "data 2 x expert 2 = 4 ranks, but the job has 6");
  EXPECT_EQ(ParseMesh("pipe:4", 4).pipe, 4);
  EXPECT_EQ(ParseMesh("pipe:2,data:2", 4).data, 2);
  EXPECT_ERROR_CONTAINS(ParseMesh("pipe:2", 4), InvalidArgumentError,
                        "pipe 2 = 2 ranks, but the job has 4");
  const MeshShape dm = ParseMesh("model:2,data:2", 4);
  EXPECT_EQ(dm.data, 2);
  EXPECT_EQ(dm.model, 2);
  EXPECT_EQ(ParseMesh("data:2,pipe:2,model:2", 8).world_size(), 8);
  const MeshShape em = ParseMesh("expert:2,model:2", 4);  // rank r = 2e + m
  EXPECT_EQ(em.Of(1).model, 1);
  EXPECT_EQ(em.Of(2).expert, 1);
  EXPECT_EQ(em.batch_shards(), 2);
  EXPECT_EQ(ParseMesh("data:2,pipe:2,expert:2,model:2", 16).world_size(), 16);
  EXPECT_ERROR_CONTAINS(ParseMesh("data:2,model:3", 4), InvalidArgumentError,
                        "data 2 x model 3 = 6 ranks, but the job has 4");
  EXPECT_EQ(ParseMesh("pipe:2,expert:2", 4).world_size(), 4);  // MoE inside a pipeline
  EXPECT_ERROR_CONTAINS(ParseMesh("pipeline:2", 2), InvalidArgumentError,
                        "unknown or repeated axis 'pipeline'");
  EXPECT_ERROR_CONTAINS(ParseMesh("data:2,data:1", 2), InvalidArgumentError, "repeated");
  EXPECT_ERROR_CONTAINS(ParseMesh("data:x", 2), InvalidArgumentError, "not an integer");
  EXPECT_ERROR_CONTAINS(ParseMesh("data:0,expert:2", 2), InvalidArgumentError, "must be >= 1");
  EXPECT_ERROR_CONTAINS(ParseMesh("data2", 2), InvalidArgumentError, "is not axis:size");
}

TEST(Distributed, OptionsFromTheEnvironment) {
  ::unsetenv("WORLD_SIZE");
  EXPECT_FALSE(DistributedOptionsFromEnv().has_value());
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("RANK", "3", 1);
  ::setenv("MASTER_ADDR", "10.0.0.7", 1);
  ::setenv("MASTER_PORT", "1234", 1);
  ::unsetenv("LOCAL_RANK");
  auto o = DistributedOptionsFromEnv();
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->world_size, 4);
  EXPECT_EQ(o->rank, 3);
  EXPECT_EQ(o->local_rank, 3);
  EXPECT_EQ(o->master_addr, "10.0.0.7");
  EXPECT_EQ(o->master_port, 1234);
  ::setenv("RANK", "4", 1);
  EXPECT_ERROR_CONTAINS(DistributedOptionsFromEnv(), InvalidArgumentError, "RANK must be in");
  ::setenv("RANK", "x", 1);
  EXPECT_ERROR_CONTAINS(DistributedOptionsFromEnv(), InvalidArgumentError, "RANK='x'");
  ::setenv("RANK", "0", 1);
  ::setenv("MASTER_PORT", "70000", 1);
  EXPECT_ERROR_CONTAINS(DistributedOptionsFromEnv(), InvalidArgumentError, "MASTER_PORT");
  // MASTER_PORT=0: rank 0 binds a free port and announces it; another rank needs the real one.
  ::setenv("MASTER_PORT", "0", 1);
  o = DistributedOptionsFromEnv();
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->master_port, 0);
  EXPECT_TRUE(static_cast<bool>(o->on_listening));
  ::setenv("RANK", "1", 1);
  EXPECT_ERROR_CONTAINS(DistributedOptionsFromEnv(), InvalidArgumentError,
                        "MASTER_PORT=0 (a free port) is for rank 0 alone");
  ::setenv("RANK", "0", 1);
  ::setenv("GLOSSA_RENDEZVOUS_PORT_FD", "1", 1);
  EXPECT_ERROR_CONTAINS(DistributedOptionsFromEnv(), InvalidArgumentError,
                        "GLOSSA_RENDEZVOUS_PORT_FD must be a descriptor above 2");
  for (const char* v : {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT",
                        "GLOSSA_RENDEZVOUS_PORT_FD"}) {
    ::unsetenv(v);
  }
  DistributedOptions bad;
  bad.backend = "mpi";
  EXPECT_ERROR_CONTAINS(Distributed d(bad), InvalidArgumentError, "backend 'mpi'");
}

}  // namespace
}  // namespace glossa
