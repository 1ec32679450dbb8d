// `glossa eval` and `glossa decode`: Lingvo's evaler and decoder jobs over the checkpoints of
// <logdir>/train (glossa/runtime/jobs.h), alone or sharded over data-parallel workers.
#include <CLI/CLI.hpp>

#include "glossa/runtime/distributed.h"
#include "glossa/runtime/jobs.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

template <JobKind kKind>
class CheckpointJobCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    const bool eval = kKind == JobKind::kEval;
    auto* c = app.add_subcommand(eval ? "eval" : "decode",
                                 eval ? "The evaler job: evaluate new checkpoints of <logdir>/train."
                                      : "The decoder job: decode new checkpoints of <logdir>/train.");
    AddModelFlags(c, f_, true, "Dev");
    AddDistFlags(c, d_, false);
    c->add_flag("--once", f_.once, eval ? "Evaluate the latest checkpoint once and exit."
                                        : "Decode the latest checkpoint once and exit.");
    c->add_flag("--force", force_,
                eval ? "With --once: evaluate the latest checkpoint even when an earlier run of "
                       "this job did (its score file is rewritten)."
                     : "With --once: decode the latest checkpoint even when an earlier run of "
                       "this job did.");
    AddFollowerFlags(c, f_);
    c->add_flag("--wait_for_train", f_.wait_for_train,
                "Wait for a training run to start in --logdir (without it, a logdir with no "
                "train/ and no control/ is an error).");
    c->add_option("--checkpoint", f_.checkpoint,
                  eval ? "Evaluate this checkpoint (a prefix such as <logdir>/train/ckpt-00001000) "
                         "once and exit (task.eval.load_checkpoint_from)."
                       : "Decode this checkpoint once and exit (task.eval.load_checkpoint_from).");
    return c;
  }

  int Run(const CommandContext& ctx) override {
    if (ShouldLaunch(d_)) return LaunchWorkers(d_, ctx.expanded_args);
    const Params p = ModelParamsFromFlags(f_);
    InstallStopHandlers();
    const std::unique_ptr<Distributed> dist = JoinWorkers(d_);
    JobOptions o;
    o.logdir = f_.logdir;
    o.dataset = f_.dataset;
    o.stop = &StopFlag();
    o.distributed = dist.get();
    o.wait_for_train = f_.wait_for_train;
    o.once = f_.once;
    o.force = force_;
    if (dist && dist->rank() != 0) o.log = [](const std::string&) {};
    RunCheckpointJob(kKind, p, o);
    return 0;
  }

 private:
  ModelFlags f_;
  DistFlags d_;
  bool force_ = false;
};

using EvalCommand = CheckpointJobCommand<JobKind::kEval>;
using DecodeCommand = CheckpointJobCommand<JobKind::kDecode>;
GLOSSA_REGISTER_COMMAND(EvalCommand, 60);
GLOSSA_REGISTER_COMMAND(DecodeCommand, 70);

}  // namespace
}  // namespace cli
}  // namespace glossa
