#include "glossa/tools/flags.h"

#include <dlfcn.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <set>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/checkpoint/saver.h"
#include "glossa/checkpoint/trained_params.h"
#include "glossa/core/registry.h"
#include "glossa/io/safetensors.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/model/datasets.h"
#include "glossa/model/model_registry.h"
#include "glossa/model/params_passes.h"
#include "glossa/optim/learner.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/gradient_sync.h"
#include "glossa/runtime/mesh.h"
#include "glossa/runtime/executor.h"
#include "glossa/runtime/launcher.h"

namespace glossa {
namespace cli {

// --intra_op_threads beyond 4 threads per core only thrashes (and at 1,024 made a process of
// nearly 1,800 threads): refused, naming the machine's cores.
void CheckIntraOpThreads(int64_t threads) {
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  if (threads > 4 * cores) {
    throw InvalidArgumentError(StrCat("--intra_op_threads=", threads, " is more than 4 per core (",
                                      "this machine has ", cores, " cores; 0 uses them all)"));
  }
}

// `--params_override` takes `key : value` lines separated by newlines or ';' (outside quotes).
std::string OverrideText(const std::string& s) { return OverrideLines(s); }


std::vector<std::string>& SelfCommand() {
  static std::vector<std::string> command{"/proc/self/exe"};
  return command;
}

namespace {

std::atomic<Executor*> g_executor{nullptr};

void HandleStopSignal(int) {
  StopFlag().store(true);
  if (Executor* e = g_executor.load(); e != nullptr) e->RequestStop();
}

}  // namespace

std::atomic<bool>& StopFlag() {
  static std::atomic<bool> stop{false};
  return stop;
}

void SetStopTarget(Executor* executor) {
  g_executor.store(executor);
  if (executor != nullptr && StopFlag().load()) executor->RequestStop();
}

void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = HandleStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// Expands --flagfile=<file> (one flag per line; '#' comments) in place, recursively.
std::vector<std::string> ExpandFlagfiles(const std::vector<std::string>& args, int depth) {
  if (depth > 8) throw InvalidArgumentError("--flagfile: nested more than 8 deep");
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string file;
    if (args[i].rfind("--flagfile=", 0) == 0) {
      file = args[i].substr(11);
    } else if (args[i] == "--flagfile" && i + 1 < args.size()) {
      file = args[++i];
    } else {
      out.push_back(args[i]);
      continue;
    }
    std::vector<std::string> lines;
    int n = 0;
    // A flag file is small text: a directory, /dev/zero or a huge file is an error, not a hang.
    std::string text;
    try {
      text = ReadFileToString(file, 1 << 20);
    } catch (const Error& e) {
      ThrowError(e.code(), StrCat("--flagfile: ", e.message()));
    }
    for (const auto& raw : Split(text, '\n')) {
      ++n;
      std::string line(Strip(raw));
      if (line.empty() || line[0] == '#') continue;
      if (line.rfind("--", 0) != 0) {
        throw InvalidArgumentError(
            StrCat(file, ":", n, ": expected --flag=value, got '", line, "'"));
      }
      lines.push_back(line);
    }
    for (auto& l : ExpandFlagfiles(lines, depth + 1)) out.push_back(std::move(l));
  }
  return out;
}

// Says a note once per process (report reads the Params twice).
void NoteOnce(const std::string& note) {
  static std::set<std::string> said;
  if (!said.insert(note).second) return;
  std::cerr << "glossa: " << note << std::endl;
}

// An integer flag parsed exactly: out-of-range values (beyond int64 too) are errors naming the
// flag, never clamped.
void AddIntFlag(CLI::App* cmd, const std::string& name, int64_t& target, int64_t lo, int64_t hi,
                const std::string& doc) {
  cmd->add_option_function<std::string>(
         name,
         [&target, name, lo, hi](const std::string& text) {
           errno = 0;
           char* end = nullptr;
           const long long v = std::strtoll(text.c_str(), &end, 10);
           if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || v < lo ||
               v > hi) {
             throw CLI::ValidationError(
                 name, StrCat("must be an integer in [", lo, ", ", hi, "], got '", text, "'"));
           }
           target = v;
         },
         doc)
      ->type_name("INT");
  // The default shows in --help; -1 stands for "not given" (the model's value applies).
  if (target >= 0) cmd->get_option(name)->default_str(std::to_string(target));
}

// An unknown flag: the nearest flags the command has, as misspelled Params keys get ('-' read as
// '_': --max-steps finds --max_steps).
std::string FlagSuggestion(const CLI::App* cmd, const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return "";
  std::string name = arg.substr(2);
  name = name.substr(0, name.find('='));
  std::replace(name.begin(), name.end(), '-', '_');
  std::vector<std::string> flags;
  for (const CLI::App* c = cmd; c != nullptr; c = c->get_parent()) {
    for (const CLI::Option* o : c->get_options()) {
      for (const auto& l : o->get_lnames()) flags.push_back(l);
    }
  }
  std::vector<std::string> near = SimilarKeys(name, flags);
  if (near.empty()) return "";
  for (auto& n : near) n = "--" + n;
  return StrCat(" (did you mean: ", Join(near, ", "), "?)");
}

void AddKernelFlags(CLI::App* cmd, KernelFlags& f) {
  const auto modes = CLI::IsMember({"measure", "aten", "native"});
  cmd->add_option("--bf16_kernels", f.bf16_kernels,
                  "How bf16 projections and attention pick their kernels: measure (time ATen's "
                  "oneDNN kernels and Glossa's float32 sgemms on each shape once, keep the "
                  "faster; each choice is printed), aten or native (pinned).")
      ->capture_default_str()
      ->check(modes);
  cmd->add_option("--gemm_split", f.gemm_split,
                  "How training fp32 projections run their GEMMs: measure (time both per weight "
                  "shape once, keep the faster), aten (one at a time on OpenBLAS's threads) or "
                  "native (row parts, a single-threaded GEMM per kernel thread).")
      ->capture_default_str()
      ->check(modes);
  cmd->add_option("--row_kernels", f.row_kernels,
                  "How small fp32 products run: short inputs without autograd (decoding, "
                  "scoring) and the attention core's per-head products. measure (time both per "
                  "weight shape and power-of-two row count, or per head shape, keep the faster), "
                  "aten (BLAS sgemm) or native (the row kernel, up to 256 rows, an inference "
                  "plan's packed panels at any row count; the small-GEMM kernel for the heads).")
      ->capture_default_str()
      ->check(modes);
}

void ApplyKernelFlags(const KernelFlags& f) {
  SetKernelMode(KernelChoice::kBf16, ParseKernelMode(f.bf16_kernels, "--bf16_kernels"));
  SetKernelMode(KernelChoice::kGemmSplit, ParseKernelMode(f.gemm_split, "--gemm_split"));
  SetKernelMode(KernelChoice::kRowKernel, ParseKernelMode(f.row_kernels, "--row_kernels"));
}

void AddModelFlags(CLI::App* cmd, ModelFlags& f, bool needs_logdir,
                   const std::string& default_dataset) {
  f.dataset = default_dataset;
  cmd->add_option("--model", f.model,
                  "Registered model, e.g. lm.austen.TransformerLmTiny (see list_models).")
      ->required();
  auto* logdir = cmd->add_option("--logdir", f.logdir,
                                 "The log directory (train/, control/, eval_*/, decoder_*/).");
  if (needs_logdir) logdir->required();
  cmd->add_option("--dataset", f.dataset, "Dataset method of the model: Train, Dev, Test, ...")
      ->capture_default_str();
  cmd->add_option("--model_params_override", f.override_text,
                  "'key : value' lines (';' or newline separated) applied to the model params.");
  cmd->add_option("--model_params_file_override", f.override_file,
                  "A params text file applied to the model params.");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  AddIntFlag(cmd, "--max_steps", f.max_steps, 0, int64_t{1} << 53,
             "Overrides task.train.max_steps.");
  AddIntFlag(cmd, "--saver_max_to_keep", f.saver_max_to_keep, 0, kMax,
             "Overrides task.train.save_max_to_keep.");
  cmd->add_option("--saver_keep_checkpoint_every_n_hours", f.keep_every_n_hours,
                  "Overrides task.train.save_keep_checkpoint_every_n_hours.");
  AddIntFlag(cmd, "--intra_op_threads", f.intra_op_threads, 0, 1024,
             "ATen intra-op threads; 0: the layout of glossa/runtime/cpu_runtime.h.");
  AddKernelFlags(cmd, f.kernels);
  AddIntFlag(cmd, "--random_seed", f.random_seed, 0, kMax,
             "Overrides the model's random_seed (deterministic runs).");
  cmd->add_option("--model_task_name", f.model_task_name,
                  "For multitask models: select task to train/evaluate/decode. Empty means to "
                  "sample a task (training only).");
  cmd->add_option("--flagfile", f.flagfile_help,
                  "Read --flag=value lines from this file (one a line, # comments; may nest); "
                  "they count as if given here.");
  cmd->add_flag("--enable_check_numerics", f.enable_check_numerics,
                "A gradient with NaN or Inf values is an error (instead of a skipped step).");
}

// For the jobs that follow a run: they read the model from <logdir>/control/params.txt.
void AddFollowerFlags(CLI::App* cmd, ModelFlags& f) {
  f.use_trained_params = true;
  cmd->add_flag("--allow_params_change", f.allow_params_change,
                "Let --model_params_override / --model_params_file_override change keys of the "
                "model the run was trained with (<logdir>/control/params.txt); without it, that is "
                "an error showing the difference.");
}

void AddDistFlags(CLI::App* cmd, DistFlags& d, bool training) {
  AddIntFlag(cmd, "--nproc_per_node", d.nproc_per_node, 1, 1024,
             "Start this many data-parallel workers on this machine, their output prefixed by "
             "rank (as torchrun). Without it, a worker joins the job the environment describes "
             "(WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT), if any.");
  cmd->add_option("--master_addr", d.master_addr,
                  "The rendezvous address (rank 0's host; default: MASTER_ADDR, or 127.0.0.1).");
  AddIntFlag(cmd, "--master_port", d.master_port, 1, 65535,
             "The rendezvous port (default: MASTER_PORT; with --nproc_per_node, a free port rank 0 "
             "binds and passes on).");
  cmd->add_option("--dist_timeout", d.timeout_seconds,
                  "Seconds a rendezvous or collective may wait for the other ranks before the "
                  "job fails, naming the lost rank.")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0 * 7));
  cmd->add_option("--dist_backend", d.backend,
                  "The c10d backend: gloo (CPU); nccl needs a CUDA build.")
      ->capture_default_str();
  if (training) {
    cmd->add_option("--grad_bucket_mb", d.bucket_mb,
                    "Gradient allreduce bucket size in MB (PyTorch DDP's bucket_cap_mb).")
        ->capture_default_str()
        ->check(CLI::Range(0.001, 1e6));
    cmd->add_option("--mesh", d.mesh,
                    "The device mesh over the ranks: GShard's data:D,expert:E (D·E = the ranks: "
                    "expert-sharded layers spread their experts over E ranks and D replicas of "
                    "them sum their gradients), or GPipe's data:D,pipe:S (D·S = the ranks: D "
                    "pipelines, each rank one stage of the pipelined layers; pipe:S alone is "
                    "D = 1). Default: the expert axis over every rank.");
    cmd->add_flag("--no_overlap_grad_reduce", d.no_overlap,
                  "Reduce gradients after the backward pass instead of during it.");
  }
}

// The workers this process belongs to: none without WORLD_SIZE (or with WORLD_SIZE=1).
std::unique_ptr<Distributed> JoinWorkers(const DistFlags& d) {
  std::optional<DistributedOptions> o = DistributedOptionsFromEnv();
  if (!o || o->world_size <= 1) return nullptr;
  if (!d.master_addr.empty()) o->master_addr = d.master_addr;
  if (d.master_port > 0) o->master_port = static_cast<int>(d.master_port);
  o->timeout_seconds = d.timeout_seconds;
  o->backend = d.backend;
  o->stop_requested = [] { return StopFlag().load(); };
  return std::make_unique<Distributed>(*o);
}

bool ShouldLaunch(const DistFlags& d) {
  return d.nproc_per_node > 0 && std::getenv("GLOSSA_LAUNCHED") == nullptr;
}

int LaunchWorkers(const DistFlags& d, const std::vector<std::string>& args) {
  if (std::getenv("WORLD_SIZE") != nullptr && std::getenv("GLOSSA_LAUNCHED") == nullptr) {
    throw InvalidArgumentError(
        "--nproc_per_node starts the workers itself, but WORLD_SIZE is already set (a launcher "
        "such as torchrun started this process): drop one of the two");
  }
  // A mesh that does not fit the ranks would fail in each of them after they started (and the
  // others would wait for it): refuse it here, before any rank starts.
  if (!d.mesh.empty()) ParseMesh(d.mesh, static_cast<int>(d.nproc_per_node));
  LaunchOptions lo;
  lo.argv = SelfCommand();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("--nproc_per_node=", 0) == 0) continue;
    if (args[i] == "--nproc_per_node") {
      ++i;
      continue;
    }
    lo.argv.push_back(args[i]);
  }
  lo.nproc = static_cast<int>(d.nproc_per_node);
  if (!d.master_addr.empty()) lo.master_addr = d.master_addr;
  lo.master_port = static_cast<int>(d.master_port);
  // The survivors of a failed rank say what they saw within a few seconds when it crashed; a
  // rank that hangs (stopped, deadlocked) is ended after this grace rather than its timeout.
  lo.grace_seconds = 5;
  return LaunchLocalWorkers(lo);
}

void LoadLibraries(const std::vector<std::string>& paths) {
  std::vector<std::pair<std::string, std::string>> all;  // (path, where it was named)
  if (const char* env = std::getenv("GLOSSA_LIBRARIES"); env != nullptr) {
    for (const auto& part : Split(env, ':')) {
      if (!part.empty()) all.emplace_back(part, "GLOSSA_LIBRARIES");
    }
  }
  for (const auto& p : paths) all.emplace_back(p, "--load_library");
  static std::set<std::string>* loaded = new std::set<std::string>;
  for (const auto& [path, from] : all) {
    if (path.empty()) throw InvalidArgumentError(StrCat(from, ": an empty path"));
    if (!FileExists(path)) {
      throw NotFoundError(StrCat(from, ": the library '", path, "' does not exist"));
    }
    // dlopen searches the library path for a bare name: the file named is the one loaded.
    const std::string abs = path.find('/') == std::string::npos ? "./" + path : path;
    if (!loaded->insert(abs).second) continue;
    const size_t models = ModelKeys().size(), classes = ClassRegistry::Keys().size();
    dlerror();
    if (dlopen(abs.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      const char* why = dlerror();
      throw InvalidArgumentError(
          StrCat(from, ": cannot load '", path, "': ", why != nullptr ? why : "dlopen failed"));
    }
    if (ModelKeys().size() == models && ClassRegistry::Keys().size() == classes) {
      throw InvalidArgumentError(StrCat(
          from, ": '", path,
          "' registered no Glossa model or class: not a library built against Glossa "
          "(GLOSSA_REGISTER_MODEL / GLOSSA_REGISTER_CLASS in it, linked with glossa::glossa?), "
          "or one this process already has"));
    }
  }
}

Params ModelParamsFromFlags(const ModelFlags& f, bool training) {
  Params p = GetModelParams(f.model, f.dataset, f.override_text, f.override_file);
  SetCheckNumerics(f.enable_check_numerics);
  if (!f.model_task_name.empty()) SelectModelTask(p, f.model_task_name, training);
  if (f.use_trained_params && !f.logdir.empty()) {
    std::string text = f.override_text.empty() ? std::string() : OverrideText(f.override_text);
    if (!f.override_file.empty() && FileExists(f.override_file)) {
      text += "\n" + ReadFileToString(f.override_file, 64 << 20);
    }
    for (const auto& note : ApplyTrainedParams(p, f.logdir, OverrideKeys(text),
                                               f.allow_params_change)) {
      NoteOnce(note);
    }
  }
  {
    // The dataset reads what `datasets` says (after a run: the run's, so that a run trained on
    // one's own text is evaluated on that text's Dev, not on the registered corpus); unset, the
    // error names the key.
    std::string text = f.override_text.empty() ? std::string() : OverrideText(f.override_text);
    if (!f.override_file.empty() && FileExists(f.override_file)) {
      text += "\n" + ReadFileToString(f.override_file, 64 << 20);
    }
    ResolveDatasetInput(p, f.dataset, OverrideKeys(text));
    if (training) RefuseTrainingOnMixedData(f.model, p, OverrideKeys(text));
  }
  if (!f.checkpoint.empty()) {
    std::string prefix;
    try {
      prefix = ResolveCheckpoint(f.checkpoint, "");
    } catch (const NotFoundError& e) {
      throw NotFoundError(StrCat("--checkpoint: ", e.message()));
    }
    p.Set(MainTaskPath(p) + ".eval.load_checkpoint_from", prefix);
  }
  const ParamValue& fprop = p.Get("task.fprop_dtype");
  CheckIntraOpThreads(f.intra_op_threads);
  ApplyKernelFlags(f.kernels);
  ConfigureCpuRuntime(static_cast<int>(f.intra_op_threads),
                      !fprop.is_none() && fprop.AsDType() == DType::kBFloat16);
  if (f.max_steps >= 0) p.Set("task.train.max_steps", f.max_steps);
  // The docs test (tests/tools/docs_test.py) runs every documented command with training cut short.
  if (const char* cap = std::getenv("GLOSSA_DOCS_MAX_STEPS"); cap != nullptr && *cap != '\0') {
    char* end = nullptr;
    const long long n = std::strtoll(cap, &end, 10);
    if (*end != '\0' || n < 1) {
      throw InvalidArgumentError(
          StrCat("GLOSSA_DOCS_MAX_STEPS='", cap, "' must be an integer >= 1"));
    }
    if (p.GetInt("task.train.max_steps") > n) {
      NoteOnce(StrCat("GLOSSA_DOCS_MAX_STEPS=", n, ": max_steps ", p.GetInt("task.train.max_steps"),
                      " cut to ", n));
      p.Set("task.train.max_steps", static_cast<int64_t>(n));
    }
  }
  if (f.saver_max_to_keep >= 0) p.Set("task.train.save_max_to_keep", f.saver_max_to_keep);
  if (f.keep_every_n_hours >= 0)
    p.Set("task.train.save_keep_checkpoint_every_n_hours", f.keep_every_n_hours);
  if (f.random_seed >= 0) {
    p.Set("random_seed", f.random_seed);
    p.Set("task.random_seed", f.random_seed);
  }
  return p;
}

}  // namespace cli
}  // namespace glossa
