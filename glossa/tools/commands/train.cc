// `glossa train`: trains a model in --logdir (resuming from its latest checkpoint), alone or as
// data-parallel workers (docs/distributed.md).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "glossa/base/strings.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/gradient_sync.h"
#include "glossa/runtime/mesh.h"
#include "glossa/runtime/trainer.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

class TrainCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand("train",
                                 "Train a model in --logdir (resumes from its latest checkpoint).");
    AddModelFlags(c, f_, true, "Train");
    AddDistFlags(c, d_, true);
    AddIntFlag(c, "--verbosity", verbosity_, 0, 2,
               "0: no per-loop lines; 1: one concise progress line per loop (default); 2: also "
               "every metric, as Lingvo's step line.");
    AddIntFlag(c, "--log_every_n_steps", log_every_n_steps_, 0, int64_t{1} << 53,
               "The progress line at most every N steps (0: every train loop).");
    return c;
  }

  int Run(const CommandContext& ctx) override {
    if (ShouldLaunch(d_)) return LaunchWorkers(d_, ctx.expanded_args);
    Params p = ModelParamsFromFlags(f_, /*training=*/true);
    InstallStopHandlers();  // before the rendezvous: a stop then ends the run cleanly
    const std::unique_ptr<Distributed> dist = JoinWorkers(d_);
    if (!d_.mesh.empty() && !dist) ParseMesh(d_.mesh, 1);  // one process: only a mesh of 1
    TrainOptions o;
    ExecutorOptions& eo = o.executor;
    eo.logdir = f_.logdir;
    eo.distributed = dist.get();
    eo.grad_bucket_bytes = static_cast<int64_t>(d_.bucket_mb * (1 << 20));
    eo.overlap_grad_reduce = !d_.no_overlap;
    eo.mesh = d_.mesh;
    eo.verbosity = static_cast<int>(verbosity_);
    eo.log_every_n_steps = log_every_n_steps_;
    if (dist && dist->rank() != 0) {
      // Rank 0 speaks for the job; the others say what they are and then only fail loudly.
      const MeshShape m = ParseMesh(d_.mesh, dist->world_size());
      const MeshShape::Coordinates at = m.Of(dist->rank());
      if (m.pipe > 1 || m.model > 1) {
        std::string where;
        if (m.pipe > 1) where += StrCat("pipeline stage ", at.pipe, ", ");
        if (m.expert > 1) where += StrCat("expert shard ", at.expert, " of ", m.expert, ", ");
        if (m.model > 1) where += StrCat("model shard ", at.model, " of ", m.model, ", ");
        std::printf("rank %d of %d: %straining on input shard %d of %d\n", dist->rank(),
                    dist->world_size(), where.c_str(), m.BatchShard(at), m.batch_shards());
      } else {
        std::printf("rank %d of %d: training on input shard %d\n", dist->rank(),
                    dist->world_size(), dist->rank());
      }
      std::fflush(stdout);
      eo.log = [](const std::string&) {};
    }
    for (const auto& ds : p.Get("program_schedule.eval_dataset_names").AsList()) {
      ModelFlags df = f_;
      df.dataset = ds.AsString();
      eo.dataset_params[df.dataset] = ModelParamsFromFlags(df, /*training=*/true);
    }
    o.on_executor = SetStopTarget;
    Train(p, std::move(o));
    return 0;
  }

 private:
  ModelFlags f_;
  DistFlags d_;
  int64_t verbosity_ = 1, log_every_n_steps_ = 0;
};
GLOSSA_REGISTER_COMMAND(TrainCommand, 50);

}  // namespace
}  // namespace cli
}  // namespace glossa
