#include "glossa/base/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "glossa/base/strings.h"

namespace glossa {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[64];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
}

std::string FormatCount(double v) {
  char buf[32];
  if (v >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.1fM", v / 1e6);
  } else if (v >= 1e4) {
    std::snprintf(buf, sizeof(buf), "%.1fk", v / 1e3);
  } else if (v >= 100) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f", v);
  }
  return buf;
}

namespace {

// 3 significant digits, the exponent without padding: 0.0016 -> "1.6e-3", 4.4213 -> "4.42",
// 9.996e-5 -> "1e-4" (never "10e-5"), 1234.5 -> "1235".
std::string Short(double v) {
  char buf[32];
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  const double a = std::fabs(v);
  if (v != 0 && (a < 1e-2 || a >= 1e5)) {
    int e = static_cast<int>(std::floor(std::log10(a)));
    std::snprintf(buf, sizeof(buf), "%.2g", v / std::pow(10.0, e));
    if (std::fabs(std::strtod(buf, nullptr)) >= 10) {  // the mantissa rounded up to 10
      ++e;
      std::snprintf(buf, sizeof(buf), "%.2g", v / std::pow(10.0, e));
    }
    return StrCat(buf, "e", e);
  }
  std::snprintf(buf, sizeof(buf), a >= 100 ? "%.0f" : "%.3g", v);
  return buf;
}

}  // namespace

std::string FormatProgressLine(const ProgressLine& p) {
  const char* sep = " \xC2\xB7 ";  // " · "
  std::string line = StrCat("step ", p.step, "/", p.max_steps);
  if (p.max_steps > 0) {
    line += StrCat(" (", static_cast<int64_t>(100.0 * p.step / p.max_steps), "%)");
  }
  if (p.loss) line += StrCat(sep, "loss ", Short(*p.loss));
  if (p.log_pplx) line += StrCat(sep, "log_pplx ", Short(*p.log_pplx));
  if (p.learning_rate) line += StrCat(sep, "lr ", Short(*p.learning_rate));
  line += StrCat(sep, Short(p.steps_per_sec), " steps/s");
  if (p.tokens_per_sec > 0) line += StrCat(sep, FormatCount(p.tokens_per_sec), " tok/s");
  line += StrCat(sep, "elapsed ", FormatDuration(p.elapsed_seconds));
  if (p.steps_per_sec > 0 && p.max_steps > p.step) {
    line += StrCat(sep, "ETA ", FormatDuration((p.max_steps - p.step) / p.steps_per_sec));
  }
  return line;
}

ProgressBar::ProgressBar(FILE* out) : out_(out) {
  const char* term = std::getenv("TERM");
  enabled_ = out != nullptr && isatty(fileno(out)) && !(term != nullptr && std::string(term) == "dumb");
}

void ProgressBar::Update(int64_t step, int64_t max_steps, double steps_per_sec) {
  if (!enabled_ || max_steps <= 0) return;
  constexpr int kWidth = 30;
  const double frac = std::clamp(static_cast<double>(step) / max_steps, 0.0, 1.0);
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(kWidth, ' ');
  for (int i = 0; i < filled; ++i) bar[i] = '=';
  if (filled < kWidth) bar[filled] = '>';
  std::string text = StrCat("\r[", bar, "] ", step, "/", max_steps, " ",
                            static_cast<int>(frac * 100), "%");
  if (steps_per_sec > 0) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3g", steps_per_sec);
    text += StrCat(" \xC2\xB7 ", buf, " steps/s \xC2\xB7 ETA ",
                   FormatDuration((max_steps - step) / steps_per_sec));
  }
  text += "\x1b[K";
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
  drawn_ = true;
}

void ProgressBar::Clear() {
  if (!enabled_ || !drawn_) return;
  std::fputs("\r\x1b[K", out_);
  std::fflush(out_);
  drawn_ = false;
}

namespace {
double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

std::string WithCommas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

CountProgress::CountProgress(FILE* out, std::string what, std::string unit, double every_seconds)
    : out_(out), what_(std::move(what)), unit_(std::move(unit)), every_(every_seconds),
      tty_(out != nullptr && isatty(fileno(out))), start_(NowSeconds()), last_print_(start_) {}

std::string CountProgress::Text() const {
  const double secs = NowSeconds() - start_;
  char rate[32];
  std::snprintf(rate, sizeof(rate), "%.3g", count_ / std::max(secs, 1e-9));
  return StrCat(what_, ": ", WithCommas(count_), " ", unit_, " (", rate, "/s, ",
                FormatDuration(secs), ")");
}

void CountProgress::Add(int64_t n) {
  count_ += n;
  if (out_ == nullptr) return;
  const double now = NowSeconds();
  if (tty_) {
    if (now - last_print_ < 0.1) return;
    std::fprintf(out_, "\r%s\x1b[K", Text().c_str());
  } else {
    if (now - last_print_ < every_) return;
    std::fprintf(out_, "%s\n", Text().c_str());
  }
  last_print_ = now;
  std::fflush(out_);
}

void CountProgress::Done(const std::string& suffix) {
  if (out_ == nullptr) return;
  std::fprintf(out_, "%s%s%s\n", tty_ ? "\r\x1b[K" : "", Text().c_str(), suffix.c_str());
  std::fflush(out_);
}

}  // namespace glossa
