// What a Distributed holds (glossa/runtime/distributed.h), shared by the files that implement it
// (distributed.cc: the world group and its collectives; mesh.cc: subgroups and meshes). Not for
// other includes: it pulls in c10d.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <functional>
#include <memory>

#include "glossa/runtime/distributed.h"

namespace glossa {

// The world's store (hosted by world rank 0), where every rank reports a failure it sees, and this
// rank's place in the world: a subgroup's failure is diagnosed across the world.
struct DistributedWorld {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int size = 1;
};

struct Distributed::Impl {
  c10::intrusive_ptr<c10d::Store> store;  // a subgroup's: a prefix of the world's
  DistributedWorld world;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::shared_ptr<::gloo::transport::Device> device;  // the pairs' network device
  int64_t sequence = 0;
};

// Waits for `work`; a failure is Aborted naming `what`, this rank, and the ranks that are gone
// (`peer` after a point-to-point transfer, the group's ranks after a collective; when those all
// report, the ranks of the world that do not: the failure came through them).
void Wait(const c10::intrusive_ptr<c10d::Work>& work, const DistributedOptions& o,
          const DistributedWorld& world, const char* what, int peer = -1);
// Issues the work with `issue` and waits for it, failing as Wait does also when issuing throws
// (gloo starts a send or recv on the calling thread, and throws there when the peer's connection
// is already closed).
void Run(const std::function<c10::intrusive_ptr<c10d::Work>()>& issue,
         const DistributedOptions& o, const DistributedWorld& world, const char* what,
         int peer = -1);

}  // namespace glossa
