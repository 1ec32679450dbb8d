// `glossa report`: the latest checkpoint's report (the task's Report hook: eval metrics, samples,
// an LM's unigram baseline, the jobs' best steps), or with --html a self-contained HTML report of
// one or more runs (glossa/report/html_report.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/input/input_generator.h"
#include "glossa/model/base_model.h"
#include "glossa/optim/ema.h"
#include "glossa/checkpoint/checkpointer.h"
#include "glossa/report/html_report.h"
#include "glossa/runtime/jobs.h"
#include "glossa/model/metric_history.h"
#include "glossa/runtime/program.h"
#include "glossa/checkpoint/saver.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

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
    for (const auto& [metric, b] : ReadBestStepFiles(ProgramDir(kind, f.logdir, f.dataset))) {
      out += StrCat("best ", metric, " on ", f.dataset, " (",
                    kind == JobKind::kEval ? "evaler" : "decoder", " job, ",
                    b.minimize ? "lower" : "higher", " is better): ", b.value, " at step ",
                    b.best_step, "; last step ", b.last_step, "\n");
    }
  }
  return out;
}

class ReportCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand("report",
                                 "The latest checkpoint's report (the task's Report hook): eval "
                                 "metrics and samples; LMs add a unigram baseline.");
    AddModelFlags(c, f_, false, "Dev");
    AddFollowerFlags(c, f_);
    // --logdir may repeat with --html (runs overlaid); --model is then optional (the headline).
    c->remove_option(c->get_option("--logdir"));
    c->get_option("--model")->required(false);
    c->add_option("--logdir", logdirs_, "The log directory; with --html, repeat it to overlay runs.")
        ->required();
    c->add_option("--html", html_,
                  "Write a self-contained HTML report (training curves, eval and decoder metrics "
                  "with best steps, the model, samples) to this file.");
    c->add_option("--num_samples", samples_, "Sampled continuations to print.")
        ->capture_default_str();
    return c;
  }

  int Run(const CommandContext& ctx) override {
    f_.logdir = logdirs_.front();
    // Every run is checked before any work (the headline evaluates the first run).
    for (const auto& dir : logdirs_) {
      if (!FileExists(dir)) throw NotFoundError(StrCat("report: no logdir '", dir, "'"));
    }
    if (html_.empty()) {
      if (f_.model.empty()) throw InvalidArgumentError("report: --model is required");
      if (logdirs_.size() > 1) throw InvalidArgumentError("report: several --logdir need --html");
      std::printf("%s", ReportText(f_, samples_).c_str());
      std::fflush(stdout);
      return 0;
    }
    HtmlReportOptions ho;
    ho.logdirs = logdirs_;
    ho.version = GLOSSA_VERSION_STRING;
    for (size_t i = 0; i < ctx.argv.size(); ++i) ho.command_line += StrCat(i ? " " : "", ctx.argv[i]);
    // The task's headline (its Report hook) on the first run's latest checkpoint.
    if (!f_.model.empty()) ho.headline = ReportText(f_, samples_);
    const std::string html = RenderHtmlReport(ho);
    AtomicWriteFile(html_, html);
    std::cout << "wrote " << html_ << " (" << html.size() << " bytes, " << logdirs_.size()
              << " run(s))\n";
    return 0;
  }

 private:
  ModelFlags f_;
  std::vector<std::string> logdirs_;
  std::string html_;
  int64_t samples_ = 5;
};
GLOSSA_REGISTER_COMMAND(ReportCommand, 120);

}  // namespace
}  // namespace cli
}  // namespace glossa
