// Lingvo's metric history and best-step logic (early_stop.MetricHistory, the BestStep op,
// EarlyStop): an evaler or decoder appends "<step> <value>" lines to
// <logdir>/<jobname>/<metric>.history.txt; the best step is the first whose value beats every
// earlier best by more than a tolerance (minimizing, or maximizing with the values negated), and
// training stops early once the last step is more than `window` steps past the best.
//
//   AppendMetricHistory(MetricHistoryPath(logdir, "eval_dev", "log_pplx"), 1000, 3.21);
//   BestStep b = ComputeBestStep(path, /*tolerance=*/0.0, /*minimize=*/true);
//   if (ShouldStopEarly(b, window, min_steps)) ...
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "glossa/core/params.h"

namespace glossa {

// The Params are task.train.early_stop (glossa/model/base_task.cc): window (0: off), tolerance,
// min_steps, verbose, metric_history {jobname ('eval_dev'), metric ('log_pplx'), minimize}.

std::string MetricHistoryPath(const std::string& logdir, const std::string& jobname,
                              const std::string& metric);
// Appends "%d %f\n" (Lingvo's format). Aborted naming the file on an I/O error.
void AppendMetricHistory(const std::string& path, int64_t step, double value);
// MetricHistory.ConditionalAppend for a job's results: when early stopping is on
// (early_stop.window > 0) and `job` (e.g. "eval_dev") is early_stop.metric_history.jobname,
// appends the tracked metric's value at `step`.
void MaybeAppendMetricHistory(const Params& early_stop, const std::string& logdir,
                              const std::string& job, int64_t step,
                              const std::map<std::string, double>& metrics);

struct BestStep {
  int64_t best_step = 0;
  int64_t last_step = 0;
  double best_value = 0;  // the metric at best_step, as recorded
};
// Lingvo's BestStep op over a history file: records in ascending step order (the first record
// of a step wins); the best is replaced when best_step == 0 or value + tolerance < best (values
// negated when maximizing). A missing file gives {0, 0}; a malformed line is DataLoss naming the
// file and line; a negative tolerance is InvalidArgument.
BestStep ComputeBestStep(const std::string& path, double tolerance, bool minimize);
// The evaler's and decoder's best-step tracking: for each metric the task tracks
// (BaseTask::TrackedMetrics, or task.eval.best_step_metric), appends the step's value to
// <logdir>/<job>/<metric>.history.txt (unless early stopping already did), recomputes the best
// step with task.eval.best_step_tolerance, and writes <logdir>/<job>/best-<metric>.txt
// ("best_step: N\nvalue: V\nlast_step: M\n"). Returns metric -> best step.
std::map<std::string, BestStep> TrackBestSteps(const Params& task_params,
                                               const std::map<std::string, bool>& tracked,
                                               const std::string& logdir, const std::string& job,
                                               int64_t step,
                                               const std::map<std::string, double>& metrics);

// A best-<metric>.txt that TrackBestSteps wrote.
struct BestStepFile {
  int64_t best_step = 0, last_step = 0;
  std::string value;  // as written
  bool minimize = true;
};
// Every best-<metric>.txt of a job directory, by metric (none when the directory does not exist).
std::map<std::string, BestStepFile> ReadBestStepFiles(const std::string& job_dir);

// EarlyStop.Stop: last_step - best_step > window and last_step >= min_steps (never with window 0).
bool ShouldStopEarly(const BestStep& b, int64_t window, int64_t min_steps);

}  // namespace glossa
