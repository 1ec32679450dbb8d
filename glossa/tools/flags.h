// What the `glossa` commands share (glossa/tools/commands/*.cc): the model and data-parallel
// flags and the Params they build, exact integer flags, --flagfile expansion, and the stop signals.
//
//   ModelFlags f;  AddModelFlags(cmd, f, /*needs_logdir=*/true, "Train");
//   ...parse...
//   Params p = ModelParamsFromFlags(f, /*training=*/true);
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "glossa/core/params.h"

namespace CLI {
class App;
}  // namespace CLI

namespace glossa {

class Distributed;
class Executor;

namespace cli {

// How kernel choices are made (glossa/kernels/kernel_choice.h): measure, aten or native each.
struct KernelFlags {
  std::string bf16_kernels = "measure", gemm_split = "measure", row_kernels = "measure";
};
// --bf16_kernels, --gemm_split, --row_kernels; ApplyKernelFlags sets the modes (call before the
// first kernel runs).
void AddKernelFlags(CLI::App* cmd, KernelFlags& f);
void ApplyKernelFlags(const KernelFlags& f);

struct ModelFlags {
  std::string model, logdir, dataset = "Train", override_text, override_file;
  int64_t max_steps = -1, saver_max_to_keep = -1, intra_op_threads = 0;
  int64_t random_seed = -1;  // -1: not given (a given value is checked to be >= 0)
  std::string model_task_name, checkpoint;
  KernelFlags kernels;
  bool enable_check_numerics = false;
  std::vector<std::string> part_regex;
  int64_t topn = 0;
  double keep_every_n_hours = -1;
  bool once = false;
  // Jobs that follow a run (eval, decode, export, report) build the model it was trained with
  // (checkpoint/trained_params.h); --allow_params_change lets overrides differ from it.
  bool use_trained_params = false, allow_params_change = false, wait_for_train = false;
  std::string flagfile_help;  // --flagfile is expanded before parsing; declared for --help
};

// Data parallelism (docs/distributed.md): --nproc_per_node starts local workers; a worker reads
// the standard environment (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT) set by any launcher.
struct DistFlags {
  int64_t nproc_per_node = 0;
  std::string master_addr;
  int64_t master_port = 0;
  double timeout_seconds = 300;
  std::string backend = "gloo";
  double bucket_mb = 25;
  bool no_overlap = false;
  std::string mesh;
};

// An integer flag parsed exactly: out-of-range values (beyond int64 too) are errors naming the
// flag, never clamped. The default shows in --help unless it is -1 ("not given").
void AddIntFlag(CLI::App* cmd, const std::string& name, int64_t& target, int64_t lo, int64_t hi,
                const std::string& doc);
// " (did you mean: --x, --y?)" for an unknown flag of `cmd` (its parents' flags too), or "".
std::string FlagSuggestion(const CLI::App* cmd, const std::string& arg);
// The flags every model command has (--model, --logdir, --dataset, overrides, ...).
void AddModelFlags(CLI::App* cmd, ModelFlags& f, bool needs_logdir,
                   const std::string& default_dataset);
// For the jobs that follow a run (eval, decode, export, report): --allow_params_change.
void AddFollowerFlags(CLI::App* cmd, ModelFlags& f);
void AddDistFlags(CLI::App* cmd, DistFlags& d, bool training);

// The model's Params as the flags say (registry, overrides, the run's control/params.txt for
// followers, --checkpoint, --max_steps, seeds); also sets up the CPU runtime.
Params ModelParamsFromFlags(const ModelFlags& f, bool training = false);
// --intra_op_threads beyond 4 per core is InvalidArgument.
void CheckIntraOpThreads(int64_t threads);

// Loads the libraries of $GLOSSA_LIBRARIES (':'-separated) and then `paths` (--load_library), each
// once, so that the models, layers and commands they register are there for the command. A path
// that does not exist is NotFound; one dlopen refuses, or one that registers nothing in Glossa
// (not a library built against it), is InvalidArgument naming it and dlopen's words.
void LoadLibraries(const std::vector<std::string>& paths);
// `--params_override` text as params text lines.
std::string OverrideText(const std::string& s);
// Says a note on stderr once per process.
void NoteOnce(const std::string& note);

// The workers this process belongs to (the environment a launcher set), or null.
std::unique_ptr<Distributed> JoinWorkers(const DistFlags& d);
// --nproc_per_node: runs this command (`args`, the expanded command line) again as that many
// local workers, without the flag. Returns the job's exit status.
int LaunchWorkers(const DistFlags& d, const std::vector<std::string>& args);
// Whether this process should launch workers (--nproc_per_node given, not a launched worker).
bool ShouldLaunch(const DistFlags& d);
// How workers re-run this program (RunCli's CliOptions::self_command).
std::vector<std::string>& SelfCommand();

// Expands --flagfile=<file> (one flag per line; '#' comments) in place, recursively.
std::vector<std::string> ExpandFlagfiles(const std::vector<std::string>& args, int depth = 0);

// SIGTERM/SIGINT: set the stop flag and ask the running executor (if any) to stop.
void InstallStopHandlers();
std::atomic<bool>& StopFlag();
// The executor a stop signal reaches (null: none).
void SetStopTarget(Executor* executor);

}  // namespace cli
}  // namespace glossa
