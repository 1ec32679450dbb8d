// The evaler and decoder jobs (Lingvo's evaler and decoder runners), apart from the trainer.
//
// RunCheckpointJob polls <logdir>/train for new checkpoints (backoff 1 s doubling to 5 min), runs
// the eval or decode program on each (the newest only, unless eval_all_checkpoints /
// decode_all_checkpoints), records it in <job dir>/processed_ckpts.txt (so a restart skips it),
// writes summaries and score-%08d.txt, and returns after the checkpoint at max_steps.
//
//   JobOptions o{.logdir = "/tmp/lm", .dataset = "Dev"};
//   RunCheckpointJob(JobKind::kEval, GetModelParams(key, "Dev"), o);   // <logdir>/eval_dev/
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "glossa/core/params.h"
#include "glossa/runtime/program.h"  // JobKind, ProgramDir

namespace glossa {

class Distributed;

struct JobOptions {
  std::string logdir;
  std::string dataset;  // e.g. "Dev": the job directory is eval_dev / decoder_dev
  std::function<void(const std::string&)> log;  // null: stdout
  std::function<void(double)> sleep;            // null: real sleep
  const std::atomic<bool>* stop = nullptr;      // returns when set
  double max_backoff_seconds = 300;
  // While no new checkpoint comes: a line naming the directory, then after a poll a line when
  // this long has passed since the last (so at least every max(this, the backoff)).
  double heartbeat_seconds = 30;
  // Without it, a logdir with neither train/ nor control/ (no run has started there: a mistyped
  // path?) is NotFound, and nothing is created.
  bool wait_for_train = false;
  // --once: the latest checkpoint on disk (NotFound when there is none) is processed alone and
  // the job ends; a poll that then finds nothing to process (it was deleted or cannot be loaded)
  // is NotFound instead of a wait, so a job that did nothing never ends as if it had.
  bool once = false;
  // With `once`: process the latest checkpoint even when an earlier run of this job processed it
  // (without it, that run's scores stand and the job says where they are).
  bool force = false;
  // Data-parallel workers (docs/distributed.md); null: one. Each rank evaluates or decodes its
  // shard of the dataset; metrics are reduced with their weights, and decode outputs gathered
  // before the decoder metrics (corpus BLEU needs every hypothesis). Rank 0 picks the
  // checkpoints and alone writes the job directory; every rank reads the checkpoints, so the
  // logdir must be on a file system they share.
  Distributed* distributed = nullptr;
};

// Returns the number of checkpoints processed in this run.
int64_t RunCheckpointJob(JobKind kind, const Params& model_params, const JobOptions& options);

}  // namespace glossa
