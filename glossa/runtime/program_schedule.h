// The program schedule (Lingvo's SimpleProgramSchedule, and with ml_perf.enabled its
// TrainAndDecode MLPerf variant): what runs between train loops. After every
// train_executions_per_eval train loops (and after the last), an eval program and a decode program
// run on each of eval_dataset_names, writing to <logdir>/eval_<dataset> and
// <logdir>/decoder_<dataset>. The Params are the model's `program_schedule`
// (SimpleProgramScheduleParams in glossa/model/base_model.h).
//
// The programs run the trained model itself — its variables, or their EMA in eval mode (the
// model's EmaSource) — on each dataset's own input generator (TaskInputScope), so no dataset
// holds a copy of the weights.
//
//   ProgramSchedule schedule(model, dataset_params, logdir, log, clock);
//   schedule.RunStart();
//   while (...) { schedule.BeforeTrainLoop(step); train.RunLoop(&step);
//                 if (schedule.AfterTrainLoop(step, steps, last)) break; }   // MLPerf target
//   schedule.RunStop();
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "glossa/core/params.h"
#include "glossa/input/input_generator.h"
#include "glossa/model/base_model.h"

namespace glossa {

class EventWriter;

class ProgramSchedule {
 public:
  // `model`: the trained model (its program_schedule Params are the schedule); `dataset_params`:
  // the model's Params for each eval dataset (GetModelParams(key, dataset, ...)), of which only the
  // eval task's input is used — everything else must equal the trained model's (InvalidArgument
  // naming the dataset otherwise, and for a dataset the schedule names but the map lacks).
  // `log` receives the console lines, `clock` returns wall time in seconds (MLPerf time_ms).
  ProgramSchedule(BaseModel& model, const std::map<std::string, Params>& dataset_params,
                  std::string logdir, std::function<void(const std::string&)> log,
                  std::function<double()> clock);
  ~ProgramSchedule();
  ProgramSchedule(const ProgramSchedule&) = delete;
  ProgramSchedule& operator=(const ProgramSchedule&) = delete;

  // True when the schedule runs any eval or decode program.
  bool has_programs() const { return has_programs_; }
  // MLPerf (ml_perf.enabled; Lingvo's MLPerfTrainDecodeProgram, line for line): the
  // hyper-parameters, init_stop and run_start. No-op without ml_perf.
  void RunStart();
  // Before each train loop; at the start of a run of train_executions_per_eval loops, MLPerf
  // block_start {first_epoch_num: epoch + 1, epoch_count: 1} when a new epoch began.
  void BeforeTrainLoop(int64_t global_step);
  // After a train loop of `steps` steps ending at `global_step` (`last`: the run ends after it):
  // runs the eval and decode programs when due (MLPerf eval_start, eval_stop, eval_accuracy).
  // True when MLPerf says stop: the metric went past its threshold (run_stop success), or the run
  // started at or past max_steps_to_train (run_stop abort).
  bool AfterTrainLoop(int64_t global_step, int64_t steps, bool last);
  // MLPerf run_stop {status: abort} when no run_stop was logged yet.
  void RunStop();
  // Whether an MLPerf run_stop {status: success} was logged.
  bool ml_success() const { return ml_success_; }

  // Runs every dataset's eval and decode program now; returns the MLPerf decoder metric of the
  // last dataset decoded (when ml_perf is on and one was decoded).
  std::optional<double> RunEvalPrograms(int64_t global_step);

 private:
  // One ":::MLLOG {...}" line in Lingvo's format (ml_perf_log.py): time_ms, key, value, metadata
  // with lineno and file appended.
  void MlLog(const std::string& key, const std::string& value_json,
             const std::string& metadata_json = "{}", int line = 0);
  BaseInputGenerator& Input(const std::string& dataset);
  EventWriter& Writer(const std::string& dir);

  BaseModel& model_;
  const Params& sched_;
  std::string logdir_;
  std::function<void(const std::string&)> log_;
  std::function<double()> clock_;
  std::map<std::string, Params> input_params_;  // dataset -> the eval task's input Params
  std::map<std::string, std::unique_ptr<BaseInputGenerator>> inputs_;  // built at first use
  std::map<std::string, std::unique_ptr<EventWriter>> writers_;
  bool has_programs_ = false;
  bool ml_perf_ = false;
  int64_t per_eval_ = 1;
  int64_t steps_per_loop_ = 1;
  int64_t steps_per_epoch_ = 1;
  int64_t loops_ = 0;
  int64_t max_steps_to_train_ = 0;
  int64_t run_start_step_ = 0;  // the global step before the current run's training
  int64_t ml_epoch_ = -1;
  bool run_stopped_ = false, ml_success_ = false;
};

}  // namespace glossa
