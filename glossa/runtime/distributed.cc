#include "glossa/runtime/distributed.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <chrono>
#include <cstdlib>
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

struct Distributed::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  int64_t sequence = 0;
};

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
    pg_options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(options.master_addr));
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

// Waits for a collective; a peer that died or stalled past the timeout is Aborted.
void Wait(const c10::intrusive_ptr<c10d::Work>& work, const DistributedOptions& o,
          const char* what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    throw AbortedError(StrCat(what, " failed on rank ", o.rank, " of ", o.world_size,
                              " (a rank died or stalled past ", o.timeout_seconds,
                              " s): ", e.what()));
  }
}

}  // namespace

void Distributed::Broadcast(const std::vector<at::Tensor>& tensors, int root) {
  for (const at::Tensor& t : tensors) {
    std::vector<at::Tensor> one = {t};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    Wait(impl_->pg->broadcast(one, bo), options_, "broadcast");
  }
}

void Distributed::AllReduceSum(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    std::vector<at::Tensor> one = {t};
    Wait(impl_->pg->allreduce(one), options_, "allreduce");
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
      Wait(impl_->pg->allreduce(one), options_, "allreduce of gradients");
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
    throw AbortedError(StrCat("gathering values failed on rank ", options_.rank, " of ",
                              options_.world_size, " (a rank died or stalled past ",
                              options_.timeout_seconds, " s): ", e.what()));
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

void Distributed::Barrier() {
  at::Tensor t = at::zeros({1});
  AllReduceSum({t});
}

}  // namespace glossa
