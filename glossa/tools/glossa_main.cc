// The `glossa` command-line program.
//
//   glossa list                               # registered classes
//   glossa inspect_params <key>               # a class's params with their docs
//   glossa inspect_params <key> --params_file=f.txt --params_override='dim : 8; act : "RELU"'
//   glossa list_models                        # registered model params classes
//   glossa inspect_model --model=lm.austen.TransformerLmTiny   # params text and variables
//   glossa train --model=lm.austen.TransformerLmTiny --logdir=/tmp/austen
//   glossa eval --model=... --logdir=... --dataset=Dev [--once]    # the evaler job
//   glossa decode --model=... --logdir=... --dataset=Dev [--once]  # the decoder job
//   glossa report --model=... --logdir=... --dataset=Dev           # the task's Report hook
//   glossa bleu --ref=test.es --hyp=out.es                          # corpus BLEU
//   --flagfile=f: one --flag=value per line, expanded in place.
//
// Errors print one line naming what was wrong and exit non-zero.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <glog/logging.h>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/params.h"
#include "glossa/core/registry.h"
#include "glossa/inference/bundle.h"
#include "glossa/inference/json_io.h"
#include "glossa/inference/predictor.h"
#include "glossa/inference/server.h"
#include "glossa/io/safetensors.h"
#include "glossa/metrics/bleu.h"
#include "glossa/model/model_registry.h"
#include "glossa/optim/learner.h"
#include "glossa/optim/ema.h"
#include "glossa/runtime/checkpointer.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/launcher.h"
#include "glossa/runtime/executor.h"
#include "glossa/runtime/html_report.h"
#include "glossa/runtime/jobs.h"
#include "glossa/tools/cli.h"
#include "glossa/runtime/program.h"
#include "glossa/runtime/saver.h"
#include "glossa/runtime/trained_params.h"

namespace glossa {
namespace {


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

std::atomic<bool> g_stop{false};
// How workers re-run this command (RunCli's CliOptions::self_command).
std::vector<std::string>& SelfCommand() {
  static std::vector<std::string> command{"/proc/self/exe"};
  return command;
}
Executor* g_executor = nullptr;

extern "C" void HandleStopSignal(int) {
  g_stop.store(true);
  if (g_executor != nullptr) g_executor->RequestStop();
}

void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = HandleStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// Expands --flagfile=<file> (one flag per line; '#' comments) in place, recursively.
std::vector<std::string> ExpandFlagfiles(const std::vector<std::string>& args, int depth = 0) {
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

struct ModelFlags {
  std::string model, logdir, dataset = "Train", override_text, override_file;
  int64_t max_steps = -1, saver_max_to_keep = -1, intra_op_threads = 0;
  int64_t random_seed = -1;  // -1: not given (a given value is checked to be >= 0)
  std::string model_task_name, checkpoint;
  bool enable_check_numerics = false;
  std::vector<std::string> part_regex;
  int64_t topn = 0;
  double keep_every_n_hours = -1;
  bool once = false;
  // Jobs that follow a run (eval, decode, export, report) build the model it was trained with
  // (runtime/trained_params.h); --allow_params_change lets overrides differ from it.
  bool use_trained_params = false, allow_params_change = false, wait_for_train = false;
  std::string flagfile_help;  // --flagfile is expanded before parsing; declared for --help
};

// Says a note once per process (report reads the Params twice).
void NoteOnce(const std::string& note) {
  static std::set<std::string> said;
  if (!said.insert(note).second) return;
  std::cerr << "glossa: " << note << std::endl;
}

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
};

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
             "The rendezvous port (default: MASTER_PORT; with --nproc_per_node, a free one).");
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
  return std::make_unique<Distributed>(*o);
}

// --nproc_per_node: runs this command again as that many workers, without the flag.
int LaunchWorkers(const DistFlags& d, const std::vector<std::string>& args) {
  if (std::getenv("WORLD_SIZE") != nullptr && std::getenv("GLOSSA_LAUNCHED") == nullptr) {
    throw InvalidArgumentError(
        "--nproc_per_node starts the workers itself, but WORLD_SIZE is already set (a launcher "
        "such as torchrun started this process): drop one of the two");
  }
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

Params ModelParamsFromFlags(const ModelFlags& f, bool training = false) {
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
  if (!f.checkpoint.empty()) {
    std::string prefix = f.checkpoint;
    for (const std::string suffix : {".safetensors.index.json", ".safetensors"}) {
      if (prefix.size() > suffix.size() &&
          prefix.compare(prefix.size() - suffix.size(), suffix.size(), suffix) == 0) {
        prefix.resize(prefix.size() - suffix.size());
      }
    }
    const std::string dir = prefix.rfind('/') == std::string::npos
                                ? std::string(".")
                                : prefix.substr(0, prefix.rfind('/') + 1);
    if (!FileExists(dir) || SafetensorsFiles(prefix).empty()) {
      throw NotFoundError(StrCat("--checkpoint: no checkpoint files at '", prefix, "'"));
    }
    p.Set(p.Contains("task") ? "task.eval.load_checkpoint_from"
                             : StrCat("task_params.", p.GetString("main_task"),
                                      ".eval.load_checkpoint_from"),
          prefix);
  }
  const ParamValue& fprop = p.Get("task.fprop_dtype");
  CheckIntraOpThreads(f.intra_op_threads);
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

// Loads the latest checkpoint of <logdir>/train into a model built for `f.dataset` (EMA shadows
// when the model keeps them).
std::unique_ptr<BaseModel> LoadLatestForEval(const Params& p, const std::string& logdir,
                                             int64_t* step) {
  auto model = InstantiateLayer<BaseModel>(p);
  const std::string train_dir = JoinPath(logdir, "train");
  auto latest = Saver::LatestCheckpoint(train_dir);
  if (!latest)
    throw NotFoundError(StrCat("no checkpoint in ", train_dir, " (run `glossa train` first)"));
  const std::shared_ptr<ExponentialMovingAverage> ema = MakeModelEma(*model);
  const std::optional<int64_t> global_step =
      RestoreForEval(LoadCheckpoint(*latest), *model, ema.get());
  if (!global_step) throw DataLossError(StrCat(*latest, ": checkpoint has no global_step"));
  *step = *global_step;
  return model;
}

// `report`: the task's Report hook on the latest checkpoint, given the eval metrics on
// f.dataset, one decoded batch (when the task decodes) and a way to read Train once.
std::string ReportText(const ModelFlags& f, int64_t num_samples) {
  Params p = ModelParamsFromFlags(f);
  int64_t step = 0;
  auto model = LoadLatestForEval(p, f.logdir, &step);
  BaseTask::ReportInputs in;
  in.model_key = f.model;
  in.dataset = f.dataset;
  in.global_step = step;
  in.num_samples = num_samples;
  in.eval_metrics = EvalProgram(*model, nullptr).Run(step);
  try {
    in.decode_lines = DecodeProgram(*model, nullptr).Run(step, 1).lines;
  } catch (const UnimplementedError&) {  // a task without Decode reports its metrics only
  }
  const std::string input_path = EvalTaskParamsPath(*model) + ".input";
  in.train_input = [f, input_path]() {
    ModelFlags train_flags = f;
    train_flags.dataset = "Train";
    Params ip = ModelParamsFromFlags(train_flags).GetParams(input_path).Copy();
    if (ip.Contains("repeat_count")) ip.Set("repeat_count", 1);
    if (ip.Contains("require_sequential_order")) ip.Set("require_sequential_order", true);
    return InstantiateLayer<BaseInputGenerator>(ip);
  };
  std::string out = model->task().Report(in);
  // The best steps the evaler and decoder jobs tracked on this dataset (best-<metric>.txt).
  for (JobKind kind : {JobKind::kEval, JobKind::kDecode}) {
    const std::string dir = ProgramDir(kind, f.logdir, f.dataset);
    if (!FileExists(dir)) continue;
    for (const std::string& name : ListDirectory(dir)) {
      if (name.rfind("best-", 0) != 0 || name.size() < 9 ||
          name.substr(name.size() - 4) != ".txt") {
        continue;
      }
      std::map<std::string, std::string> fields;
      for (const auto& line : Split(ReadFileToString(JoinPath(dir, name), 1 << 16), '\n')) {
        const size_t colon = line.find(": ");
        if (colon != std::string_view::npos) {
          fields[std::string(line.substr(0, colon))] = std::string(line.substr(colon + 2));
        }
      }
      out += StrCat("best ", name.substr(5, name.size() - 9), " on ", f.dataset, " (",
                    kind == JobKind::kEval ? "evaler" : "decoder", " job, ",
                    fields["minimize"] == "True" ? "lower" : "higher", " is better): ",
                    fields["value"], " at step ", fields["best_step"], "; last step ",
                    fields["last_step"], "\n");
    }
  }
  return out;
}

int Report(const ModelFlags& f, int64_t num_samples) {
  std::printf("%s", ReportText(f, num_samples).c_str());
  std::fflush(stdout);
  return 0;
}

// `bleu`: corpus BLEU of two line-aligned files, printed as BLEU = 100 x score with the n-gram
// statistics (as Lingvo's decoder reports it).
int Bleu(const std::string& ref, const std::string& hyp, int max_ngram,
         const std::string& separator_type) {
  CheckRegularFile(ref, "--ref");
  CheckRegularFile(hyp, "--hyp");
  std::ifstream r(ref), h(hyp);
  BleuScorer scorer(max_ngram, separator_type);
  std::string rl, hl;
  int64_t line = 0;
  for (;;) {
    const bool more_r = static_cast<bool>(std::getline(r, rl));
    const bool more_h = static_cast<bool>(std::getline(h, hl));
    if (!more_r && !more_h) break;
    ++line;
    if (more_r != more_h) {
      throw InvalidArgumentError(StrCat(more_r ? hyp : ref, " ends at line ", line - 1, " but ",
                                        more_r ? ref : hyp, " goes on: the files must align"));
    }
    scorer.AddSentence(rl, hl);
  }
  if (line == 0) throw InvalidArgumentError(StrCat("--ref '", ref, "' is empty"));
  std::vector<std::string> precisions;
  for (int i = 0; i < max_ngram; ++i) {
    precisions.push_back(StrCat(scorer.matches()[i], "/", scorer.counts()[i]));
  }
  std::printf("BLEU = %.2f (%lld sentences; n-gram matches %s; hyp/ref tokens %lld/%lld)\n",
              100 * scorer.ComputeOverallScore(), static_cast<long long>(line),
              Join(precisions, " ").c_str(), static_cast<long long>(scorer.num_hyp_tokens()),
              static_cast<long long>(scorer.num_ref_tokens()));
  return 0;
}

// `predict`: JSON lines (one example per line: {"feed": value, ...}), or plain text lines when the
// subgraph has a single string feed, through the Predictor in batches of `batch_size`; one JSON
// object of fetches per input line (row i of each batched fetch).
struct PredictFlags {
  std::string bundle, subgraph = "default", input, output, input_format = "auto";
  int64_t batch_size = 32, max_line_bytes = 1 << 20, max_new_tokens = 512;
};

// A write, flush or close that failed is Aborted naming the output: a full disk or a closed pipe
// never ends a run that looks complete.
void CheckOutput(std::ostream& out, const std::string& name) {
  if (!out.good()) {
    throw AbortedError(StrCat("cannot write ", name, ": ", errno != 0 ? std::strerror(errno)
                                                                      : "write error"));
  }
}

int Predict(const PredictFlags& f) {
  PredictorOptions po;
  po.subgraphs = {f.subgraph};
  po.max_new_tokens = f.max_new_tokens;
  Predictor predictor(f.bundle, po);
  const InferenceSubgraphSpec spec = predictor.ListSubgraphs().at(f.subgraph);
  std::vector<std::string> string_feeds;
  for (const auto& [name, s] : spec.feeds) {
    if (s.dtype == "string") string_feeds.push_back(name);
  }
  const bool plain_text_ok = string_feeds.size() == 1;
  // auto: a line that starts with '{' is JSON, any other a text line; text and json hold for
  // every line (text that may start with '{' needs --input_format=text).
  const std::string& format = f.input_format;
  if (format == "text" && !plain_text_ok) {
    throw InvalidArgumentError(StrCat("--input_format=text: subgraph '", f.subgraph, "' has ",
                                      string_feeds.size(),
                                      " string feeds; text lines need exactly one (use json)"));
  }
  std::ifstream in_file;
  if (!f.input.empty()) {
    CheckRegularFile(f.input, "--input");
    in_file.open(f.input);
  }
  std::istream& in = f.input.empty() ? std::cin : in_file;
  std::ofstream out_file;
  if (!f.output.empty()) {
    out_file.open(f.output, std::ios::trunc);
    if (!out_file) throw AbortedError(StrCat("--output: cannot write '", f.output, "'"));
  }
  std::ostream& out = f.output.empty() ? std::cout : out_file;
  const std::string out_name = f.output.empty() ? "stdout" : StrCat("'", f.output, "'");
  const std::string source = f.input.empty() ? "stdin" : f.input;
  // A batch: examples with the same non-string feeds (options such as max_new_tokens).
  std::vector<std::map<std::string, std::string>> batch_strings;
  std::string batch_options;
  InferenceMap options;
  auto flush = [&]() {
    if (batch_strings.empty()) return;
    InferenceMap feeds = options;
    for (const auto& name : string_feeds) {
      std::vector<std::string> column;
      bool any = false;
      for (const auto& ex : batch_strings) {
        auto it = ex.find(name);
        any = any || it != ex.end();
        column.push_back(it == ex.end() ? std::string() : it->second);
      }
      if (any) feeds[name] = InferenceValue::Strings(std::move(column));
    }
    const InferenceMap fetches = predictor.Run(f.subgraph, feeds);
    // Per-token fetches [B, T] are cut to each example's length (json_io.h).
    for (size_t i = 0; i < batch_strings.size(); ++i) {
      const nlohmann::ordered_json row = FetchRowToJson(fetches, static_cast<int64_t>(i));
      out << row.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    }
    errno = 0;
    out.flush();
    CheckOutput(out, out_name);
    batch_strings.clear();
  };
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (static_cast<int64_t>(line.size()) > f.max_line_bytes) {
      throw InvalidArgumentError(StrCat(source, ":", line_no, ": line of ", line.size(),
                                        " bytes is longer than --max_line_bytes=",
                                        f.max_line_bytes));
    }
    std::map<std::string, std::string> strings;
    InferenceMap line_options;
    std::string options_key;
    const bool json_line = format == "json" || (format == "auto" && !line.empty() && line[0] == '{');
    if (!json_line) {
      if (!plain_text_ok) {
        throw InvalidArgumentError(StrCat(source, ":", line_no, ": expected a JSON object ",
                                          "(subgraph '", f.subgraph, "' has ",
                                          string_feeds.size(), " string feeds)"));
      }
      strings[string_feeds[0]] = line;
    } else {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw InvalidArgumentError(StrCat(source, ":", line_no, ": not valid JSON: ", e.what(),
                                          plain_text_ok && format == "auto"
                                              ? " (a text line starting with '{'? use "
                                                "--input_format=text)"
                                              : ""));
      }
      if (!j.is_object()) {
        throw InvalidArgumentError(
            StrCat(source, ":", line_no, ": expected a JSON object of feeds, got ", j.type_name()));
      }
      for (auto it = j.begin(); it != j.end(); ++it) {
        auto s = spec.feeds.find(it.key());
        if (s == spec.feeds.end()) {
          std::vector<std::string> names;
          for (const auto& [n, v] : spec.feeds) names.push_back(n);
          throw InvalidArgumentError(StrCat(source, ":", line_no, ": unknown feed '", it.key(),
                                            "' (feeds: ", Join(names, ", "), ")"));
        }
        const TensorSpec& ts = s->second;
        if (ts.dtype == "string") {
          if (!it.value().is_string()) {
            throw InvalidArgumentError(
                StrCat(source, ":", line_no, ": feed '", it.key(), "' must be a string"));
          }
          strings[it.key()] = it.value().get<std::string>();
        } else if (ts.rank == 0 && it.value().is_number()) {
          if (ts.dtype == "int64" && !it.value().is_number_integer()) {
            throw InvalidArgumentError(StrCat(source, ":", line_no, ": feed '", it.key(),
                                              "' must be an integer, got ", it.value().dump()));
          }
          line_options[it.key()] = InferenceValue::Of(
              ts.dtype == "int64"
                  ? at::scalar_tensor(it.value().get<int64_t>(), at::kLong)
                  : at::scalar_tensor(it.value().get<double>(), at::kDouble).to(at::kFloat));
          options_key += it.key() + "=" + it.value().dump() + ";";
        } else {
          throw InvalidArgumentError(StrCat(source, ":", line_no, ": feed '", it.key(), "' must be a ",
                                            ts.rank == 0 ? "number" : "string"));
        }
      }
    }
    if (!batch_strings.empty() &&
        (options_key != batch_options ||
         static_cast<int64_t>(batch_strings.size()) >= f.batch_size)) {
      flush();
    }
    if (batch_strings.empty()) {
      batch_options = options_key;
      options = line_options;
    }
    batch_strings.push_back(std::move(strings));
    if (static_cast<int64_t>(batch_strings.size()) >= f.batch_size) {
      try {
        flush();
      } catch (const Error& e) {
        ThrowError(e.code(), StrCat(source, " (the batch ending at line ", line_no, "): ",
                                    e.message()));
      }
    }
  }
  if (in.bad()) throw DataLossError(StrCat("cannot read ", source, " after line ", line_no));
  try {
    flush();
  } catch (const Error& e) {
    ThrowError(e.code(), StrCat(source, " (the batch ending at line ", line_no, "): ", e.message()));
  }
  if (out_file.is_open()) {
    errno = 0;
    out_file.close();
    if (out_file.fail()) {
      throw AbortedError(StrCat("cannot close ", out_name, ": ",
                                errno != 0 ? std::strerror(errno) : "write error"));
    }
  } else {
    errno = 0;
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      throw AbortedError(StrCat("cannot write stdout: ", std::strerror(errno)));
    }
  }
  return 0;
}

// `serve`: the bundle's subgraphs over HTTP until SIGTERM or SIGINT, which stop accepting, finish
// the requests in flight and exit 0.
struct ServeFlags {
  std::string bundle, checkpoint, port_file;
  std::vector<std::string> subgraphs;
  ServeOptions options;
  int64_t port = 0, max_batch_size = 32, batch_timeout_micros = 0, max_enqueued = 256;
  int64_t batch_threads = 1, max_body_bytes = 4 << 20, intra_op_threads = 0;
  int64_t max_input_tokens = 4096, max_new_tokens = 512;
  int64_t max_connections = 512, max_connections_per_client = 128;
  double header_timeout_secs = 10, body_timeout_secs = 60;
  bool no_batching = false;
};

int Serve(ServeFlags& f) {
  // Block the stop signals in every thread; this one waits for them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  CheckIntraOpThreads(f.intra_op_threads);
  ConfigureCpuRuntime(static_cast<int>(f.intra_op_threads), false);
  PredictorOptions po;
  po.subgraphs = f.subgraphs;
  po.checkpoint = f.checkpoint;
  po.max_input_tokens = f.max_input_tokens;
  po.max_new_tokens = f.max_new_tokens;
  po.max_batch_size = std::max<int64_t>(f.max_batch_size, po.max_batch_size);
  Predictor predictor(f.bundle, po);
  ServeOptions& o = f.options;
  o.connection_limits = {.max_connections = f.max_connections,
                         .max_connections_per_client = f.max_connections_per_client,
                         .header_timeout_secs = f.header_timeout_secs,
                         .body_timeout_secs = f.body_timeout_secs};
  o.port = static_cast<int>(f.port);
  o.enable_batching = !f.no_batching;
  o.max_batch_size = f.max_batch_size;
  o.batch_timeout_micros = f.batch_timeout_micros;
  o.max_enqueued_requests = f.max_enqueued;
  o.num_batch_threads = static_cast<int>(f.batch_threads);
  o.max_body_bytes = static_cast<size_t>(f.max_body_bytes);
  InferenceServer server(&predictor, o);
  const int port = server.Start();
  std::cout << "serving " << f.bundle << " (global step " << predictor.global_step()
            << ") on http://" << o.host << ":" << port << std::endl;
  if (!f.port_file.empty()) {  // written whole, then renamed: a reader never sees half of it
    const std::string tmp = f.port_file + ".tmp";
    {
      std::ofstream pf(tmp, std::ios::trunc);
      pf << port << "\n";
      if (!pf) throw AbortedError(StrCat("--port_file: cannot write '", tmp, "'"));
    }
    if (std::rename(tmp.c_str(), f.port_file.c_str()) != 0) {
      throw AbortedError(StrCat("--port_file: cannot rename '", tmp, "' to '", f.port_file, "'"));
    }
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cout << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
            << ": finishing the requests in flight" << std::endl;
  server.Stop();
  std::cout << "stopped" << std::endl;
  return 0;
}

int Run(const std::vector<std::string>& argv) {
  CLI::App app{"Glossa: build, train, evaluate and serve neural sequence models.", "glossa"};
  app.footer(
      "Examples:\n"
      "  glossa train  --model=lm.austen.TransformerLmTiny --logdir=runs/austen_tiny\n"
      "  glossa eval   --model=lm.austen.TransformerLmTiny --logdir=runs/austen_tiny "
      "--dataset=Dev --once\n"
      "  glossa export --model=lm.austen.TransformerLmTiny --logdir=runs/austen_tiny "
      "--out=/tmp/austen && echo 'It is a truth' | glossa predict --bundle=/tmp/austen\n"
      "Every command documents its flags under `glossa <command> --help`; "
      "--flagfile=F reads --flag=value lines from F. Docs: docs/tutorial.md.");
  // Flag errors are one line, like every other error.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string(e.what()) + " (see --help)\n";
  });
  app.require_subcommand(1);
  // glog (initialised in main): its flags, given before or after the subcommand.
  std::string logtostderr = "true", vmodule;
  int64_t vlog = 0;
  app.add_option("--logtostderr", logtostderr,
                 "glog: log to stderr (true, the default) or to files in $GLOG_log_dir / /tmp.")
      ->check(CLI::IsMember({"true", "false", "1", "0"}));
  AddIntFlag(&app, "--v", vlog, 0, 100, "glog: show VLOG(n) messages up to this level.");
  app.add_option("--vmodule", vmodule,
                 "glog: per-module VLOG levels, e.g. saver=2,summary*=1.");
  app.fallthrough();

  auto* list = app.add_subcommand("list", "List the registered classes.");

  std::string key, params_file, params_override;
  auto* inspect =
      app.add_subcommand("inspect_params", "Print a registered class's params with their docs.");
  inspect->add_option("key", key, "Registry key, e.g. glossa.layers.ProjectionLayer (see list)")->required();
  inspect->add_option("--params_file", params_file, "A params text file to apply first.");
  inspect->add_option("--params_override", params_override,
                      "'key : value' lines (';' or newline separated) applied last.");

  auto* list_models = app.add_subcommand("list_models", "List the registered models.");
  ModelFlags inspect_f, train_f, eval_f, decode_f, report_f, export_f;
  auto* inspect_model =
      app.add_subcommand("inspect_model", "Print a model's params and its variables.");
  AddModelFlags(inspect_model, inspect_f, false, "Train");
  inspect_model->add_option(
      "--inspect_model_part_regex", inspect_f.part_regex,
      "name:regex (repeatable): count the params of the variables whose name matches regex as "
      "part `name`, e.g. --inspect_model_part_regex=stack:.*/stack/.*");
  AddIntFlag(inspect_model, "--inspect_model_topn", inspect_f.topn, 0, 1000000,
             "Print the topn largest variables.");
  auto* train = app.add_subcommand(
      "train", "Train a model in --logdir (resumes from its latest checkpoint).");
  AddModelFlags(train, train_f, true, "Train");
  DistFlags train_d, eval_d, decode_d;
  AddDistFlags(train, train_d, true);
  int64_t verbosity = 1, log_every_n_steps = 0;
  AddIntFlag(train, "--verbosity", verbosity, 0, 2,
             "0: no per-loop lines; 1: one concise progress line per loop (default); 2: also "
             "every metric, as Lingvo's step line.");
  AddIntFlag(train, "--log_every_n_steps", log_every_n_steps, 0, int64_t{1} << 53,
             "The progress line at most every N steps (0: every train loop).");
  auto* eval =
      app.add_subcommand("eval", "The evaler job: evaluate new checkpoints of <logdir>/train.");
  AddModelFlags(eval, eval_f, true, "Dev");
  AddDistFlags(eval, eval_d, false);
  eval->add_flag("--once", eval_f.once, "Evaluate the latest checkpoint once and exit.");
  AddFollowerFlags(eval, eval_f);
  eval->add_flag("--wait_for_train", eval_f.wait_for_train,
                 "Wait for a training run to start in --logdir (without it, a logdir with no "
                 "train/ and no control/ is an error).");
  eval->add_option("--checkpoint", eval_f.checkpoint,
                   "Evaluate this checkpoint (a prefix such as <logdir>/train/ckpt-00001000) "
                   "once and exit (task.eval.load_checkpoint_from).");
  auto* decode =
      app.add_subcommand("decode", "The decoder job: decode new checkpoints of <logdir>/train.");
  AddModelFlags(decode, decode_f, true, "Dev");
  AddDistFlags(decode, decode_d, false);
  decode->add_flag("--once", decode_f.once, "Decode the latest checkpoint once and exit.");
  AddFollowerFlags(decode, decode_f);
  decode->add_flag("--wait_for_train", decode_f.wait_for_train,
                   "Wait for a training run to start in --logdir (without it, a logdir with no "
                   "train/ and no control/ is an error).");
  decode->add_option("--checkpoint", decode_f.checkpoint,
                     "Decode this checkpoint once and exit (task.eval.load_checkpoint_from).");
  auto* export_cmd = app.add_subcommand(
      "export", "Write an inference bundle (docs/inference.md) from a checkpoint of <logdir>/train.");
  AddModelFlags(export_cmd, export_f, true, "Train");
  AddFollowerFlags(export_cmd, export_f);
  export_cmd->add_option("--checkpoint", export_f.checkpoint,
                         "The checkpoint prefix to export (default: the latest).");
  std::string export_out, export_dtype = "float32";
  std::vector<std::string> export_subgraphs;
  export_cmd->add_option("--subgraphs", export_subgraphs,
                         "Subgraphs to export, comma-separated (default: all the task declares).")
      ->delimiter(',');
  export_cmd->add_option("--out", export_out, "The bundle directory (new or empty).")->required();
  export_cmd->add_option("--dtype", export_dtype, "Weights: float32 or bfloat16.")
      ->capture_default_str();
  bool export_torchscript = false;
  export_cmd->add_flag("--torchscript", export_torchscript,
                       "Also write torchscript/network.pt (ids to log-probs) for torch.jit.load.");
  ServeFlags serve_f;
  auto* serve = app.add_subcommand(
      "serve", "Serve an inference bundle over HTTP/JSON with dynamic batching (docs/inference.md).");
  serve->add_option("--bundle", serve_f.bundle, "The bundle directory (glossa export).")
      ->required();
  serve->add_option("--host", serve_f.options.host, "The address to listen on.")
      ->capture_default_str();
  AddIntFlag(serve, "--port", serve_f.port, 0, 65535, "The port (0: a free one, printed).");
  serve->add_option("--port_file", serve_f.port_file, "Write the port to this file once listening.");
  serve->add_option("--subgraphs", serve_f.subgraphs,
                    "Subgraphs to serve, comma-separated (default: all the bundle has).")
      ->delimiter(',');
  serve->add_option("--checkpoint", serve_f.checkpoint,
                    "Serve this training checkpoint's weights instead of the bundle's.");
  serve->add_option("--watch_logdir", serve_f.options.watch_logdir,
                    "Reload the latest checkpoint of <dir>/train whenever it changes.");
  serve->add_option("--watch_interval_secs", serve_f.options.watch_interval_secs,
                    "How often to look at --watch_logdir.")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 86400.0));
  serve->add_flag("--no_batching", serve_f.no_batching,
                  "Run each request alone on its HTTP thread (no dynamic batching).");
  AddIntFlag(serve, "--max_batch_size", serve_f.max_batch_size, 1, 4096,
             "Most examples merged into one run.");
  AddIntFlag(serve, "--batch_timeout_micros", serve_f.batch_timeout_micros, 0, 3600000000,
             "How long the first request of a batch waits for others.");
  AddIntFlag(serve, "--max_enqueued_requests", serve_f.max_enqueued, 1, 1000000,
             "Requests that may wait for a batch; more are answered 503.");
  AddIntFlag(serve, "--num_batch_threads", serve_f.batch_threads, 1, 256,
             "Threads running batches.");
  AddIntFlag(serve, "--max_new_tokens", serve_f.max_new_tokens, 0, 1 << 20,
             "A generation request asking for more new tokens is answered 400 (default 512).");
  AddIntFlag(serve, "--max_connections", serve_f.max_connections, 1, 1 << 16,
             "Open connections in all (default 512): more are answered 503 and closed.");
  AddIntFlag(serve, "--max_connections_per_client", serve_f.max_connections_per_client, 1,
             1 << 16, "Open connections per client address (default 128): more are answered "
                      "503 and closed.");
  serve->add_option("--header_timeout_secs", serve_f.header_timeout_secs,
                    "A request's header must arrive within this many seconds of the "
                    "connection's open or previous answer, in total.")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  serve->add_option("--body_timeout_secs", serve_f.body_timeout_secs,
                    "A request's body must arrive within this many seconds of its header.")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  AddIntFlag(serve, "--max_body_bytes", serve_f.max_body_bytes, 1, int64_t{1} << 31,
             "Larger request bodies are answered 413.");
  AddIntFlag(serve, "--max_input_tokens", serve_f.max_input_tokens, 1, int64_t{1} << 24,
             "Longer inputs are answered 400.");
  AddIntFlag(serve, "--intra_op_threads", serve_f.intra_op_threads, 0, 1024,
             "Threads per op (0: the machine's cores).");
  PredictFlags predict_f;
  auto* predict = app.add_subcommand(
      "predict", "Run an inference bundle's subgraph on JSON lines (or text lines) from stdin or "
                 "--input; JSON lines of fetches to stdout or --output.");
  predict->add_option("--bundle", predict_f.bundle, "The bundle directory (glossa export).")
      ->required();
  predict->add_option("--subgraph", predict_f.subgraph, "The subgraph to run.")
      ->capture_default_str();
  predict->add_option("--input", predict_f.input, "Input file (default: stdin).");
  predict->add_option("--output", predict_f.output, "Output file (default: stdout).");
  AddIntFlag(predict, "--batch_size", predict_f.batch_size, 1, 65536,
             "Lines run together (default 32).");
  predict->add_option("--input_format", predict_f.input_format,
                      "text: each line is the subgraph's one string feed; json: each line is a "
                      "JSON object of feeds; auto: lines starting with '{' are JSON.")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "text", "json"}));
  AddIntFlag(predict, "--max_line_bytes", predict_f.max_line_bytes, 1, int64_t{1} << 30,
             "A longer input line is an error naming it (default 1 MiB).");
  AddIntFlag(predict, "--max_new_tokens", predict_f.max_new_tokens, 0, 1 << 20,
             "A line asking a generation for more new tokens is an error (default 512).");
  std::string bleu_ref, bleu_hyp, bleu_separator;
  int64_t bleu_max_ngram = 4;
  auto* bleu = app.add_subcommand(
      "bleu", "Corpus BLEU of a hypothesis file against a reference file, one sentence per line "
              "(Lingvo's BleuScorer, docs/mt.md).");
  bleu->add_option("--ref", bleu_ref, "The reference file.")->required();
  bleu->add_option("--hyp", bleu_hyp, "The hypothesis file (as many lines as --ref).")->required();
  bleu->add_option("--separator_type", bleu_separator,
                   "Undo subword segmentation first: '', bpe, wpm or spm.");
  AddIntFlag(bleu, "--max_ngram", bleu_max_ngram, 1, 100, "Highest n-gram order (default 4).");
  auto* report = app.add_subcommand("report",
                                    "The latest checkpoint's report (the task's Report hook): "
                                    "eval metrics and samples; LMs add a unigram baseline.");
  AddModelFlags(report, report_f, false, "Dev");
  AddFollowerFlags(report, report_f);
  // --logdir may repeat with --html (runs overlaid); --model is then optional (the headline).
  report->remove_option(report->get_option("--logdir"));
  report->get_option("--model")->required(false);
  std::vector<std::string> report_logdirs;
  report->add_option("--logdir", report_logdirs,
                     "The log directory; with --html, repeat it to overlay runs.")
      ->required();
  std::string report_html;
  report->add_option("--html", report_html,
                     "Write a self-contained HTML report (training curves, eval and decoder "
                     "metrics with best steps, the model, samples) to this file.");
  int64_t report_samples = 5;
  report->add_option("--num_samples", report_samples, "Sampled continuations to print.")
      ->capture_default_str();

  std::vector<std::string> args;
  args.assign(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
  args = ExpandFlagfiles(args);
  // `--logdir=` with nothing after '=' would take the next argument as its value.
  for (const auto& a : args) {
    if (a.size() > 3 && a.rfind("--", 0) == 0 && a.back() == '=' &&
        a.find('=') == a.size() - 1) {
      throw InvalidArgumentError(StrCat(a.substr(0, a.size() - 1), " has an empty value"));
    }
  }
  const std::vector<std::string> expanded_args = args;
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ExtrasError& e) {
    // Name the flag and the nearest ones the command has.
    const CLI::App* cmd = &app;
    for (const CLI::App* sub : app.get_subcommands()) {
      if (sub->parsed()) cmd = sub;
    }
    std::string hint;
    for (const auto& extra : app.remaining()) {  // the subcommand's extras fall through to app
      hint = FlagSuggestion(cmd, extra);
      if (!hint.empty()) break;
    }
    std::cerr << e.what() << hint << " (see " << (cmd == &app ? "" : cmd->get_name() + " ")
              << "--help)\n";
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  FLAGS_logtostderr = logtostderr == "true" || logtostderr == "1";
  FLAGS_v = static_cast<int>(vlog);
  for (const auto& spec : Split(vmodule, ',')) {
    if (spec.empty()) continue;
    const size_t eq = spec.find('=');
    char* end = nullptr;
    const long level = eq == std::string::npos ? 0 : std::strtol(spec.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || eq == 0 || end == nullptr || *end != '\0') {
      throw InvalidArgumentError(StrCat("--vmodule: expected module=level, got '", spec, "'"));
    }
    google::SetVLOGLevel(spec.substr(0, eq).c_str(), static_cast<int>(level));
  }

  if (*list_models) {
    for (const auto& k : ModelKeys()) std::cout << k << "\n";
    return 0;
  }
  if (*inspect_model) {
    Params p = ModelParamsFromFlags(inspect_f);
    std::vector<std::pair<std::string, std::regex>> parts;
    for (const auto& spec : inspect_f.part_regex) {
      const size_t colon = spec.find(':');
      if (colon == std::string::npos || colon == 0) {
        throw InvalidArgumentError(
            StrCat("--inspect_model_part_regex: expected name:regex, got '", spec, "'"));
      }
      try {
        parts.emplace_back(spec.substr(0, colon), std::regex(spec.substr(colon + 1)));
      } catch (const std::regex_error& e) {
        throw InvalidArgumentError(StrCat("--inspect_model_part_regex '", spec,
                                          "': bad regex: ", e.what()));
      }
    }
    std::cout << p.ToText() << "\n";
    auto model = InstantiateLayer<BaseModel>(p);
    std::cout << ModelAnalysis(*model);
    std::vector<std::pair<int64_t, std::string>> sizes;
    for (const auto& [info, t] : model->AllVariables()) sizes.emplace_back(t.numel(), info.full_name);
    for (const auto& [name, re] : parts) {
      int64_t n = 0;
      for (const auto& [numel, var] : sizes) {
        if (std::regex_match(var, re)) n += numel;
      }
      std::cout << "#params of " << name << ": " << n << "\n";
    }
    if (inspect_f.topn > 0) {
      std::stable_sort(sizes.begin(), sizes.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      std::cout << "top " << inspect_f.topn << " variables by size:\n";
      for (int64_t i = 0; i < std::min<int64_t>(inspect_f.topn, sizes.size()); ++i) {
        std::cout << "  " << sizes[i].second << "    " << sizes[i].first << "\n";
      }
    }
    return 0;
  }
  if (*train) {
    if (train_d.nproc_per_node > 0 && std::getenv("GLOSSA_LAUNCHED") == nullptr) {
      return LaunchWorkers(train_d, expanded_args);
    }
    Params p = ModelParamsFromFlags(train_f, /*training=*/true);
    InstallStopHandlers();  // before the rendezvous: a stop then ends the run cleanly
    const std::unique_ptr<Distributed> dist = JoinWorkers(train_d);
    ExecutorOptions eo;
    eo.logdir = train_f.logdir;
    eo.distributed = dist.get();
    eo.grad_bucket_bytes = static_cast<int64_t>(train_d.bucket_mb * (1 << 20));
    eo.overlap_grad_reduce = !train_d.no_overlap;
    eo.verbosity = static_cast<int>(verbosity);
    eo.log_every_n_steps = log_every_n_steps;
    if (dist && dist->rank() != 0) {
      // Rank 0 speaks for the job; the others say what they are and then only fail loudly.
      std::printf("rank %d of %d: training on input shard %d\n", dist->rank(),
                  dist->world_size(), dist->rank());
      std::fflush(stdout);
      eo.log = [](const std::string&) {};
    }
    for (const auto& ds : p.Get("program_schedule.eval_dataset_names").AsList()) {
      ModelFlags df = train_f;
      df.dataset = ds.AsString();
      eo.dataset_params[df.dataset] = ModelParamsFromFlags(df, /*training=*/true);
    }
    Executor ex(p, eo);
    g_executor = &ex;
    if (g_stop.load()) ex.RequestStop();
    ex.Run();
    g_executor = nullptr;
    return 0;
  }
  if (*eval || *decode) {
    const bool is_eval = static_cast<bool>(*eval);
    ModelFlags& f = is_eval ? eval_f : decode_f;
    const DistFlags& d = is_eval ? eval_d : decode_d;
    if (d.nproc_per_node > 0 && std::getenv("GLOSSA_LAUNCHED") == nullptr) {
      return LaunchWorkers(d, expanded_args);
    }
    Params p = ModelParamsFromFlags(f);
    InstallStopHandlers();
    const std::unique_ptr<Distributed> dist = JoinWorkers(d);
    if (f.once) {
      const std::string train_dir = JoinPath(f.logdir, "train");
      const CheckpointState existing = ExistingCheckpoints(train_dir);
      if (existing.model_checkpoint_path.empty())
        throw NotFoundError(StrCat("no checkpoint in ", train_dir));
      p.Set("task.eval.start_eval_after", 0);
      p.Set("task.eval.start_decoder_after", 0);
      p.Set("task.eval.eval_all_checkpoints", false);
      p.Set("task.eval.decode_all_checkpoints", false);
      // Treat the latest checkpoint as the last one.
      const std::string& latest = existing.model_checkpoint_path;
      p.Set("task.train.max_steps", std::stoll(latest.substr(latest.rfind('-') + 1)));
    }
    JobOptions o;
    o.logdir = f.logdir;
    o.dataset = f.dataset;
    o.stop = &g_stop;
    o.distributed = dist.get();
    o.wait_for_train = f.wait_for_train;
    o.once = f.once;
    if (dist && dist->rank() != 0) o.log = [](const std::string&) {};
    RunCheckpointJob(is_eval ? JobKind::kEval : JobKind::kDecode, p, o);
    return 0;
  }
  if (*predict) return Predict(predict_f);
  if (*serve) return Serve(serve_f);
  if (*export_cmd) {
    ModelFlags f = export_f;
    const std::string checkpoint = f.checkpoint;
    f.checkpoint.clear();  // not an eval override here
    Params p = ModelParamsFromFlags(f);
    std::string ckpt = checkpoint;
    if (ckpt.empty()) {
      const std::string train_dir = JoinPath(f.logdir, "train");
      auto latest = Saver::LatestCheckpoint(train_dir);
      if (!latest) throw NotFoundError(StrCat("no checkpoint in ", train_dir));
      ckpt = *latest;
    }
    const int64_t step =
        ExportBundle({.model_params = p, .checkpoint = ckpt, .out_dir = export_out,
                      .dtype = export_dtype, .subgraphs = export_subgraphs,
                      .torchscript = export_torchscript,
                      .log = [](const std::string& l) { std::cout << l << std::endl; }});
    std::cout << "exported " << ckpt << " (step " << step << ") to " << export_out << "\n";
    return 0;
  }
  if (*bleu) return Bleu(bleu_ref, bleu_hyp, static_cast<int>(bleu_max_ngram), bleu_separator);
  if (*report) {
    report_f.logdir = report_logdirs.front();
    // Every run is checked before any work (the headline evaluates the first run).
    for (const auto& dir : report_logdirs) {
      if (!FileExists(dir)) throw NotFoundError(StrCat("report: no logdir '", dir, "'"));
    }
    if (report_html.empty()) {
      if (report_f.model.empty()) throw InvalidArgumentError("report: --model is required");
      if (report_logdirs.size() > 1) {
        throw InvalidArgumentError("report: several --logdir need --html");
      }
      return Report(report_f, report_samples);
    }
    HtmlReportOptions ho;
    ho.logdirs = report_logdirs;
    ho.version = GLOSSA_VERSION_STRING;
    for (size_t i = 0; i < argv.size(); ++i) ho.command_line += StrCat(i ? " " : "", argv[i]);
    if (!report_f.model.empty()) {
      // The task's headline (its Report hook) on the first run's latest checkpoint.
      ho.headline = ReportText(report_f, report_samples);
    }
    const std::string html = RenderHtmlReport(ho);
    AtomicWriteFile(report_html, html);
    std::cout << "wrote " << report_html << " (" << html.size() << " bytes, "
              << report_logdirs.size() << " run(s))\n";
    return 0;
  }

  if (*list) {
    auto keys = ClassRegistry::Keys();
    if (keys.empty()) std::cout << "(no classes registered)\n";
    for (const auto& k : keys) {
      std::cout << k << "  (" << ClassRegistry::Get(k).type_name << ")\n";
    }
    return 0;
  }
  if (*inspect) {
    const auto& entry = ClassRegistry::Get(key);
    if (!entry.default_params) {
      throw FailedPreconditionError(StrCat("class '", key, "' declares no static Params()"));
    }
    Params p = entry.default_params();
    if (!params_file.empty()) {
      try {
        if (!FileExists(params_file)) {
          throw NotFoundError(StrCat("cannot open params file '", params_file, "'"));
        }
        p.FromText(ReadFileToString(params_file, 64 << 20));
      } catch (const Error& e) {
        ThrowError(e.code(), StrCat(params_file, ": ", e.message()));
      }
    }
    if (!params_override.empty()) {
      try {
        p.FromText(OverrideText(params_override));
      } catch (const Error& e) {
        ThrowError(e.code(), StrCat("--params_override: ", e.message()));
      }
    }
    std::cout << p.ToTextWithDocs();
    return 0;
  }
  return 0;
}

}  // namespace

int RunCli(const std::vector<std::string>& argv, const CliOptions& options) {
  if (!options.self_command.empty()) SelfCommand() = options.self_command;
  // Commands that stop cleanly on SIGTERM/SIGINT take them from the start: a signal while the
  // model is built is seen by the executor or job once it runs.
  if (argv.size() > 1 && (argv[1] == "train" || argv[1] == "eval" || argv[1] == "decode")) {
    InstallStopHandlers();
  }
  try {
    return Run(argv);
  } catch (const Error& e) {
    std::cerr << "glossa: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "glossa: internal error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace glossa

namespace glossa {

std::string PythonModelFlag(const std::vector<std::string>& argv) {
  for (size_t i = 1; i < argv.size(); ++i) {
    std::string value;
    if (argv[i].rfind("--model=", 0) == 0) {
      value = argv[i].substr(8);
    } else if (argv[i] == "--model" && i + 1 < argv.size()) {
      value = argv[i + 1];
    }
    if (value.rfind("py:", 0) == 0) return value;
  }
  return "";
}

}  // namespace glossa
