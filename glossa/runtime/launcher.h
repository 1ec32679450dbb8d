// The local launcher behind `glossa train|eval|decode --nproc_per_node=N` (torchrun's role on one
// machine): starts N copies of a command as data-parallel workers with the standard environment
// (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE), forwards their
// stdout and stderr line by line prefixed "[rank R] ", forwards SIGINT/SIGTERM to them, and
// waits. When a worker fails (non-zero exit or a signal), the others get `grace_seconds` to fail
// on their own (their collectives time out or see the lost peer, and they say which rank is
// gone), then SIGTERM, then SIGKILL.
//
//   LaunchOptions o{.argv = {"/proc/self/exe", "train", "--model=...", "--logdir=/tmp/x"},
//                   .nproc = 2};
//   return LaunchLocalWorkers(o);   // 0 when every worker exited 0
#pragma once

#include <string>
#include <vector>

namespace glossa {

struct LaunchOptions {
  std::vector<std::string> argv;  // argv[0]: the program to run
  int nproc = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: rank 0 binds a free port on master_addr and tells the launcher
  double grace_seconds = 5;
};

// Returns 0 when every worker exited 0; otherwise the first failure's exit status (128 + signal
// for a worker killed by a signal), after a line on stderr naming the rank and what happened.
int LaunchLocalWorkers(const LaunchOptions& options);

}  // namespace glossa
