#include "glossa/runtime/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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
[[noreturn]] void ExecWorker(const LaunchOptions& o, int port, int r, const int out[2],
                             const int err[2], const std::vector<Stream>& streams) {
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
  std::vector<char*> args;
  for (const auto& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  std::fprintf(stderr, "glossa: cannot run %s: %s\n", args[0], std::strerror(errno));
  _exit(127);
}

// Starts the worker of rank `r`, its stdout and stderr on pipes whose read ends join `streams`;
// returns its pid.
pid_t StartWorker(const LaunchOptions& o, int port, int r, std::vector<Stream>& streams) {
  int out[2], err[2];
  if (pipe(out) != 0 || pipe(err) != 0) {
    throw AbortedError(StrCat("launcher: pipe: ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) throw AbortedError(StrCat("launcher: fork: ", std::strerror(errno)));
  if (pid == 0) ExecWorker(o, port, r, out, err, streams);
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
  std::vector<pid_t> pids = {};
  std::vector<int> status = {};
  std::vector<bool> done = {};
  std::vector<Stream> streams = {};
  int alive = 0;
  int first_failure = -1;
  Clock::time_point term_at{}, kill_at{};
  bool termed = false, killed = false, forwarded = false;
};

// Sends `sig` to every worker that has not exited yet.
void SignalRunning(const Workers& w, int nproc, int sig) {
  for (int r = 0; r < nproc; ++r) {
    if (!w.done[r]) kill(w.pids[r], sig);
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
    if (w.done[r]) continue;
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

}  // namespace

int FreeTcpPort(const std::string& host) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw AbortedError(StrCat("cannot open a socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    throw AbortedError(StrCat("cannot find a free port on ", host, ": ", why));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

int LaunchLocalWorkers(const LaunchOptions& o) {
  if (o.nproc < 1 || o.nproc > 1024) {
    throw InvalidArgumentError(StrCat("--nproc_per_node must be in [1, 1024], got ", o.nproc));
  }
  if (o.argv.empty()) throw InvalidArgumentError("launcher: no command");
  const int port = o.master_port > 0 ? o.master_port : FreeTcpPort(o.master_addr);
  CatchStopSignals();
  std::fprintf(stderr, "glossa: starting %d workers (rendezvous at %s:%d)\n", o.nproc,
               o.master_addr.c_str(), port);
  std::fflush(stderr);

  Workers w;
  w.pids.assign(o.nproc, -1);
  w.status.assign(o.nproc, 0);
  w.done.assign(o.nproc, false);
  for (int r = 0; r < o.nproc; ++r) w.pids[r] = StartWorker(o, port, r, w.streams);

  w.alive = o.nproc;
  while (w.alive > 0 || !w.streams.empty()) {
    // A SIGINT or SIGTERM to the launcher: SIGTERM to the workers still running (once).
    if (const int sig = g_signal.load(); sig != 0 && !w.forwarded) {
      w.forwarded = true;
      SignalRunning(w, o.nproc, SIGTERM);
    }
    PumpStreams(w.streams);
    ReapWorkers(w, o);
    if (w.first_failure >= 0 && w.alive > 0) StopAfterFailure(w, o.nproc);
  }
  if (w.first_failure < 0) return 0;
  const int st = w.status[w.first_failure];
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return WEXITSTATUS(st) != 0 ? WEXITSTATUS(st) : 1;
}

}  // namespace glossa
