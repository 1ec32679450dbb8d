// What a Distributed holds (glossa/runtime/distributed.h), shared by the files that implement it
// (distributed.cc: the world group and its collectives; mesh.cc: subgroups and meshes). Not for
// other includes: it pulls in c10d.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <memory>

#include "glossa/runtime/distributed.h"

namespace glossa {

struct Distributed::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::shared_ptr<::gloo::transport::Device> device;  // the pairs' network device
  int64_t sequence = 0;
};

}  // namespace glossa
