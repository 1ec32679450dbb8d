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
  struct sigaction sa {};
  sa.sa_handler = LauncherSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::fprintf(stderr, "glossa: starting %d workers (rendezvous at %s:%d)\n", o.nproc,
               o.master_addr.c_str(), port);
  std::fflush(stderr);

  std::vector<pid_t> pids(o.nproc, -1);
  std::vector<int> status(o.nproc, 0);
  std::vector<bool> done(o.nproc, false);
  std::vector<Stream> streams;
  for (int r = 0; r < o.nproc; ++r) {
    int out[2], err[2];
    if (pipe(out) != 0 || pipe(err) != 0) {
      throw AbortedError(StrCat("launcher: pipe: ", std::strerror(errno)));
    }
    const pid_t pid = fork();
    if (pid < 0) throw AbortedError(StrCat("launcher: fork: ", std::strerror(errno)));
    if (pid == 0) {
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
    pids[r] = pid;
    close(out[1]);
    close(err[1]);
    streams.push_back({out[0], r, stdout, ""});
    streams.push_back({err[0], r, stderr, ""});
  }

  using Clock = std::chrono::steady_clock;
  int first_failure = -1;
  Clock::time_point term_at{}, kill_at{};
  bool termed = false, killed = false, forwarded = false;
  int alive = o.nproc;
  while (alive > 0 || !streams.empty()) {
    if (const int sig = g_signal.load(); sig != 0 && !forwarded) {
      forwarded = true;
      for (int r = 0; r < o.nproc; ++r) {
        if (!done[r]) kill(pids[r], SIGTERM);
      }
    }
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
    for (int r = 0; r < o.nproc; ++r) {
      if (done[r]) continue;
      int st = 0;
      const pid_t w = waitpid(pids[r], &st, WNOHANG);
      if (w != pids[r]) continue;
      done[r] = true;
      status[r] = st;
      --alive;
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok) {
        std::fprintf(stderr, "glossa: rank %d (pid %d) %s\n", r, static_cast<int>(pids[r]),
                     Describe(st).c_str());
        std::fflush(stderr);
        if (first_failure < 0) {
          first_failure = r;
          term_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(o.grace_seconds));
          kill_at = term_at + std::chrono::seconds(10);
        }
      }
    }
    if (first_failure >= 0 && alive > 0) {
      if (!termed && Clock::now() >= term_at) {
        termed = true;
        std::fprintf(stderr, "glossa: stopping the workers still running after rank %d failed\n",
                     first_failure);
        for (int r = 0; r < o.nproc; ++r) {
          if (!done[r]) kill(pids[r], SIGTERM);
        }
      } else if (termed && !killed && Clock::now() >= kill_at) {
        killed = true;
        for (int r = 0; r < o.nproc; ++r) {
          if (!done[r]) kill(pids[r], SIGKILL);
        }
      }
    }
  }
  if (first_failure < 0) return 0;
  const int st = status[first_failure];
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return WEXITSTATUS(st) != 0 ? WEXITSTATUS(st) : 1;
}

}  // namespace glossa
