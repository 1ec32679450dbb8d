#include "glossa/runtime/blas_kernels.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "glossa/base/strings.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/runtime/cpu_runtime.h"

extern "C" char** environ;

namespace glossa {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// The environment with OPENBLAS_CORETYPE=core and GLOSSA_BLAS_PROBE=1 (any earlier values of the
// two dropped).
std::vector<std::string> ProbeEnvironment(const std::string& core) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string var(*e);
    if (var.rfind("OPENBLAS_CORETYPE=", 0) == 0 || var.rfind("GLOSSA_BLAS_PROBE=", 0) == 0) continue;
    env.push_back(var);
  }
  env.push_back("OPENBLAS_CORETYPE=" + core);
  env.push_back("GLOSSA_BLAS_PROBE=1");
  return env;
}

// Runs probe_argv with OPENBLAS_CORETYPE=core and reads its "blas_probe_seconds <s>" line;
// +inf when it does not run, say so, or finish within two minutes.
double TimeInChild(const std::vector<std::string>& probe_argv, const std::string& core) {
  if (probe_argv.empty()) return kNever;
  const std::vector<std::string> env = ProbeEnvironment(core);
  std::vector<char*> argv_c, env_c;
  for (const auto& a : probe_argv) argv_c.push_back(const_cast<char*>(a.c_str()));
  argv_c.push_back(nullptr);
  for (const auto& e : env) env_c.push_back(const_cast<char*>(e.c_str()));
  env_c.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return kNever;
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return kNever;
  }
  if (pid == 0) {  // the child: its stdout is the pipe (async-signal-safe calls only)
    ::dup2(fds[1], 1);
    ::execve(argv_c[0], argv_c.data(), env_c.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    const ssize_t got = ::read(fds[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return kNever;
  const size_t at = out.find("blas_probe_seconds ");
  if (at == std::string::npos) return kNever;
  const double s = std::atof(out.c_str() + at + std::strlen("blas_probe_seconds "));
  return s > 0 ? s : kNever;
}

}  // namespace

std::string BlasChoiceKey() {
  return StrCat(ThisCpuIdentity(), " | blas probe 1 | cores ", std::thread::hardware_concurrency(),
                " | openblas ", BlasCoreName(), " | blas_kernels");
}

std::string ChooseBlasKernels(const std::vector<std::string>& probe_argv,
                              std::string* description) {
  const std::string core = BlasCoreName();
  if (core.empty() || !HasSgemm()) return "";
  std::vector<std::string> candidates = {core};
  const X86Features cpu = ProbeX86Features();
  if (cpu.avx2 && cpu.fma && core != "Haswell") candidates.push_back("Haswell");
  if (cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq && core != "SkylakeX") {
    candidates.push_back("SkylakeX");
  }
  if (candidates.size() == 1) {
    if (description != nullptr) *description = core + " (the only kernel set this CPU supports)";
    return core;
  }
  return ChooseAmongCached(
      BlasChoiceKey(), candidates,
      [&](const std::string& c) { return TimeInChild(probe_argv, c); }, description);
}

void RunBlasProbe() {
  struct Shape {
    int64_t m, k, n;
  };
  const Shape shapes[] = {{2048, 512, 512}, {2048, 128, 512}};
  std::vector<std::vector<float>> a, b, c;
  for (const Shape& s : shapes) {
    a.emplace_back(s.m * s.k);
    b.emplace_back(s.k * s.n);
    c.emplace_back(s.m * s.n);
    for (size_t i = 0; i < a.back().size(); ++i) a.back()[i] = static_cast<float>(i % 7) * 0.1f;
    for (size_t i = 0; i < b.back().size(); ++i) b.back()[i] = static_cast<float>(i % 5) * 0.1f;
  }
  auto round = [&] {
    for (size_t i = 0; i < std::size(shapes); ++i) {
      const Shape& s = shapes[i];
      RowMajorSgemm(false, false, s.m, s.n, s.k, a[i].data(), s.k, b[i].data(), s.n, 0.0f,
                    c[i].data(), s.n);
    }
  };
  round();  // warm-up: threads started, pages touched
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    round();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  std::printf("blas_probe_seconds %.6g\n", t[t.size() / 2]);
  std::fflush(stdout);
}

void UseBestBlasKernels(char** argv) {
  (void)argv;
  if (std::getenv("GLOSSA_BLAS_PROBE") != nullptr) {
    RunBlasProbe();
    std::_Exit(0);
  }
  if (std::getenv("GLOSSA_BLAS_KERNELS_CHOSEN") != nullptr) {  // re-executed below: said already
    unsetenv("GLOSSA_BLAS_KERNELS_CHOSEN");
    return;
  }
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv("GLOSSA_KEEP_BLAS_KERNELS")) {
    return;
  }
  std::string description;
  const std::string chosen = ChooseBlasKernels({"/proc/self/exe"}, &description);
  if (chosen.empty()) return;
  // Said when measured, or when it changes the kernels; a cached decision that keeps OpenBLAS's
  // own pick is silent (every glossa command runs this, `glossa --help` too).
  const bool keep = chosen == BlasCoreName();
  if (!keep || description.find("; as cached in ") == std::string::npos) {
    std::fprintf(stderr, "kernel choice: blas_kernels (OpenBLAS's kernel set): %s\n",
                 description.c_str());
  }
  if (keep) return;
  setenv("OPENBLAS_CORETYPE", chosen.c_str(), 1);
  setenv("GLOSSA_BLAS_KERNELS_CHOSEN", "1", 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // exec failed: go on with the kernels we have
  unsetenv("GLOSSA_BLAS_KERNELS_CHOSEN");
}

}  // namespace glossa
