// `glossa report`: the latest checkpoint's report (the task's Report hook: eval metrics, samples,
// an LM's unigram baseline, the jobs' best steps), or with --html a self-contained HTML report of
// one or more runs (glossa/report/html_report.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/report/html_report.h"
#include "glossa/report/text_report.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

// The text report (glossa/report/text_report.h) of the run f.logdir on f.dataset.
std::string ReportText(const ModelFlags& f, int64_t num_samples) {
  TextReportOptions o;
  o.model_key = f.model;
  o.dataset = f.dataset;
  o.logdir = f.logdir;
  o.num_samples = num_samples;
  o.train_params = [f] {
    ModelFlags train_flags = f;
    train_flags.dataset = "Train";
    return ModelParamsFromFlags(train_flags);
  };
  return RenderTextReport(ModelParamsFromFlags(f), o);
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
