// Data-parallel gradient averaging for the Learner over a Distributed world (PyTorch DDP's
// reducer), with the rank-local rule the parallel plan gives for sharded variables.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "glossa/optim/learner.h"
#include "glossa/runtime/distributed.h"

namespace glossa {

// PyTorch DDP's reducer for the Learner (Learner::SetGradientSync): gradients are averaged over
// the ranks in flattened buckets of about bucket_bytes (variables in reverse order, the order
// the backward pass finishes them, one dtype per bucket). With overlap, hooks on the variables'
// gradient accumulators copy each gradient into its bucket as soon as the backward pass has
// finished it, and a full bucket's allreduce starts right away (buckets start in order, so every
// rank issues the same collectives; the first bucket holds 1 MB at most, so that communication
// starts early), while the backward pass goes on; Reduce zero-fills what the loss did not reach,
// starts the remaining buckets, waits for all and hands back the means as views of the buckets.
// Without overlap, Reduce does it all after the backward pass (Distributed::AllReduceMean).
class DataParallelGradientSync : public Learner::GradientSync {
 public:
  DataParallelGradientSync(Distributed& dist, int64_t bucket_bytes = 25 << 20,
                           bool overlap = true);
  ~DataParallelGradientSync() override;
  bool overlaps() const override { return overlap_; }
  void BeforeBackward(const std::vector<at::Tensor>& vars) override;
  void Reduce(std::vector<at::Tensor>& grads) override;
  // Rank-local variables (LearnerVariable::rank_local: an expert axis's experts, a pipeline
  // stage's layers, a model axis's blocks) stay out of the buckets. Each is summed over the ranks
  // that hold replicas of the same values but read other rows of the batch (its rule's group: the
  // data group, or a pipeline stage's data x expert ranks), then multiplied by its scale; the
  // global norm counts its squares times its norm weight (1 / the ranks holding the same
  // values), summed over the world in one small allreduce. The rule gives these per variable
  // (ParallelPlan::Configure). Without one: the world is one expert axis (scale 1 / world,
  // weight 1, no group).
  struct RankLocalSync {
    double scale = 1.0, norm_weight = 1.0;
    Distributed* group = nullptr;  // null or of one rank: no sum
  };
  using RankLocalRule = std::function<RankLocalSync(const LearnerVariable&)>;
  void SetRankLocalRule(RankLocalRule rule) { rule_ = std::move(rule); }
  void SetVariables(const std::vector<LearnerVariable>& vars) override;
  double NormWeight(size_t k) const override;
  double GlobalSquaredNorm(double replicated, double sharded) override;

  struct Stats {
    int64_t steps = 0;
    int64_t bytes = 0;              // sent into allreduce by this rank, all steps
    int64_t buckets = 0;            // allreduces, all steps
    int64_t early_buckets = 0;      // of those, started while the backward pass still ran
    double exposed_seconds = 0;     // in Reduce: the communication the backward did not hide
  };
  Stats stats() const;

 private:
  struct Core;
  Distributed& dist_;
  int64_t bucket_bytes_;
  bool overlap_;
  std::vector<bool> sharded_;
  std::vector<double> sharded_scale_, norm_weight_;  // per variable (rank-local ones)
  std::vector<Distributed*> sum_group_;               // per variable (rank-local ones)
  RankLocalRule rule_;
  std::shared_ptr<Core> core_;
};

}  // namespace glossa
