#include "glossa/report/html_report.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/io/event_file.h"
#include "glossa/model/metric_history.h"
#include "glossa/base/progress.h"

namespace glossa {
namespace {

using Series = std::vector<std::pair<double, double>>;  // (step, value), by step

constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};
constexpr double kSmoothing = 0.6;  // TensorBoard's default
constexpr int kW = 640, kH = 260, kLeft = 64, kRight = 16, kTop = 12, kBottom = 36;

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// An axis label: at most 4 significant digits, short enough for the axis margin: 0.0501044 ->
// "0.0501", 1080010 -> "1.08e6", 12.5 -> "12.5". The page's script formats the same way (tick()).
std::string Tick(double v) {
  if (v == 0 || !std::isfinite(v)) return v == 0 ? "0" : Num(v);
  char buf[32];
  const double a = std::fabs(v);
  if (a >= 1e-3 && a < 1e4) {
    std::snprintf(buf, sizeof(buf), "%.4g", v);
    if (std::string(buf).find('e') == std::string::npos) return buf;
  }
  int e = static_cast<int>(std::floor(std::log10(a)));
  std::snprintf(buf, sizeof(buf), "%.3g", v / std::pow(10.0, e));
  if (std::fabs(std::strtod(buf, nullptr)) >= 10) {  // the mantissa rounded up to 10
    ++e;
    std::snprintf(buf, sizeof(buf), "%.3g", v / std::pow(10.0, e));
  }
  return StrCat(buf, "e", e);
}

// The one value every finite point of every series has; none when they differ (or there are
// none). Such a metric is a table row, not a chart of a flat line.
template <typename R>
std::optional<double> ConstantValue(const std::vector<std::pair<R, const Series*>>& all) {
  std::optional<double> value;
  for (const auto& [run, s] : all) {
    for (const auto& [x, y] : *s) {
      if (!std::isfinite(y)) continue;
      if (value && *value != y) return std::nullopt;
      value = y;
    }
  }
  return value;
}

bool IsDir(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// TensorBoard's smoothing: an exponential moving average, debiased for its start.
Series Smooth(const Series& s, double w) {
  Series out;
  double last = 0;
  int64_t n = 0;
  for (const auto& [x, y] : s) {
    if (!std::isfinite(y)) {
      out.emplace_back(x, y);
      continue;
    }
    last = last * w + (1 - w) * y;
    ++n;
    const double debias = w == 0 ? 1 : 1 - std::pow(w, static_cast<double>(n));
    out.emplace_back(x, last / debias);
  }
  return out;
}

struct Run {
  std::string name, dir, colour;
  std::map<std::string, Series> train;                          // tag -> curve
  std::map<std::string, std::map<std::string, Series>> jobs;    // job -> metric -> per ckpt
  std::map<std::string, std::map<std::string, int64_t>> best;  // job -> metric -> best step
  std::vector<std::string> damage;
  std::string params, analysis;
  std::map<std::string, std::vector<std::string>> samples;  // job -> latest decoder_out lines
};

Run LoadRun(const std::string& dir, int index) {
  if (!IsDir(dir)) throw NotFoundError(StrCat("report: no logdir '", dir, "'"));
  Run r;
  r.dir = dir;
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  r.name = trimmed.substr(trimmed.rfind('/') + 1);
  r.colour = kColours[index % 8];
  const std::string train = JoinPath(dir, "train");
  if (IsDir(train)) {
    std::vector<std::string> files;
    for (const auto& f : ListDirectory(train)) {
      if (f.rfind("events.out.tfevents.", 0) == 0) files.push_back(f);
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::string damage;
      for (const EventRecord& e : ReadEvents(JoinPath(train, f), &damage)) {
        if (e.kind == EventRecord::Kind::kScalar) r.train[e.tag].emplace_back(e.step, e.value);
      }
      if (!damage.empty()) {
        r.damage.push_back(StrCat(damage, " (the curves show the events before it)"));
      }
    }
    for (auto& [tag, s] : r.train) {
      std::stable_sort(s.begin(), s.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
  }
  for (const auto& job : ListDirectory(dir)) {
    if (job.rfind("eval_", 0) != 0 && job.rfind("decoder_", 0) != 0) continue;
    const std::string jd = JoinPath(dir, job);
    if (!IsDir(jd)) continue;
    for (const auto& [metric, b] : ReadBestStepFiles(jd)) r.best[job][metric] = b.best_step;
    std::string latest_out;
    for (const auto& f : ListDirectory(jd)) {
      const std::string path = JoinPath(jd, f);
      if (f.rfind("score-", 0) == 0 && f.size() > 10) {
        int64_t step = 0;
        try {
          step = std::stoll(f.substr(6, f.size() - 10));
        } catch (const std::exception&) {
          r.damage.push_back(StrCat(path, ": no step number in the name"));
          continue;
        }
        for (const auto& line : Split(ReadFileToString(path, 1 << 20), '\n')) {
          const size_t colon = line.find(": ");
          if (colon == std::string::npos) continue;
          try {
            r.jobs[job][line.substr(0, colon)].emplace_back(step, std::stod(line.substr(colon + 2)));
          } catch (const std::exception&) {
            r.damage.push_back(StrCat(path, ": unreadable line '", line, "'"));
          }
        }
      } else if (f.rfind("decoder_out_", 0) == 0 && f > latest_out) {
        latest_out = f;
      }
    }
    for (auto& [metric, s] : r.jobs[job]) std::sort(s.begin(), s.end());
    if (!latest_out.empty()) {
      const std::vector<std::string> lines =
          Split(ReadFileToString(JoinPath(jd, latest_out), 64 << 20), '\n');
      for (size_t i = 0; i < lines.size() && r.samples[job].size() < 10; ++i) {
        if (!lines[i].empty()) r.samples[job].push_back(lines[i]);
      }
      r.samples[job].insert(r.samples[job].begin(), latest_out);
    }
  }
  const std::string control = JoinPath(dir, "control");
  if (FileExists(JoinPath(control, "params.txt"))) {
    r.params = ReadFileToString(JoinPath(control, "params.txt"), 64 << 20);
  }
  if (FileExists(JoinPath(control, "model_analysis.txt"))) {
    r.analysis = ReadFileToString(JoinPath(control, "model_analysis.txt"), 64 << 20);
  }
  return r;
}

// A chart's plotted box: the extents of its data, and their mapping to SVG coordinates.
struct ChartFrame {
  double xmin, xmax, ymin, ymax;
  double Px(double x) const {
    return kLeft + (x - xmin) / (xmax - xmin) * (kW - kLeft - kRight);
  }
  double Py(double y) const {
    return kTop + (ymax - y) / (ymax - ymin) * (kH - kTop - kBottom);
  }
};

// The frame of the finite points of `series`, widened where it is flat (one step, or one value);
// none when no point is finite.
std::optional<ChartFrame> FrameOf(
    const std::vector<std::pair<const Run*, const Series*>>& series) {
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const auto& [run, s] : series) {
    for (const auto& [x, y] : *s) {
      if (!std::isfinite(y)) continue;
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymin = std::min(ymin, y);
      ymax = std::max(ymax, y);
    }
  }
  if (!std::isfinite(xmin)) return std::nullopt;
  if (xmax == xmin) {  // one step (one checkpoint): it sits in the middle
    xmin -= 1;
    xmax += 1;
  }
  if (ymax == ymin) {
    ymax += std::max(1e-9, std::fabs(ymax) * 0.05);
    ymin -= std::max(1e-9, std::fabs(ymin) * 0.05);
  }
  return ChartFrame{xmin, xmax, ymin, ymax};
}

// `s` drawn as one of `run`'s polylines in frame `f`; data-values holds `values` (the raw series:
// the page's script smooths it).
std::string Polyline(const ChartFrame& f, const Run* run, const Series& s, const Series& values,
                     const char* cls, const char* extra) {
  std::string pts;
  int64_t n = 0;
  for (const auto& [x, y] : s) {
    if (!std::isfinite(y)) continue;
    pts += StrCat(Num(f.Px(x)), ",", Num(f.Py(y)), " ");
    ++n;
  }
  std::string data;
  for (const auto& [x, y] : values) data += StrCat(Num(x), ",", Num(y), " ");
  return StrCat("<polyline class=\"series ", cls, "\" data-run=\"", Escape(run->name),
                "\" data-points=\"", n, "\" data-values=\"", data, "\" points=\"", pts,
                "\" fill=\"none\" stroke=\"", run->colour, "\" ", extra, "/>");
}

// A dot at every finite point of `s` in frame `f`: for a per-checkpoint series, and for a
// one-point curve (a line through one point draws nothing).
std::string Dots(const ChartFrame& f, const Run* run, const Series& s) {
  std::string out;
  for (const auto& [x, y] : s) {
    if (!std::isfinite(y)) continue;
    out += StrCat("<circle class=\"point\" data-run=\"", Escape(run->name), "\" data-x=\"",
                  Num(x), "\" data-y=\"", Num(y), "\" cx=\"", Num(f.Px(x)), "\" cy=\"",
                  Num(f.Py(y)), "\" r=\"3\" fill=\"", run->colour, "\"/>");
  }
  return out;
}

// One chart: every run's series (raw faint, smoothed on top), axes with extents and ticks, and
// the best steps marked.
std::string Chart(const std::string& id, const std::string& title,
                  const std::vector<std::pair<const Run*, const Series*>>& series,
                  const std::map<const Run*, int64_t>& best, bool smooth) {
  const std::optional<ChartFrame> frame = FrameOf(series);
  if (!frame) return "";
  const ChartFrame& f = *frame;
  std::string svg = StrCat("<figure><figcaption>", Escape(title), "</figcaption><svg id=\"",
                           Escape(id), "\" class=\"chart\" data-tag=\"", Escape(title),
                           "\" data-xmin=\"", Num(f.xmin), "\" data-xmax=\"", Num(f.xmax),
                           "\" data-ymin=\"", Num(f.ymin), "\" data-ymax=\"", Num(f.ymax),
                           "\" viewBox=\"0 0 ", kW, " ", kH, "\" width=\"", kW, "\" height=\"", kH,
                           "\"><rect class=\"plot\" x=\"", kLeft, "\" y=\"", kTop, "\" width=\"",
                           kW - kLeft - kRight, "\" height=\"", kH - kTop - kBottom,
                           "\" fill=\"#fafafa\" stroke=\"#999\"/>");
  std::set<double> xticks;  // whole steps, each once, where they are
  for (int i = 0; i <= 4; ++i) {
    const double y = f.ymin + (f.ymax - f.ymin) * i / 4;
    svg += StrCat("<text class=\"ytick\" x=\"", kLeft - 4, "\" y=\"", Num(f.Py(y) + 4),
                  "\" text-anchor=\"end\">", Tick(y), "</text>");
    const double x = std::round(f.xmin + (f.xmax - f.xmin) * i / 4);
    if (x < f.xmin || x > f.xmax || !xticks.insert(x).second) continue;
    svg += StrCat("<text class=\"xtick\" x=\"", Num(f.Px(x)), "\" y=\"", kH - kBottom + 16,
                  "\" text-anchor=\"middle\">", Tick(x), "</text>");
  }
  svg += StrCat("<text x=\"", (kW + kLeft) / 2, "\" y=\"", kH - 4,
                "\" text-anchor=\"middle\" class=\"xlabel\">step</text>");
  for (const auto& [run, s] : series) {
    int64_t finite = 0;
    for (const auto& [x, y] : *s) finite += std::isfinite(y) ? 1 : 0;
    if (!smooth || finite == 1) svg += Dots(f, run, *s);
    if (smooth) {
      svg += Polyline(f, run, *s, *s, "raw", "stroke-opacity=\"0.25\" stroke-width=\"1\"");
      svg += Polyline(f, run, Smooth(*s, kSmoothing), *s, "smoothed", "stroke-width=\"2\"");
    } else {
      svg += Polyline(f, run, *s, *s, "smoothed", "stroke-width=\"2\"");
    }
    if (auto b = best.find(run); b != best.end()) {
      for (const auto& [x, y] : *s) {
        if (x != static_cast<double>(b->second) || !std::isfinite(y)) continue;
        svg += StrCat("<circle class=\"best\" data-run=\"", Escape(run->name), "\" data-step=\"",
                      b->second, "\" data-x=\"", Num(x), "\" data-y=\"", Num(y), "\" cx=\"",
                      Num(f.Px(x)), "\" cy=\"", Num(f.Py(y)),
                      "\" r=\"5\" fill=\"none\" stroke=\"", run->colour,
                      "\" stroke-width=\"2\"><title>best at step ", b->second, ": ", Num(y),
                      "</title></circle>");
      }
    }
  }
  return svg + "</svg></figure>\n";
}

constexpr const char* kStyle = R"(
body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:1.5em}
figure{display:inline-block;margin:.5em;vertical-align:top}figcaption{font-weight:bold;font-size:.9em}
svg text{font-size:11px;fill:#444}.damage{background:#fee;border:1px solid #c00;padding:.5em;margin:.5em 0}
.legend span{display:inline-block;margin-right:1em}.swatch{display:inline-block;width:1em;height:.6em;margin-right:.3em}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
td.n{text-align:right}pre{background:#f6f6f6;padding:.5em;overflow:auto;max-height:30em;font-size:.8em}
.meta{color:#666;font-size:.85em}
)";

// Recomputes the smoothed series and the y axis (linear or log) from each polyline's data-values.
constexpr const char* kScript = R"(
(function(){
var W=640,H=260,L=64,R=16,T=12,B=36;
function tick(y){if(y===0)return '0';var a=Math.abs(y);
  if(a>=1e-3&&a<1e4){var s=String(+y.toPrecision(4));if(s.indexOf('e')<0)return s;}
  var e=Math.floor(Math.log10(a)),m=+(y/Math.pow(10,e)).toPrecision(3);
  if(Math.abs(m)>=10){e+=1;m=+(y/Math.pow(10,e)).toPrecision(3);}
  return m+'e'+e;}
function redraw(){
  var w=parseFloat(document.getElementById('smoothing').value);
  var logy=document.getElementById('logy').checked;
  document.getElementById('smoothing_value').textContent=w.toFixed(2);
  document.querySelectorAll('svg.chart').forEach(function(svg){
    var xmin=+svg.dataset.xmin,xmax=+svg.dataset.xmax,ymin=+svg.dataset.ymin,ymax=+svg.dataset.ymax;
    var lg=logy&&ymin>0; var f=function(y){return lg?Math.log10(y):y;};
    var a=f(ymin),b=f(ymax); if(a===b){b=a+1;}
    svg.querySelectorAll('polyline.series').forEach(function(pl){
      var vals=pl.dataset.values.trim().split(' ').map(function(p){var q=p.split(',');return [+q[0],+q[1]];});
      if(pl.classList.contains('smoothed')&&svg.querySelector('polyline.raw')){
        var last=0,n=0;vals=vals.map(function(v){if(!isFinite(v[1]))return v;last=last*w+(1-w)*v[1];n++;return [v[0],last/(w===0?1:1-Math.pow(w,n))];});
      }
      pl.setAttribute('points',vals.filter(function(v){return isFinite(v[1])&&(!lg||v[1]>0);}).map(function(v){
        return (L+(v[0]-xmin)/(xmax-xmin)*(W-L-R)).toFixed(2)+','+(T+(b-f(v[1]))/(b-a)*(H-T-B)).toFixed(2);}).join(' '));
    });
    svg.querySelectorAll('circle[data-y]').forEach(function(c){var y=+c.dataset.y;
      c.style.display=lg&&y<=0?'none':'';if(lg&&y<=0)return;
      c.setAttribute('cy',(T+(b-f(y))/(b-a)*(H-T-B)).toFixed(2));});
    svg.querySelectorAll('text.ytick').forEach(function(t,i){var y=a+(b-a)*i/4;t.textContent=tick(lg?Math.pow(10,y):y);
      t.setAttribute('y',(T+(b-y)/(b-a)*(H-T-B)+4).toFixed(2));});
    svg.dataset.yscale=lg?'log':'linear';
  });
}
document.getElementById('smoothing').addEventListener('input',redraw);
document.getElementById('logy').addEventListener('change',redraw);
// A link can preset the view: report.html#logy&smoothing=0.9
var hash=location.hash.slice(1).split('&');
if(location.hash){
  hash.forEach(function(kv){var p=kv.split('=');
    if(p[0]==='logy')document.getElementById('logy').checked=true;
    if(p[0]==='smoothing'&&p[1]!==undefined)document.getElementById('smoothing').value=p[1];});
  redraw();
}
})();
)";

// The page's head, its run legend, the runs' damage notes and the headline.
std::string PageTop(const HtmlReportOptions& options, const std::vector<Run>& runs) {
  std::string h = StrCat("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
                         "<title>Glossa report</title><style>", kStyle,
                         "</style></head><body>\n<h1>Glossa report</h1>\n<p class=\"meta\">",
                         "Glossa ", Escape(options.version), " &middot; ",
                         Escape(options.command_line), "</p>\n<p class=\"legend\">");
  for (const Run& r : runs) {
    h += StrCat("<span data-run=\"", Escape(r.name), "\"><span class=\"swatch\" style=\"background:",
                r.colour, "\"></span>", Escape(r.name), " <small>(", Escape(r.dir),
                ")</small></span>");
  }
  h += "</p>\n";
  for (const Run& r : runs) {
    for (const auto& d : r.damage) {
      h += StrCat("<div class=\"damage\">", Escape(r.name), ": ", Escape(d), "</div>\n");
    }
  }
  if (!options.headline.empty()) {
    h += StrCat("<h2 id=\"headline\">Headline</h2>\n<pre class=\"headline\">",
                Escape(options.headline), "</pre>\n");
  }
  return h;
}

// Metrics with one value throughout (every run, every point) go to a table: a flat line on a
// made-up axis says less than the number. Empty for no rows.
std::string ConstantsTable(const std::vector<std::pair<std::string, double>>& rows) {
  if (rows.empty()) return std::string();
  std::string t = "<table class=\"constants\"><tr><th>constant throughout</th><th>value</th></tr>";
  for (const auto& [name, v] : rows) {
    t += StrCat("<tr><td>", Escape(name), "</td><td class=\"n\">", Num(v), "</td></tr>");
  }
  return t + "</table>\n";
}

// The Training section: a chart per training tag (ids "train-<id>", counting `id` up), and the
// constant ones in a table.
std::string TrainingSection(const std::vector<Run>& runs, int& id) {
  std::string h =
      "<h2 id=\"training\">Training</h2>\n<p><label>smoothing <input type=\"range\" "
      "id=\"smoothing\" min=\"0\" max=\"0.99\" step=\"0.01\" value=\"0.6\"> <span "
      "id=\"smoothing_value\">0.60</span></label> &nbsp; <label><input type=\"checkbox\" "
      "id=\"logy\"> log y axis</label></p>\n";
  std::map<std::string, std::vector<std::pair<const Run*, const Series*>>> tags;
  for (const Run& r : runs) {
    for (const auto& [tag, s] : r.train) tags[tag].emplace_back(&r, &s);
  }
  std::vector<std::pair<std::string, double>> constant;
  for (const auto& [tag, series] : tags) {
    if (const auto v = ConstantValue(series)) {
      constant.emplace_back(tag, *v);
      continue;
    }
    h += Chart(StrCat("train-", id++), tag, series, {}, true);
  }
  h += ConstantsTable(constant);
  if (tags.empty()) h += "<p>No training events.</p>\n";
  return h;
}

// The eval and decoder section: a chart per job/metric (ids "job-<id>", counting `id` up) with
// the best steps marked, and the constant ones in a table.
std::string EvalSection(const std::vector<Run>& runs, int& id) {
  std::map<std::string, std::vector<std::pair<const Run*, const Series*>>> job_metrics;
  std::map<std::string, std::map<const Run*, int64_t>> bests;
  for (const Run& r : runs) {
    for (const auto& [job, metrics] : r.jobs) {
      for (const auto& [metric, s] : metrics) {
        const std::string key = StrCat(job, "/", metric);
        job_metrics[key].emplace_back(&r, &s);
        auto jb = r.best.find(job);
        if (jb != r.best.end() && jb->second.count(metric)) bests[key][&r] = jb->second.at(metric);
      }
    }
  }
  std::string h = "<h2 id=\"eval\">Eval and decoder metrics per checkpoint</h2>\n";
  std::vector<std::pair<std::string, double>> constant;
  for (const auto& [key, series] : job_metrics) {
    // With one checkpoint every metric has one value: still a chart, with its point.
    bool one_point = true;
    for (const auto& [run, s] : series) one_point = one_point && s->size() <= 1;
    if (const auto v = ConstantValue(series); v && !one_point) {
      constant.emplace_back(key, *v);
      continue;
    }
    h += Chart(StrCat("job-", id++), key, series, bests[key], false);
  }
  h += ConstantsTable(constant);
  if (job_metrics.empty()) h += "<p>No eval or decoder scores.</p>\n";
  return h;
}

// The Model section: each run's Params text and variable table (once for runs of one model).
std::string ModelSection(const std::vector<Run>& runs) {
  std::string h = "<h2 id=\"model\">Model</h2>\n";
  // Runs of the same model share one Params text and one variable table.
  bool same_model = true;
  for (const Run& r : runs) {
    same_model = same_model && r.params == runs[0].params && r.analysis == runs[0].analysis;
  }
  for (const Run& r : runs) {
    if (same_model && &r != &runs[0]) break;
    h += StrCat("<h3>", same_model && runs.size() > 1 ? std::string("every run") : Escape(r.name),
                "</h3>\n");
    if (!r.params.empty()) {
      h += StrCat("<details class=\"params\"><summary>Params</summary><pre>", Escape(r.params),
                  "</pre></details>\n");
    }
    if (!r.analysis.empty()) {
      h += "<table class=\"variables\"><tr><th>variable</th><th>shape</th><th>#params</th></tr>";
      for (const auto& line : Split(r.analysis, '\n')) {
        if (line.rfind("total #params: ", 0) == 0) {
          h += StrCat("<tr class=\"total\"><th colspan=\"2\">total</th><td class=\"n\">",
                      WithCommas(std::atoll(line.c_str() + 15)), "</td></tr>");
          continue;
        }
        const size_t a = line.find("    ["), b = line.rfind("]    ");
        if (a == std::string::npos || b == std::string::npos || b < a) continue;
        h += StrCat("<tr><td>", Escape(line.substr(0, a)), "</td><td>",
                    Escape(line.substr(a + 4, b - a - 3)), "</td><td class=\"n\">",
                    Escape(line.substr(b + 5)), "</td></tr>");
      }
      h += "</table>\n";
    }
  }
  return h;
}

// The Decoder samples section: each run's and job's latest decoder_out lines as a table.
std::string SamplesSection(const std::vector<Run>& runs) {
  std::string h = "<h2 id=\"samples\">Decoder samples</h2>\n";
  bool any = false;
  for (const Run& r : runs) {
    for (const auto& [job, lines] : r.samples) {
      any = true;
      h += StrCat("<h3>", Escape(r.name), " &middot; ", Escape(job), " &middot; ",
                  Escape(lines.front()), "</h3>\n<table class=\"samples\">");
      for (size_t i = 1; i < lines.size(); ++i) {
        h += "<tr>";
        for (const auto& cell : Split(lines[i], '|')) {
          if (!Strip(cell).empty()) h += StrCat("<td>", Escape(std::string(Strip(cell))), "</td>");
        }
        h += "</tr>";
      }
      h += "</table>\n";
    }
  }
  if (!any) h += "<p>No decoder output.</p>\n";
  return h;
}

}  // namespace

std::string RenderHtmlReport(const HtmlReportOptions& options) {
  if (options.logdirs.empty()) throw InvalidArgumentError("report --html: give --logdir");
  std::vector<Run> runs;
  for (size_t i = 0; i < options.logdirs.size(); ++i) {
    runs.push_back(LoadRun(options.logdirs[i], static_cast<int>(i)));
  }
  std::string h = PageTop(options, runs);
  int id = 0;
  h += TrainingSection(runs, id);
  h += EvalSection(runs, id);
  h += ModelSection(runs);
  h += SamplesSection(runs);
  return h + "<script>" + kScript + "</script>\n</body></html>\n";
}

}  // namespace glossa
