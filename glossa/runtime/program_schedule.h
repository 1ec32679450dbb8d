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
//   schedule.RunStop(success);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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
  // MLPerf run_start (no-op without ml_perf.enabled).
  void RunStart();
  // MLPerf block_start before the first train loop of each block.
  void BeforeTrainLoop(int64_t global_step);
  // After a train loop of `steps` steps ending at `global_step` (`last`: the run ends after it):
  // runs the eval and decode programs when due. True when an MLPerf run reached its target.
  bool AfterTrainLoop(int64_t global_step, int64_t steps, bool last);
  // MLPerf run_stop with status success or aborted.
  void RunStop(bool success);

  // Runs every dataset's eval and decode program now; true when the MLPerf target was reached.
  bool RunEvalPrograms(int64_t global_step, int64_t epoch);

 private:
  void MlLog(const std::string& key, const std::string& event_type, const std::string& value_json,
             const std::string& metadata_json = "{}");
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
};

}  // namespace glossa
