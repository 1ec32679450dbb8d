#include "glossa/runtime/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

std::atomic<int> g_signal{0};
extern "C" void LauncherSignal(int sig) { g_signal.store(sig); }

struct Stream {
  int fd = -1;
  int rank = 0;
  FILE* out = nullptr;
  std::string pending;
};

void EmitLines(Stream& s, bool flush_partial) {
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::fprintf(s.out, "[rank %d] %.*s\n", s.rank, static_cast<int>(nl - start),
                 s.pending.data() + start);
  }
  s.pending.erase(0, start);
  if (flush_partial && !s.pending.empty()) {
    std::fprintf(s.out, "[rank %d] %s\n", s.rank, s.pending.c_str());
    s.pending.clear();
  }
  std::fflush(s.out);
}

std::string Describe(int status) {
  if (WIFSIGNALED(status)) {
    return StrCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                  ")");
  }
  return StrCat("exited with status ", WEXITSTATUS(status));
}

// SIGINT and SIGTERM are noted (g_signal), for the launcher to forward to the workers.
void CatchStopSignals() {
  struct sigaction sa {};
  sa.sa_handler = LauncherSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// In the child of fork: stdout and stderr onto the pipes `out` and `err`, the launcher's pipes
// closed, the default signal handlers back and the rendezvous environment set; then runs o.argv
// (exit status 127 when it cannot).
// port 0: rank 0 binds a free port and writes it to port_fd (GLOSSA_RENDEZVOUS_PORT_FD).
[[noreturn]] void ExecWorker(const LaunchOptions& o, int port, int r, const int out[2],
                             const int err[2], const std::vector<Stream>& streams, int port_fd) {
  dup2(out[1], STDOUT_FILENO);
  dup2(err[1], STDERR_FILENO);
  close(out[0]);
  close(out[1]);
  close(err[0]);
  close(err[1]);
  for (const Stream& s : streams) close(s.fd);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
  setenv("RANK", std::to_string(r).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
  setenv("GLOSSA_LAUNCHED", "1", 1);
  if (port_fd >= 0) {
    setenv("GLOSSA_RENDEZVOUS_PORT_FD", std::to_string(port_fd).c_str(), 1);
  } else {
    unsetenv("GLOSSA_RENDEZVOUS_PORT_FD");
  }
  std::vector<char*> args;
  for (const auto& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  std::fprintf(stderr, "glossa: cannot run %s: %s\n", args[0], std::strerror(errno));
  _exit(127);
}

// Starts the worker of rank `r`, its stdout and stderr on pipes whose read ends join `streams`;
// returns its pid.
pid_t StartWorker(const LaunchOptions& o, int port, int r, std::vector<Stream>& streams,
                  int port_fd = -1) {
  int out[2], err[2];
  if (pipe(out) != 0 || pipe(err) != 0) {
    throw AbortedError(StrCat("launcher: pipe: ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) throw AbortedError(StrCat("launcher: fork: ", std::strerror(errno)));
  if (pid == 0) ExecWorker(o, port, r, out, err, streams, port_fd);
  close(out[1]);
  close(err[1]);
  streams.push_back({out[0], r, stdout, ""});
  streams.push_back({err[0], r, stderr, ""});
  return pid;
}

// The workers while they run: their pids and exit statuses, their output streams still open,
// and what the launcher did after a stop signal or the first failure.
struct Workers {
  using Clock = std::chrono::steady_clock;
  std::vector<pid_t> pids = {};  // -1: not started (yet)
  std::vector<int> status = {};
  std::vector<bool> done = {};
  std::vector<Stream> streams = {};
  int alive = 0;
  int first_failure = -1;
  // Rank 0's pipe while the launcher waits for the port it bound (-1 otherwise), and what it read.
  int port_pipe = -1;
  std::string port_text;
  bool never_started = false;  // ranks 1.. were not started (rank 0 ended first)
  Clock::time_point term_at{}, kill_at{};
  bool termed = false, killed = false, forwarded = false;
};

// Sends `sig` to every worker that has not exited yet.
void SignalRunning(const Workers& w, int nproc, int sig) {
  for (int r = 0; r < nproc; ++r) {
    if (w.pids[r] > 0 && !w.done[r]) kill(w.pids[r], sig);
  }
}

// Waits up to 200 ms for output, then forwards each stream's complete lines (all it holds once it
// closed) and drops the streams that closed.
void PumpStreams(std::vector<Stream>& streams) {
  std::vector<pollfd> fds;
  for (const Stream& s : streams) fds.push_back({s.fd, POLLIN, 0});
  const int n = fds.empty() ? 0 : poll(fds.data(), fds.size(), 200);
  if (fds.empty()) usleep(200 * 1000);
  if (n > 0) {
    for (size_t i = fds.size(); i-- > 0;) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t got = read(streams[i].fd, buf, sizeof(buf));
      if (got > 0) {
        streams[i].pending.append(buf, static_cast<size_t>(got));
        EmitLines(streams[i], false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        EmitLines(streams[i], true);
        close(streams[i].fd);
        streams.erase(streams.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  }
}

// Notes the workers that exited; a failure is said on stderr, and the first one starts the
// others' grace period (then SIGTERM, then SIGKILL 10 s later).
void ReapWorkers(Workers& w, const LaunchOptions& o) {
  using Clock = Workers::Clock;
  for (int r = 0; r < o.nproc; ++r) {
    if (w.pids[r] <= 0 || w.done[r]) continue;
    int st = 0;
    const pid_t pid = waitpid(w.pids[r], &st, WNOHANG);
    if (pid != w.pids[r]) continue;
    w.done[r] = true;
    w.status[r] = st;
    --w.alive;
    const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!ok) {
      std::fprintf(stderr, "glossa: rank %d (pid %d) %s\n", r, static_cast<int>(w.pids[r]),
                   Describe(st).c_str());
      std::fflush(stderr);
      if (w.first_failure < 0) {
        w.first_failure = r;
        w.term_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(o.grace_seconds));
        w.kill_at = w.term_at + std::chrono::seconds(10);
      }
    }
  }
}

// After a failure, once the grace period is over: SIGTERM to the workers still running, and
// SIGKILL once its 10 s are over too.
void StopAfterFailure(Workers& w, int nproc) {
  using Clock = Workers::Clock;
  if (!w.termed && Clock::now() >= w.term_at) {
    w.termed = true;
    std::fprintf(stderr, "glossa: stopping the workers still running after rank %d failed\n",
                 w.first_failure);
    SignalRunning(w, nproc, SIGTERM);
  } else if (w.termed && !w.killed && Clock::now() >= w.kill_at) {
    w.killed = true;
    SignalRunning(w, nproc, SIGKILL);
  }
}

// Reads what rank 0 wrote on its port pipe so far. Once a whole line came: the other ranks start
// on that port, unless the job is already stopping. At end of file without one (rank 0 failed or
// exited before its rendezvous) they never start; a rank 0 that exits 0 so is a failure too.
void ReadRendezvousPort(Workers& w, const LaunchOptions& o) {
  char buf[64];
  ssize_t got;
  while ((got = read(w.port_pipe, buf, sizeof(buf))) > 0) w.port_text.append(buf, got);
  const size_t nl = w.port_text.find('\n');
  if (nl == std::string::npos && got < 0 && (errno == EAGAIN || errno == EINTR)) return;
  close(w.port_pipe);
  w.port_pipe = -1;
  const int port = nl == std::string::npos ? 0 : std::atoi(w.port_text.substr(0, nl).c_str());
  if (port <= 0 || port > 65535) {
    std::fprintf(stderr, "glossa: rank 0 ended before hosting the rendezvous: ranks 1-%d not "
                         "started\n", o.nproc - 1);
    w.never_started = true;
    return;
  }
  if (w.forwarded) {
    // Stopped before the others started: rank 0 would wait for them until its timeout, and has
    // trained nothing yet.
    std::fprintf(stderr, "glossa: stopped before the rendezvous: ranks 1-%d not started\n",
                 o.nproc - 1);
    w.never_started = true;
    SignalRunning(w, o.nproc, SIGKILL);
    return;
  }
  for (int r = 1; r < o.nproc; ++r) {
    w.pids[r] = StartWorker(o, port, r, w.streams);
    ++w.alive;
  }
}

// Starts the workers: every one on --master_port when it is given; otherwise rank 0 alone on
// MASTER_PORT=0 (its store binds a port the kernel picks, so no other program can take it between
// a probe and the bind), the others once rank 0 has written that port on the pipe.
void StartWorkers(Workers& w, const LaunchOptions& o) {
  if (o.master_port > 0 || o.nproc == 1) {
    std::fprintf(stderr, "glossa: starting %d workers (rendezvous at %s:%d)\n", o.nproc,
                 o.master_addr.c_str(), std::max(o.master_port, 0));
    std::fflush(stderr);
    for (int r = 0; r < o.nproc; ++r) {
      w.pids[r] = StartWorker(o, std::max(o.master_port, 0), r, w.streams);
    }
    w.alive = o.nproc;
    return;
  }
  int fds[2];
  if (pipe(fds) != 0) throw AbortedError(StrCat("launcher: pipe: ", std::strerror(errno)));
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  std::fprintf(stderr, "glossa: starting %d workers (rank 0 picks the rendezvous port on %s)\n",
               o.nproc, o.master_addr.c_str());
  std::fflush(stderr);
  w.pids[0] = StartWorker(o, 0, 0, w.streams, fds[1]);
  close(fds[1]);
  w.port_pipe = fds[0];
  w.alive = 1;
}

}  // namespace

int LaunchLocalWorkers(const LaunchOptions& o) {
  if (o.nproc < 1 || o.nproc > 1024) {
    throw InvalidArgumentError(StrCat("--nproc_per_node must be in [1, 1024], got ", o.nproc));
  }
  if (o.argv.empty()) throw InvalidArgumentError("launcher: no command");
  CatchStopSignals();
  Workers w;
  w.pids.assign(o.nproc, -1);
  w.status.assign(o.nproc, 0);
  w.done.assign(o.nproc, false);
  StartWorkers(w, o);

  while (w.alive > 0 || !w.streams.empty() || w.port_pipe >= 0) {
    // A SIGINT or SIGTERM to the launcher: SIGTERM to the workers still running (once).
    if (const int sig = g_signal.load(); sig != 0 && !w.forwarded) {
      w.forwarded = true;
      SignalRunning(w, o.nproc, SIGTERM);
    }
    PumpStreams(w.streams);
    if (w.port_pipe >= 0) ReadRendezvousPort(w, o);
    ReapWorkers(w, o);
    if (w.first_failure >= 0 && w.alive > 0) StopAfterFailure(w, o.nproc);
  }
  if (w.never_started && w.first_failure < 0) return 1;  // rank 0 exited 0 before the rendezvous
  if (w.first_failure < 0) return 0;
  const int st = w.status[w.first_failure];
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return WEXITSTATUS(st) != 0 ? WEXITSTATUS(st) : 1;
}

}  // namespace glossa
