#include "glossa/runtime/distributed.h"
#include "glossa/base/thread_state.h"
#include "glossa/runtime/distributed_impl.h"

#include <unistd.h>

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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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

// What rank 0 does with the port it got for MASTER_PORT=0: says it on stderr, and writes it as a
// line to GLOSSA_RENDEZVOUS_PORT_FD (the local launcher's pipe; it starts the others on it).
std::function<void(const std::string&, int)> AnnounceRendezvousPort() {
  const auto fd = EnvInt("GLOSSA_RENDEZVOUS_PORT_FD");
  if (fd && (*fd < 3 || *fd > 65535)) {
    throw InvalidArgumentError(
        StrCat("GLOSSA_RENDEZVOUS_PORT_FD must be a descriptor above 2, got ", *fd));
  }
  return [fd](const std::string& addr, int port) {
    std::fprintf(stderr, "glossa: rank 0 hosts the rendezvous at %s:%d\n", addr.c_str(), port);
    std::fflush(stderr);
    if (!fd) return;
    const std::string line = StrCat(port, "\n");
    const int out = static_cast<int>(*fd);
    if (::write(out, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      throw AbortedError(StrCat("cannot tell the launcher the rendezvous port on descriptor ", out,
                                ": ", std::strerror(errno)));
    }
    ::close(out);
  };
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
    if (*port == 0 && o.rank != 0) {
      throw InvalidArgumentError(StrCat(
          "MASTER_PORT=0 (a free port) is for rank 0 alone, which says the port it got; rank ",
          o.rank, " needs that port"));
    }
    if (*port < 0 || *port > 65535) {
      throw InvalidArgumentError(StrCat("MASTER_PORT must be in [1, 65535] (0: rank 0 picks a "
                                        "free one), got ", *port));
    }
    o.master_port = static_cast<int>(*port);
  }
  if (o.master_port == 0) o.on_listening = AnnounceRendezvousPort();
  return o;
}


namespace {

// Every rank adds 1 to this key of the rendezvous store once it has joined.
constexpr const char* kJoinedKey = "glossa/joined";

// Rank 0: waits until every rank has joined the store, looking at `stop_requested` every 20 ms,
// so that a job whose other rank failed before the rendezvous ends at once on SIGTERM.
void WaitForRanksToJoin(c10d::Store& store, const DistributedOptions& o, const std::string& where) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_seconds);
  for (;;) {
    const int64_t joined = store.add(kJoinedKey, 0);
    if (joined >= o.world_size) return;
    if (o.stop_requested && o.stop_requested()) {
      throw AbortedError(StrCat("stopped while waiting at the rendezvous (", where, "): ",
                                joined, " of ", o.world_size, " ranks had joined"));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw AbortedError(StrCat("distributed rendezvous failed for ", where, " within ",
                                o.timeout_seconds, " s: ", joined, " of ", o.world_size,
                                " ranks joined"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

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
  // Where this rank met the others (the port rank 0 got, when it picked one).
  const auto where = [this] {
    return StrCat("rank ", options_.rank, " of ", options_.world_size, " at ",
                  options_.master_addr, ":", options_.master_port);
  };
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(options.master_port);
    so.isServer = options.rank == 0;
    so.numWorkers = options.world_size;
    // Port 0: the server binds a port the kernel picks; the others are told it before rank 0
    // waits for them.
    const bool pick_port = options.rank == 0 && options.master_port == 0;
    so.waitWorkers = false;  // rank 0 waits below, where a stop is seen
    so.timeout = Millis(options.timeout_seconds);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(options.master_addr, so);
    impl_->store = tcp;
    impl_->world = {tcp, options.rank, options.world_size};
    if (pick_port) {
      options_.master_port = tcp->getPort();
      if (options_.on_listening) options_.on_listening(options_.master_addr, options_.master_port);
    }
    tcp->add(kJoinedKey, 1);
    if (options.rank == 0) WaitForRanksToJoin(*tcp, options_, where());
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
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw AbortedError(StrCat("distributed rendezvous failed for ", where(), " within ",
                              options.timeout_seconds, " s: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw AbortedError(StrCat("distributed rendezvous failed for ", where(), ": ", e.what()));
  }
}

Distributed::~Distributed() = default;


namespace {

// Which ranks are gone, after a collective or transfer failed. Every rank that sees a failure
// reports it in the world's store (hosted by world rank 0), under its world rank, so that a rank
// that failed in another group counts as alive. Named: the ranks this one waited on (`peer` after a
// point-to-point transfer, the group's ranks after a collective) that have not reported within a
// few seconds; when they all report, the failure reached this rank through them, and the ranks of
// the world that do not report are named. Unreachable store: world rank 0, its host, is gone. The
// host stays until the ranks that reported have their answers (or a bound), so that its exit is
// not mistaken for the cause.
std::string DiagnoseLostRanks(const DistributedWorld& world, const DistributedOptions& o,
                              int peer = -1) {
  c10d::Store* store = world.store.get();
  if (store == nullptr) return "";
  const auto world_rank_of = [&](int r) { return o.world_ranks.empty() ? r : o.world_ranks[r]; };
  const auto reported = [&](int w) { return store->check({StrCat("glossa/fault/", w)}); };
  const auto done = [&](int w) { return store->check({StrCat("glossa/fault_done/", w)}); };
  const double window = std::min(5.0, o.timeout_seconds);
  try {
    store->set(StrCat("glossa/fault/", world.rank), std::vector<uint8_t>{1});
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::duration<double>(window);
    std::vector<int> waited, missing;
    if (peer >= 0) {
      waited.push_back(world_rank_of(peer));
    } else {
      for (int r = 0; r < o.world_size; ++r) {
        if (r != o.rank) waited.push_back(world_rank_of(r));
      }
    }
    bool through_others = false;
    for (;;) {
      missing.clear();
      for (int w : waited) {
        if (!reported(w)) missing.push_back(w);
      }
      through_others = missing.empty();
      if (through_others) {
        for (int w = 0; w < world.size; ++w) {
          if (w != world.rank && !reported(w)) missing.push_back(w);
        }
      }
      if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    store->set(StrCat("glossa/fault_done/", world.rank), std::vector<uint8_t>{1});
    if (world.rank == 0) {
      // The host stays while the others may still need the store: until every rank has its
      // answer, or no rank has reported or got its answer for a window while none that reported
      // is still waiting (a failure passes from rank to rank as each exits), at most 4 windows.
      const auto now = [] { return std::chrono::steady_clock::now(); };
      const auto window_time = std::chrono::duration<double>(window);
      const auto linger = start + 4 * window_time;
      auto quiet_since = now();
      int events = -1;
      for (;;) {
        int seen = 0;
        bool all_done = true, answering = false;
        for (int w = 1; w < world.size; ++w) {
          const bool r = reported(w), d = done(w);
          seen += r + d;
          all_done = all_done && d;
          answering = answering || (r && !d);
        }
        if (seen != events) events = seen, quiet_since = now();
        if (all_done || now() >= linger ||
            (!answering && now() >= deadline && now() - quiet_since >= window_time)) {
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    if (missing.empty()) return "";
    std::vector<std::string> names;
    for (int w : missing) names.push_back(StrCat(w));
    return StrCat("lost rank(s): ", Join(names, ", "),
                  through_others ? " (did not report after the failure, which reached this rank "
                                   "through ranks that did); "
                                 : " (did not report after the collective failed); ");
  } catch (const std::exception&) {
    if (world.rank == 0) return "";  // the host
    return StrCat("lost rank(s): 0 (it hosts the rendezvous store at ", o.master_addr, ":",
                  o.master_port, ", which no longer answers); ");
  }
}

// A collective or transfer failed (`e`): Aborted naming `what`, this rank, and the ranks that are
// gone when they can be told.
[[noreturn]] void Fail(const std::exception& e, const DistributedOptions& o,
                       const DistributedWorld& world, const char* what, int peer) {
  std::string why = e.what();
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) why = c10->what_without_backtrace();
  const std::string me =
      o.world_ranks.empty()
          ? StrCat("rank ", o.rank, " of ", o.world_size)
          : StrCat("rank ", o.world_ranks[o.rank], " (", o.rank, " of ", o.world_size,
                   " in group ", o.group, ")");
  throw AbortedError(StrCat(what, " failed on ", me, ": ", DiagnoseLostRanks(world, o, peer),
                            "a rank died or stalled past the ", o.timeout_seconds,
                            " s timeout (", Strip(why), ")"));
}

}  // namespace

// Waits for a collective; a peer that died or stalled past the timeout is Aborted, naming the
// ranks that are gone when they can be told.
void Wait(const c10::intrusive_ptr<c10d::Work>& work, const DistributedOptions& o,
          const DistributedWorld& world, const char* what, int peer) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    Fail(e, o, world, what, peer);
  }
}

void Run(const std::function<c10::intrusive_ptr<c10d::Work>()>& issue,
         const DistributedOptions& o, const DistributedWorld& world, const char* what, int peer) {
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = issue();
  } catch (const std::exception& e) {
    Fail(e, o, world, what, peer);
  }
  Wait(work, o, world, what, peer);
}


void Distributed::Broadcast(const std::vector<at::Tensor>& tensors, int root) {
  for (const at::Tensor& t : tensors) {
    std::vector<at::Tensor> one = {t};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    Run([&] { return impl_->pg->broadcast(one, bo); }, options_, impl_->world, "broadcast");
  }
}

void Distributed::AllReduceSum(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    std::vector<at::Tensor> one = {t};
    Run([&] { return impl_->pg->allreduce(one); }, options_, impl_->world, "allreduce");
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
      Run([&] { return impl_->pg->allreduce(one); }, options_, impl_->world,
          "allreduce of gradients");
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
  Run([&] { return impl_->pg->alltoall_base(out, in, out_splits, in_splits); }, options_,
      impl_->world, "all-to-all");
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
                              DiagnoseLostRanks(impl_->world, options_),
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
thread_local Distributed* g_current = nullptr;      // ThreadState: "distributed"
thread_local Distributed* g_batch_group = nullptr;  // ThreadState: "batch_group"
GLOSSA_THREAD_STATE_SLOT("distributed", g_current);
GLOSSA_THREAD_STATE_SLOT("batch_group", g_batch_group);
}  // namespace

Distributed* CurrentDistributed() { return g_current; }
Distributed* CurrentBatchGroup() { return g_batch_group; }
bool IsChief() { return g_current == nullptr || g_current->rank() == 0; }
DistributedScope::DistributedScope(Distributed* dist) : DistributedScope(dist, dist) {}
DistributedScope::DistributedScope(Distributed* dist, Distributed* batch_group)
    : previous_(g_current), previous_batch_(g_batch_group) {
  g_current = dist;
  g_batch_group = batch_group;
}
DistributedScope::~DistributedScope() {
  g_current = previous_;
  g_batch_group = previous_batch_;
}

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
  Run([&] { return impl_->pg->send(one, dst, tag); }, options_, impl_->world,
      StrCat("send to rank ", dst).c_str(), dst);
}

void Distributed::Recv(at::Tensor& out, int src, int tag) {
  CheckPeer(options_, src, "recv");
  if (!out.is_contiguous()) {
    throw InvalidArgumentError("recv: the output tensor must be contiguous");
  }
  std::vector<at::Tensor> one = {out};
  Run([&] { return impl_->pg->recv(one, src, tag); }, options_, impl_->world,
      StrCat("recv from rank ", src).c_str(), src);
}

void Distributed::Barrier() {
  at::Tensor t = at::zeros({1});
  AllReduceSum({t});
}

std::unique_ptr<Distributed> Distributed::Subgroup(const std::string& name,
                                                   const std::vector<int>& ranks) {
  const auto me = std::find(ranks.begin(), ranks.end(), options_.rank);
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (me == ranks.end() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      sorted.front() < 0 || sorted.back() >= options_.world_size) {
    throw InvalidArgumentError(StrCat("process group '", name, "': its ranks must be distinct "
                                      "ranks of the world of ", options_.world_size,
                                      " and include this rank (", options_.rank, ")"));
  }
  DistributedOptions o = options_;
  o.rank = static_cast<int>(me - ranks.begin());
  o.world_size = static_cast<int>(ranks.size());
  o.group = name;
  for (int r : ranks) o.world_ranks.push_back(options_.world_ranks.empty() ? r : options_.world_ranks[r]);
  auto sub = std::unique_ptr<Distributed>(new Distributed(o, NoRendezvous{}));
  try {
    sub->impl_->store = c10::make_intrusive<c10d::PrefixStore>(StrCat("glossa/group/", name, "/"),
                                                               impl_->store);
    sub->impl_->world = impl_->world;
    auto pg_options = c10d::ProcessGroupGloo::Options::create(Millis(o.timeout_seconds));
    pg_options->devices.push_back(impl_->device);
    sub->impl_->device = impl_->device;
    sub->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(sub->impl_->store, o.rank,
                                                                 o.world_size, pg_options);
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) why = c10->what_without_backtrace();
    std::vector<std::string> listed;
    for (int r : o.world_ranks) listed.push_back(StrCat(r));
    throw AbortedError(StrCat("process group '", name, "' (world ranks ", Join(listed, ", "),
                              ") failed to form within ", o.timeout_seconds, " s: ", why));
  }
  return sub;
}

}  // namespace glossa
