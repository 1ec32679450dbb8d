#include "glossa/model/metric_history.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"

namespace glossa {

std::string MetricHistoryPath(const std::string& logdir, const std::string& jobname,
                              const std::string& metric) {
  return JoinPath(JoinPath(logdir, jobname), metric + ".history.txt");
}

void AppendMetricHistory(const std::string& path, int64_t step, double value) {
  char line[64];
  const int n = std::snprintf(line, sizeof(line), "%lld %f\n", static_cast<long long>(step), value);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw AbortedError(StrCat("cannot open '", path, "' for appending: ", std::strerror(errno)));
  }
  try {
    WriteAll(fd, std::string_view(line, static_cast<size_t>(n)), path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::fsync(fd);
  ::close(fd);
}

void MaybeAppendMetricHistory(const Params& early_stop, const std::string& logdir,
                              const std::string& job, int64_t step,
                              const std::map<std::string, double>& metrics) {
  if (early_stop.GetInt("window") <= 0) return;
  const std::string jobname = early_stop.GetString("metric_history.jobname");
  const std::string metric = early_stop.GetString("metric_history.metric");
  if (job != jobname) return;
  auto it = metrics.find(metric);
  if (it == metrics.end()) return;
  AppendMetricHistory(MetricHistoryPath(logdir, jobname, metric), step, it->second);
}

BestStep ComputeBestStep(const std::string& path, double tolerance, bool minimize) {
  if (!(tolerance >= 0)) {
    throw InvalidArgumentError(StrCat("best step: tolerance must be >= 0, got ", tolerance));
  }
  BestStep out;
  if (!FileExists(path)) return out;
  std::map<int64_t, double> records;
  int line_no = 0;
  for (const auto& raw : Split(ReadFileToString(path, 256 << 20), '\n')) {
    ++line_no;
    const std::string line(raw);
    if (line.empty()) continue;
    const std::vector<std::string> fields = [&] {
      std::vector<std::string> f;
      for (const auto& x : Split(line, ' ')) f.emplace_back(x);
      return f;
    }();
    auto bad = [&](const std::string& why) {
      return DataLossError(StrCat("metric history '", path, "' line ", line_no, ": ", why,
                                  " (expected '<step> <value>', got '", line, "')"));
    };
    if (fields.size() != 2) throw bad("not two fields");
    char* end = nullptr;
    errno = 0;
    const long long step = std::strtoll(fields[0].c_str(), &end, 10);
    if (fields[0].empty() || *end != '\0' || errno == ERANGE) throw bad("bad step");
    const double value = std::strtod(fields[1].c_str(), &end);
    if (fields[1].empty() || *end != '\0') throw bad("bad value");
    records.emplace(step, minimize ? value : -value);  // the first record of a step wins
  }
  double best = 0;
  for (const auto& [step, value] : records) {
    out.last_step = step;
    if (out.best_step == 0 || value + tolerance < best) {
      out.best_step = step;
      best = value;
      out.best_value = minimize ? value : -value;
    }
  }
  return out;
}

std::map<std::string, BestStep> TrackBestSteps(const Params& task_params,
                                               const std::map<std::string, bool>& tracked,
                                               const std::string& logdir, const std::string& job,
                                               int64_t step,
                                               const std::map<std::string, double>& metrics) {
  const Params& ep = task_params.GetParams("eval");
  const Params& early_stop = task_params.GetParams("train.early_stop");
  std::map<std::string, bool> which = tracked;
  if (ep.IsSet("best_step_metric")) {
    which = {{ep.GetString("best_step_metric"), !ep.GetBool("best_step_maximize")}};
  }
  const double tolerance = ep.GetFloat("best_step_tolerance");
  std::map<std::string, BestStep> out;
  for (const auto& [metric, minimize] : which) {
    auto it = metrics.find(metric);
    if (it == metrics.end()) continue;
    const std::string path = MetricHistoryPath(logdir, job, metric);
    const bool early_stop_wrote = early_stop.GetInt("window") > 0 &&
                                  early_stop.GetString("metric_history.jobname") == job &&
                                  early_stop.GetString("metric_history.metric") == metric;
    if (!early_stop_wrote) AppendMetricHistory(path, step, it->second);
    const BestStep b = ComputeBestStep(path, tolerance, minimize);
    AtomicWriteFile(JoinPath(JoinPath(logdir, job), StrCat("best-", metric, ".txt")),
                    StrCat("best_step: ", b.best_step, "\nvalue: ", PyFloatRepr(b.best_value),
                           "\nlast_step: ", b.last_step, "\nminimize: ",
                           minimize ? "True" : "False", "\n"));
    out[metric] = b;
  }
  return out;
}

std::map<std::string, BestStepFile> ReadBestStepFiles(const std::string& job_dir) {
  std::map<std::string, BestStepFile> out;
  if (!FileExists(job_dir)) return out;
  for (const std::string& name : ListDirectory(job_dir)) {
    if (name.rfind("best-", 0) != 0 || name.size() < 9 || name.substr(name.size() - 4) != ".txt") {
      continue;
    }
    BestStepFile& b = out[name.substr(5, name.size() - 9)];
    for (const auto& line : Split(ReadFileToString(JoinPath(job_dir, name), 1 << 16), '\n')) {
      const size_t colon = line.find(": ");
      if (colon == std::string_view::npos) continue;
      const std::string key(line.substr(0, colon)), value(line.substr(colon + 2));
      if (key == "best_step") b.best_step = std::atoll(value.c_str());
      if (key == "last_step") b.last_step = std::atoll(value.c_str());
      if (key == "value") b.value = value;
      if (key == "minimize") b.minimize = value == "True";
    }
  }
  return out;
}

bool ShouldStopEarly(const BestStep& b, int64_t window, int64_t min_steps) {
  return window > 0 && b.last_step - b.best_step > window && b.last_step >= min_steps;
}

}  // namespace glossa
