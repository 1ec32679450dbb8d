#include "glossa/runtime/distributed.h"
#include "glossa/runtime/distributed_impl.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <string>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

std::optional<long long> EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (*end != '\0' || errno == ERANGE) {
    throw InvalidArgumentError(StrCat("environment variable ", name, "='", v,
                                      "' is not an integer"));
  }
  return x;
}

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

std::optional<DistributedOptions> DistributedOptionsFromEnv() {
  const auto world = EnvInt("WORLD_SIZE");
  if (!world) return std::nullopt;
  DistributedOptions o;
  if (*world < 1 || *world > 65536) {
    throw InvalidArgumentError(StrCat("WORLD_SIZE must be in [1, 65536], got ", *world));
  }
  o.world_size = static_cast<int>(*world);
  const auto rank = EnvInt("RANK");
  if (!rank && o.world_size > 1) {
    throw InvalidArgumentError(StrCat("WORLD_SIZE is ", o.world_size, " but RANK is not set"));
  }
  o.rank = static_cast<int>(rank.value_or(0));
  if (o.rank < 0 || o.rank >= o.world_size) {
    throw InvalidArgumentError(StrCat("RANK must be in [0, WORLD_SIZE = ", o.world_size,
                                      "), got ", o.rank));
  }
  o.local_rank = static_cast<int>(EnvInt("LOCAL_RANK").value_or(o.rank));
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    o.master_addr = addr;
  }
  const auto port = EnvInt("MASTER_PORT");
  if (port) {
    if (*port < 1 || *port > 65535) {
      throw InvalidArgumentError(StrCat("MASTER_PORT must be in [1, 65535], got ", *port));
    }
    o.master_port = static_cast<int>(*port);
  }
  return o;
}


Distributed::Distributed(const DistributedOptions& options, NoRendezvous)
    : options_(options), impl_(std::make_unique<Impl>()) {}

Distributed::Distributed(const DistributedOptions& options)
    : options_(options), impl_(std::make_unique<Impl>()) {
  if (options.backend != "gloo") {
    throw InvalidArgumentError(StrCat("backend '", options.backend,
                                      "' is not available: this build has gloo (nccl needs a CUDA "
                                      "build of libtorch)"));
  }
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw InvalidArgumentError(StrCat("rank ", options.rank, " of world size ",
                                      options.world_size, " is out of range"));
  }
  const std::string where = StrCat("rank ", options.rank, " of ", options.world_size, " at ",
                                   options.master_addr, ":", options.master_port);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(options.master_port);
    so.isServer = options.rank == 0;
    so.numWorkers = options.world_size;
    so.waitWorkers = true;
    so.timeout = Millis(options.timeout_seconds);
    impl_->store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, so);
    auto pg_options = c10d::ProcessGroupGloo::Options::create(Millis(options.timeout_seconds));
    // The network device this rank's Gloo pairs use: GLOO_SOCKET_IFNAME's interface when set
    // (as PyTorch), loopback for a job on 127.0.0.1 / localhost, else the address this host's
    // name resolves to (each node its own; rank 0's address is only the rendezvous).
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (ifname != nullptr && *ifname != '\0') {
      pg_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else if (options.master_addr == "127.0.0.1" || options.master_addr == "localhost" ||
               options.master_addr == "::1") {
      pg_options->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(options.master_addr));
    } else {
      pg_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    impl_->device = pg_options->devices.front();
    impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, options.rank,
                                                            options.world_size, pg_options);
  } catch (const c10::Error& e) {
    throw AbortedError(StrCat("distributed rendezvous failed for ", where, " within ",
                              options.timeout_seconds, " s: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw AbortedError(StrCat("distributed rendezvous failed for ", where, ": ", e.what()));
  }
}

Distributed::~Distributed() = default;


namespace {

// Which ranks are gone, after a collective failed: every rank that sees the failure reports in
// the store (hosted by rank 0); the ranks that have not reported within a few seconds are named.
// Unreachable store: rank 0, its host, is gone. After a point-to-point failure (peer >= 0) only
// the peer is asked after: the other ranks have no reason to fail.
std::string DiagnoseLostRanks(c10d::Store* store, const DistributedOptions& o, int peer = -1) {
  if (store == nullptr) return "";
  try {
    store->set(StrCat("glossa/fault/", o.rank), std::vector<uint8_t>{1});
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(std::min(5.0, o.timeout_seconds));
    std::vector<int> missing;
    for (;;) {
      missing.clear();
      for (int r = 0; r < o.world_size; ++r) {
        if (r == o.rank || (peer >= 0 && r != peer)) continue;
        if (!store->check({StrCat("glossa/fault/", r)})) missing.push_back(r);
      }
      if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (missing.empty()) return "";
    std::vector<std::string> names;
    for (int r : missing) names.push_back(StrCat(o.world_ranks.empty() ? r : o.world_ranks[r]));
    return StrCat("lost rank(s): ", Join(names, ", "),
                  " (did not report after the collective failed); ");
  } catch (const std::exception&) {
    if ((o.world_ranks.empty() ? o.rank : o.world_ranks[o.rank]) == 0) return "";  // the host
    return StrCat("lost rank(s): 0 (it hosts the rendezvous store at ", o.master_addr, ":",
                  o.master_port, ", which no longer answers); ");
  }
}

// Waits for a collective; a peer that died or stalled past the timeout is Aborted, naming the
// ranks that are gone when they can be told.
void Wait(const c10::intrusive_ptr<c10d::Work>& work, const DistributedOptions& o,
          c10d::Store* store, const char* what, int peer = -1) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) why = c10->what_without_backtrace();
    const std::string me =
        o.world_ranks.empty()
            ? StrCat("rank ", o.rank, " of ", o.world_size)
            : StrCat("rank ", o.world_ranks[o.rank], " (", o.rank, " of ", o.world_size,
                     " in group ", o.group, ")");
    throw AbortedError(StrCat(what, " failed on ", me, ": ",
                              DiagnoseLostRanks(store, o, peer), "a rank died or stalled past the ",
                              o.timeout_seconds, " s timeout (", Strip(why), ")"));
  }
}

}  // namespace

void Distributed::Broadcast(const std::vector<at::Tensor>& tensors, int root) {
  for (const at::Tensor& t : tensors) {
    std::vector<at::Tensor> one = {t};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    Wait(impl_->pg->broadcast(one, bo), options_, impl_->store.get(), "broadcast");
  }
}

void Distributed::AllReduceSum(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    std::vector<at::Tensor> one = {t};
    Wait(impl_->pg->allreduce(one), options_, impl_->store.get(), "allreduce");
  }
}

int64_t Distributed::AllReduceMean(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes) {
  int64_t sent = 0;
  // Buckets of one dtype, in order.
  std::map<at::ScalarType, std::vector<std::vector<at::Tensor>>> buckets;
  std::map<at::ScalarType, int64_t> filled;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    auto& list = buckets[t.scalar_type()];
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    if (list.empty() || filled[t.scalar_type()] + bytes > bucket_bytes) {
      list.emplace_back();
      filled[t.scalar_type()] = 0;
    }
    list.back().push_back(t);
    filled[t.scalar_type()] += bytes;
  }
  at::NoGradGuard no_grad;
  const double scale = 1.0 / options_.world_size;
  for (auto& [dtype, list] : buckets) {
    for (auto& bucket : list) {
      std::vector<at::Tensor> flat_parts;
      for (const at::Tensor& t : bucket) flat_parts.push_back(t.reshape({-1}));
      at::Tensor flat = bucket.size() == 1 && bucket[0].is_contiguous() ? bucket[0]
                                                                         : at::cat(flat_parts);
      std::vector<at::Tensor> one = {flat};
      Wait(impl_->pg->allreduce(one), options_, impl_->store.get(), "allreduce of gradients");
      sent += flat.numel() * static_cast<int64_t>(flat.element_size());
      flat.mul_(scale);
      if (!(bucket.size() == 1 && bucket[0].is_contiguous())) {
        int64_t offset = 0;
        for (const at::Tensor& t : bucket) {
          t.copy_(flat.slice(0, offset, offset + t.numel()).view(t.sizes()));
          offset += t.numel();
        }
      }
    }
  }
  return sent;
}

at::Tensor Distributed::AllToAll(const at::Tensor& input) {
  if (input.dim() < 1 || input.size(0) % options_.world_size != 0) {
    throw InvalidArgumentError(StrCat("all-to-all: dim 0 of ", input.sizes(),
                                      " does not split into ", options_.world_size, " blocks"));
  }
  at::Tensor in = input.contiguous();
  at::Tensor out = at::empty_like(in);
  if (options_.world_size == 1) return out.copy_(in);
  std::vector<int64_t> out_splits, in_splits;  // empty: equal blocks
  Wait(impl_->pg->alltoall_base(out, in, out_splits, in_splits), options_, impl_->store.get(),
       "all-to-all");
  return out;
}

std::vector<std::string> Distributed::AllGatherStrings(const std::string& value) {
  const int64_t seq = impl_->sequence++;
  const std::string prefix = StrCat("glossa/gather/", seq, "/");
  try {
    impl_->store->set(StrCat(prefix, options_.rank),
                      std::vector<uint8_t>(value.begin(), value.end()));
    std::vector<std::string> out;
    for (int r = 0; r < options_.world_size; ++r) {
      const std::vector<uint8_t> v = impl_->store->get(StrCat(prefix, r));
      out.emplace_back(v.begin(), v.end());
    }
    return out;
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) why = c10->what_without_backtrace();
    throw AbortedError(StrCat("gathering values failed on rank ", options_.rank, " of ",
                              options_.world_size, ": ",
                              DiagnoseLostRanks(impl_->store.get(), options_),
                              "a rank died or stalled past the ", options_.timeout_seconds,
                              " s timeout (", Strip(why), ")"));
  }
}

void Distributed::CheckSame(const std::string& what, const std::string& value) {
  const std::vector<std::string> all = AllGatherStrings(value);
  std::vector<std::string> differ;
  for (int r = 1; r < options_.world_size; ++r) {
    if (all[r] != all[0]) differ.push_back(StrCat(r));
  }
  if (!differ.empty()) {
    throw FailedPreconditionError(StrCat("the workers disagree on ", what, ": rank(s) ",
                                         Join(differ, ", "), " differ from rank 0"));
  }
}

std::map<std::string, std::pair<double, double>> Distributed::ReduceWeighted(
    const std::map<std::string, std::pair<double, double>>& metrics) {
  std::string names;
  for (const auto& [k, v] : metrics) names += k + "\n";
  CheckSame("the metric names", names);
  at::Tensor t = at::zeros({static_cast<int64_t>(2 * metrics.size())}, at::kDouble);
  int64_t i = 0;
  for (const auto& [k, v] : metrics) {
    t[2 * i] = v.first * v.second;
    t[2 * i + 1] = v.second;
    ++i;
  }
  AllReduceSum({t});
  std::map<std::string, std::pair<double, double>> out;
  i = 0;
  for (const auto& [k, v] : metrics) {
    const double w = t[2 * i + 1].item<double>();
    out[k] = {w != 0 ? t[2 * i].item<double>() / w : 0.0, w};
    ++i;
  }
  return out;
}

bool Distributed::AnyTrue(bool value) {
  at::Tensor t = at::full({1}, value ? 1 : 0, at::kInt);
  AllReduceSum({t});
  return t.item<int>() > 0;
}

std::map<std::string, std::pair<double, double>> Distributed::GatherWeighted(
    const std::map<std::string, std::pair<double, double>>& metrics) {
  std::string mine;
  for (const auto& [k, v] : metrics) {
    mine += StrCat(k, "\t", PyFloatRepr(v.first * v.second), "\t", PyFloatRepr(v.second), "\n");
  }
  std::map<std::string, std::pair<double, double>> sums;
  for (const std::string& text : AllGatherStrings(mine)) {
    for (const auto& line : Split(text, '\n')) {
      const std::vector<std::string> f = Split(line, '\t');
      if (f.size() != 3) continue;
      auto& s = sums[f[0]];
      s.first += std::stod(f[1]);
      s.second += std::stod(f[2]);
    }
  }
  for (auto& [k, s] : sums) s.first = s.second != 0 ? s.first / s.second : 0.0;
  return sums;
}

namespace {
thread_local Distributed* g_current = nullptr;
}  // namespace

Distributed* CurrentDistributed() { return g_current; }
bool IsChief() { return g_current == nullptr || g_current->rank() == 0; }
DistributedScope::DistributedScope(Distributed* dist) : previous_(g_current) { g_current = dist; }
DistributedScope::~DistributedScope() { g_current = previous_; }

namespace {

void CheckPeer(const DistributedOptions& o, int peer, const char* what) {
  if (peer < 0 || peer >= o.world_size || peer == o.rank) {
    throw InvalidArgumentError(StrCat(what, ": peer ", peer, " is not another rank of the ",
                                      o.world_size, " (this is rank ", o.rank, ")"));
  }
}

}  // namespace

void Distributed::Send(const at::Tensor& t, int dst, int tag) {
  CheckPeer(options_, dst, "send");
  std::vector<at::Tensor> one = {t.contiguous()};
  Wait(impl_->pg->send(one, dst, tag), options_, impl_->store.get(),
       StrCat("send to rank ", dst).c_str(), dst);
}

void Distributed::Recv(at::Tensor& out, int src, int tag) {
  CheckPeer(options_, src, "recv");
  if (!out.is_contiguous()) {
    throw InvalidArgumentError("recv: the output tensor must be contiguous");
  }
  std::vector<at::Tensor> one = {out};
  Wait(impl_->pg->recv(one, src, tag), options_, impl_->store.get(),
       StrCat("recv from rank ", src).c_str(), src);
}

void Distributed::Barrier() {
  at::Tensor t = at::zeros({1});
  AllReduceSum({t});
}

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

void DataParallelGradientSync::SetSharded(const std::vector<bool>& sharded) { sharded_ = sharded; }

double DataParallelGradientSync::GlobalSquaredNorm(double replicated, double sharded) {
  if (std::find(sharded_.begin(), sharded_.end(), true) == sharded_.end()) {
    return replicated + sharded;
  }
  at::Tensor t = at::scalar_tensor(sharded, at::kDouble).view({1});
  // Every expert once: over the expert axis (its data replicas hold the same gradients).
  (shard_norm_group_ != nullptr ? *shard_norm_group_ : dist_).AllReduceSum({t});
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
  // On a data × expert mesh the replicas of this rank's experts sum their gradients first.
  if (any_sharded && shard_data_group_ != nullptr && shard_data_group_->world_size() > 1) {
    at::NoGradGuard no_grad;
    std::vector<size_t> which;
    for (size_t k = 0; k < grads.size(); ++k) {
      if (sharded_[k]) which.push_back(k);
    }
    SumOver(*shard_data_group_, grads, which);
  }
  if (!overlap_) {
    std::vector<at::Tensor> in;
    for (size_t k = 0; k < grads.size(); ++k) {
      if (any_sharded && sharded_[k]) {
        grads[k] = grads[k] / static_cast<double>(dist_.world_size());
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
      grads[k] = grads[k] * c.scale.to(grads[k].scalar_type());
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
    Wait(b.work, dist_.options(), dist_.impl_->store.get(), "allreduce of gradients");
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
