// `glossa report --html`: one self-contained HTML file (no network: inline CSS, SVG and script)
// over one or more logdirs, each a run in its own colour:
//   - training curves of every scalar in <logdir>/train's events, drawn as SVG with the raw
//     values faint and TensorBoard's debiased exponential smoothing on top (a slider changes the
//     smoothing, a checkbox the y axis between linear and log);
//   - eval and decoder metrics per checkpoint (<logdir>/eval_*/ and decoder_*/ score files), the
//     best step (best-<metric>.txt) marked;
//   - per run: the Params text (collapsible), the variable table of model_analysis.txt with its
//     total, and the latest decoder samples;
//   - the task's headline report (`glossa report`'s text, the task's Report hook) when given.
// A truncated or corrupt event file still renders: the events before the damage are drawn and
// the damage is stated on the page.
//
// Every chart is an <svg class="chart" data-tag=... data-xmin/xmax/ymin/ymax=...> holding one
// <polyline class="series smoothed" data-run=... data-points=N> per run (and a "raw" twin), so
// a browser's DOM shows what was drawn.
#pragma once

#include <string>
#include <vector>

namespace glossa {

struct HtmlReportOptions {
  std::vector<std::string> logdirs;
  std::string command_line;
  std::string version;
  // Text to show as the headline section (the task's Report hook output); empty: none.
  std::string headline;
};

// The HTML. NotFound when a logdir does not exist.
std::string RenderHtmlReport(const HtmlReportOptions& options);

}  // namespace glossa
