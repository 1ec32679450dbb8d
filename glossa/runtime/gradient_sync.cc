// PyTorch DDP's reducer for the Learner (glossa/runtime/distributed.h: DataParallelGradientSync).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <tuple>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/runtime/gradient_sync.h"
#include "glossa/runtime/distributed_impl.h"

namespace glossa {

// ---- DataParallelGradientSync ----

struct DataParallelGradientSync::Core {
  struct Bucket {
    at::Tensor flat;
    std::vector<size_t> vars;
    int64_t pending = 0;
    bool launched = false;
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::mutex mu;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::vector<const void*> keys;  // the variables' TensorImpls: a new set rebuilds the buckets
  std::vector<at::Tensor> vars;
  std::vector<bool> sharded;  // per variable: this rank's experts only, in no bucket
  std::vector<size_t> bucket_of;
  std::vector<int64_t> offset_of;
  std::vector<bool> ready;
  std::vector<Bucket> buckets;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // kept alive with the hooks
  size_t next_launch = 0;
  bool active = false;
  at::Tensor scale;  // 1 / world, a scalar tensor
  int64_t generation = 0;
  Stats stats;

  void LaunchReady(bool during_backward) {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch++];
      std::vector<at::Tensor> one = {b.flat};
      b.work = pg->allreduce(one);
      b.launched = true;
      ++stats.buckets;
      if (during_backward) ++stats.early_buckets;
      stats.bytes += b.flat.numel() * static_cast<int64_t>(b.flat.element_size());
    }
  }

  // The accumulator hook of variable i: its gradient is final.
  void GradReady(size_t i, int64_t gen) {
    std::lock_guard<std::mutex> lock(mu);
    if (!active || gen != generation || ready[i] || sharded[i]) return;
    const at::Tensor g = vars[i].grad();
    if (!g.defined()) return;
    Bucket& b = buckets[bucket_of[i]];
    {
      // Scaled by 1/world on the way in (one pass, as DDP divides before its allreduce).
      at::NoGradGuard no_grad;
      at::Tensor slot = b.flat.slice(0, offset_of[i], offset_of[i] + g.numel());
      at::mul_out(slot, g.reshape({-1}), scale);
    }
    ready[i] = true;
    --b.pending;
    LaunchReady(/*during_backward=*/true);
  }
};

DataParallelGradientSync::DataParallelGradientSync(Distributed& dist, int64_t bucket_bytes,
                                                   bool overlap)
    : dist_(dist), bucket_bytes_(std::max<int64_t>(1, bucket_bytes)), overlap_(overlap),
      core_(std::make_shared<Core>()) {
  core_->pg = dist.impl_->pg;
  core_->scale = at::scalar_tensor(1.0 / dist.world_size(), at::kFloat);
}

DataParallelGradientSync::~DataParallelGradientSync() {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->active = false;
  ++core_->generation;  // hooks left on the accumulators do nothing from now on
}

DataParallelGradientSync::Stats DataParallelGradientSync::stats() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->stats;
}

void DataParallelGradientSync::BeforeBackward(const std::vector<at::Tensor>& vars) {
  Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  std::vector<const void*> keys;
  for (const at::Tensor& v : vars) keys.push_back(v.unsafeGetTensorImpl());
  std::vector<bool> sharded = sharded_.size() == vars.size() ? sharded_
                                                             : std::vector<bool>(vars.size(), false);
  if (keys != c.keys || sharded != c.sharded) {
    // New buckets, in reverse variable order (DDP's approximation of the backward order).
    ++c.generation;
    c.keys = keys;
    c.vars = vars;
    c.sharded = sharded;
    c.bucket_of.assign(vars.size(), 0);
    c.offset_of.assign(vars.size(), 0);
    c.buckets.clear();
    c.accumulators.clear();
    std::vector<int64_t> fill;
    for (size_t k = vars.size(); k-- > 0;) {
      if (sharded[k]) continue;  // not averaged: Reduce scales it
      const at::Tensor& v = vars[k];
      const int64_t bytes = v.numel() * static_cast<int64_t>(v.element_size());
      // The first bucket is small (1 MB at most, as DDP's), so that communication starts early.
      const int64_t cap = c.buckets.size() == 1 ? std::min<int64_t>(bucket_bytes_, 1 << 20)
                                                : bucket_bytes_;
      if (c.buckets.empty() || c.buckets.back().flat.scalar_type() != v.scalar_type() ||
          (fill.back() > 0 && fill.back() + bytes > cap)) {
        c.buckets.emplace_back();
        c.buckets.back().flat = at::empty({0}, v.options().requires_grad(false));
        fill.push_back(0);
      }
      c.bucket_of[k] = c.buckets.size() - 1;
      c.offset_of[k] = fill.back() / static_cast<int64_t>(v.element_size());
      c.buckets.back().vars.push_back(k);
      fill.back() += bytes;
    }
    for (size_t b = 0; b < c.buckets.size(); ++b) {
      const at::Tensor& first = vars[c.buckets[b].vars.front()];
      c.buckets[b].flat = at::zeros({fill[b] / static_cast<int64_t>(first.element_size())},
                                    first.options().requires_grad(false));
    }
    const int64_t gen = c.generation;
    std::weak_ptr<Core> weak = core_;
    for (size_t k = 0; k < vars.size(); ++k) {
      if (sharded[k]) continue;
      std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(vars[k]);
      if (!acc) continue;  // not a leaf: filled in by Reduce
      acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak, k, gen](const torch::autograd::variable_list& outputs,
                         const torch::autograd::variable_list&) {
            if (auto core = weak.lock()) core->GradReady(k, gen);
            return outputs;
          }));
      c.accumulators.push_back(std::move(acc));
    }
  }
  for (auto& b : c.buckets) {
    b.pending = static_cast<int64_t>(b.vars.size());
    b.launched = false;
    b.work.reset();
  }
  c.ready.assign(vars.size(), false);
  c.next_launch = 0;
  c.active = true;
}

void DataParallelGradientSync::SetVariables(const std::vector<LearnerVariable>& vars) {
  sharded_.assign(vars.size(), false);
  sharded_scale_.assign(vars.size(), 1.0);
  norm_weight_.assign(vars.size(), 1.0);
  sum_group_.assign(vars.size(), nullptr);
  for (size_t k = 0; k < vars.size(); ++k) {
    if (!vars[k].rank_local()) continue;
    sharded_[k] = true;
    if (rule_) {
      const RankLocalSync r = rule_(vars[k]);
      sharded_scale_[k] = r.scale;
      norm_weight_[k] = r.norm_weight;
      sum_group_[k] = r.group != nullptr && r.group->world_size() > 1 ? r.group : nullptr;
    } else {
      sharded_scale_[k] = 1.0 / dist_.world_size();  // the world is one expert axis
    }
  }
}

double DataParallelGradientSync::NormWeight(size_t k) const {
  return k < norm_weight_.size() ? norm_weight_[k] : 1.0;
}

double DataParallelGradientSync::GlobalSquaredNorm(double replicated, double sharded) {
  if (std::find(sharded_.begin(), sharded_.end(), true) == sharded_.end()) {
    return replicated + sharded;
  }
  // Each rank's squares weighted by 1 / the copies of their values: every value once.
  at::Tensor t = at::scalar_tensor(sharded, at::kDouble).view({1});
  dist_.AllReduceSum({t});
  return replicated + t.item<double>();
}

namespace {

// Sums the gradients grads[k] for k in `which` over `group`, in place of grads[k] (one allreduce
// per dtype, flattened).
void SumOver(Distributed& group, std::vector<at::Tensor>& grads, const std::vector<size_t>& which) {
  std::map<at::ScalarType, std::vector<size_t>> by_dtype;
  for (size_t k : which) by_dtype[grads[k].scalar_type()].push_back(k);
  for (auto& [dtype, ks] : by_dtype) {
    std::vector<at::Tensor> parts;
    for (size_t k : ks) parts.push_back(grads[k].reshape({-1}));
    at::Tensor flat = at::cat(parts);
    group.AllReduceSum({flat});
    int64_t offset = 0;
    for (size_t k : ks) {
      grads[k] = flat.slice(0, offset, offset + grads[k].numel()).view(grads[k].sizes());
      offset += grads[k].numel();
    }
  }
}

}  // namespace

void DataParallelGradientSync::Reduce(std::vector<at::Tensor>& grads) {
  // A sharded variable's gradient already sums every rank's tokens' contributions to this rank's
  // experts (the all-to-all's backward); the loss is each rank's mean, so the global mean's
  // gradient is that sum over the ranks.
  const bool any_sharded = sharded_.size() == grads.size() &&
                           std::find(sharded_.begin(), sharded_.end(), true) != sharded_.end();
  // The replicas of each share sum their gradients first, group by group in the order of their
  // first variable (the same order on every rank of a group: they hold the same variables).
  if (any_sharded) {
    at::NoGradGuard no_grad;
    std::vector<std::pair<Distributed*, std::vector<size_t>>> groups;
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!sharded_[k] || sum_group_[k] == nullptr) continue;
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const auto& e) { return e.first == sum_group_[k]; });
      if (g == groups.end()) {
        groups.push_back({sum_group_[k], {k}});
      } else {
        g->second.push_back(k);
      }
    }
    for (auto& [group, which] : groups) SumOver(*group, grads, which);
  }
  if (!overlap_) {
    std::vector<at::Tensor> in;
    for (size_t k = 0; k < grads.size(); ++k) {
      if (any_sharded && sharded_[k]) {
        if (sharded_scale_[k] != 1.0) grads[k] = grads[k] * sharded_scale_[k];
      } else {
        in.push_back(grads[k]);
      }
    }
    const auto start = std::chrono::steady_clock::now();
    const int64_t bytes = dist_.AllReduceMean(in, bucket_bytes_);
    std::lock_guard<std::mutex> lock(core_->mu);
    ++core_->stats.steps;
    core_->stats.bytes += bytes;
    core_->stats.exposed_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return;
  }
  Core& c = *core_;
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(c.mu);
  if (!c.active || grads.size() != c.vars.size()) {
    throw InternalError(StrCat("DataParallelGradientSync: Reduce got ", grads.size(),
                               " gradients for ", c.vars.size(),
                               " variables (BeforeBackward was not called for this step)"));
  }
  c.active = false;
  at::NoGradGuard no_grad;
  // What the hooks did not see (variables the loss does not reach, or not leaves).
  for (size_t k = 0; k < grads.size(); ++k) {
    if (c.sharded[k]) {
      if (sharded_scale_[k] != 1.0) grads[k] = grads[k] * sharded_scale_[k];
      continue;
    }
    if (c.ready[k]) continue;
    Core::Bucket& b = c.buckets[c.bucket_of[k]];
    at::Tensor slot = b.flat.slice(0, c.offset_of[k], c.offset_of[k] + grads[k].numel());
    at::mul_out(slot, grads[k].reshape({-1}).to(slot.scalar_type()), c.scale);
    c.ready[k] = true;
    --b.pending;
  }
  c.LaunchReady(/*during_backward=*/false);
  for (Core::Bucket& b : c.buckets) {
    Wait(b.work, dist_.options(), dist_.impl_->world, "allreduce of gradients");
    b.work.reset();
    // The means as views of the bucket (DDP's gradient_as_bucket_view): no copy back. They
    // are read before the next step's backward pass refills the bucket.
    for (size_t k : b.vars) {
      grads[k] = b.flat.slice(0, c.offset_of[k], c.offset_of[k] + grads[k].numel())
                     .view(grads[k].sizes());
    }
  }
  ++c.stats.steps;
  c.stats.exposed_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace glossa
