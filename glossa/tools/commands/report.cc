// `glossa report`: the latest checkpoint's report (the task's Report hook: eval metrics, samples,
// an LM's unigram baseline, the jobs' best steps), or with --html a self-contained HTML report of
// one or more runs (glossa/report/html_report.h).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

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
    c->add_flag("--watch", watch_,
                "With --html: keep the file up to date, rewriting it whenever a run's events, "
                "metrics or scores change (checked every --watch_interval seconds), until "
                "SIGINT or SIGTERM: the offline way to watch training.");
    c->add_option("--watch_interval", watch_interval_, "Seconds between checks for --watch.")
        ->capture_default_str()
        ->check(CLI::Range(0.05, 3600.0));
    return c;
  }

  int Run(const CommandContext& ctx) override {
    f_.logdir = logdirs_.front();
    // Every run is checked before any work (the headline evaluates the first run).
    for (const auto& dir : logdirs_) {
      if (!FileExists(dir)) throw NotFoundError(StrCat("report: no logdir '", dir, "'"));
    }
    if (watch_ && html_.empty()) {
      throw InvalidArgumentError("report: --watch keeps an --html file up to date: give --html");
    }
    if (html_.empty()) {
      if (f_.model.empty()) throw InvalidArgumentError("report: --model is required");
      if (logdirs_.size() > 1) throw InvalidArgumentError("report: several --logdir need --html");
      std::printf("%s", ReportText(f_, samples_).c_str());
      std::fflush(stdout);
      return 0;
    }
    if (watch_) InstallStopHandlers();
    std::string seen = Fingerprint();
    WriteHtml(ctx);
    if (!watch_) return 0;
    std::cout << "watching " << Join(logdirs_, ", ") << " (every " << watch_interval_
              << " s; SIGINT or SIGTERM stops)" << std::endl;
    while (!StopFlag().load()) {
      std::this_thread::sleep_for(std::chrono::duration<double>(watch_interval_));
      const std::string now = Fingerprint();
      if (now == seen || StopFlag().load()) continue;
      seen = now;
      WriteHtml(ctx);
    }
    std::cout << "stopped watching" << std::endl;
    return 0;
  }

 private:
  // The sizes and times of what the report reads: a change means new events, metrics or scores.
  std::string Fingerprint() const {
    namespace fs = std::filesystem;
    std::string out;
    for (const auto& dir : logdirs_) {
      std::error_code ec;
      for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (!it->is_regular_file(ec)) continue;
        const std::string name = it->path().filename().string();
        if (name.rfind("events.out", 0) != 0 && name != "metrics.jsonl" &&
            name.rfind("score-", 0) != 0 && name != "params.txt" && name != "checkpoint") {
          continue;
        }
        const auto t = fs::last_write_time(it->path(), ec).time_since_epoch().count();
        out +=
            StrCat(it->path().string(), ":", it->file_size(ec), ":", static_cast<int64_t>(t), "\n");
      }
    }
    return out;
  }

  void WriteHtml(const CommandContext& ctx) const {
    HtmlReportOptions ho;
    ho.logdirs = logdirs_;
    ho.version = GLOSSA_VERSION_STRING;
    for (size_t i = 0; i < ctx.argv.size(); ++i) ho.command_line += StrCat(i ? " " : "", ctx.argv[i]);
    // The task's headline (its Report hook) on the first run's latest checkpoint.
    if (!f_.model.empty()) ho.headline = ReportText(f_, samples_);
    const std::string html = RenderHtmlReport(ho);
    AtomicWriteFile(html_, html);
    std::cout << "wrote " << html_ << " (" << html.size() << " bytes, " << logdirs_.size()
              << " run(s))" << std::endl;
  }

 public:
 private:
  ModelFlags f_;
  std::vector<std::string> logdirs_;
  std::string html_;
  int64_t samples_ = 5;
  bool watch_ = false;
  double watch_interval_ = 5;
};
GLOSSA_REGISTER_COMMAND(ReportCommand, 120);

}  // namespace
}  // namespace cli
}  // namespace glossa
