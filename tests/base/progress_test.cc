// The console progress line and bar (glossa/base/progress.h).
#include "glossa/base/progress.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <unistd.h>

#include <cmath>
#include <string>

namespace glossa {
namespace {

TEST(Progress, DurationsAndCounts) {
  EXPECT_EQ(FormatDuration(0), "0:00");
  EXPECT_EQ(FormatDuration(45), "0:45");
  EXPECT_EQ(FormatDuration(90.4), "1:30");
  EXPECT_EQ(FormatDuration(3723), "1:02:03");
  EXPECT_EQ(FormatDuration(-1), "?");
  EXPECT_EQ(FormatDuration(std::nan("")), "?");
  EXPECT_EQ(FormatCount(26100), "26.1k");
  EXPECT_EQ(FormatCount(1.25e6), "1.2M");
  EXPECT_EQ(FormatCount(950), "950");
  EXPECT_EQ(FormatCount(8.91), "8.9");
}

TEST(Progress, TheIssuesLine) {
  ProgressLine p;
  p.step = 400;
  p.max_steps = 1200;
  p.loss = 4.4213;
  p.log_pplx = 4.4213;
  p.learning_rate = 0.0016;
  p.steps_per_sec = 8.9;
  p.tokens_per_sec = 26100;
  p.elapsed_seconds = 45;
  // 800 steps left at 8.9 steps/s: 89.9 s.
  EXPECT_EQ(FormatProgressLine(p),
            "step 400/1200 (33%) \u00b7 loss 4.42 \u00b7 log_pplx 4.42 \u00b7 lr 1.6e-3 \u00b7 "
            "8.9 steps/s \u00b7 26.1k tok/s \u00b7 elapsed 0:45 \u00b7 ETA 1:30");
  // At the end: no ETA; without tokens or a log_pplx, those are left out.
  p.step = 1200;
  p.log_pplx.reset();
  p.tokens_per_sec = 0;
  EXPECT_EQ(FormatProgressLine(p),
            "step 1200/1200 (100%) \u00b7 loss 4.42 \u00b7 lr 1.6e-3 \u00b7 8.9 steps/s \u00b7 "
            "elapsed 0:45");
}

TEST(Progress, NumbersNeverPrintAsTenToAPower) {
  // A mantissa that rounds up to 10 moves to the next exponent: 9.996e-5 is "1e-4", not "10e-5".
  ProgressLine p;
  p.step = 1;
  p.max_steps = 2;
  p.loss = 1234.5;
  p.learning_rate = 9.996e-5;
  p.steps_per_sec = 1234.5;
  const std::string line = FormatProgressLine(p);
  EXPECT_NE(line.find("lr 1e-4 "), std::string::npos) << line;
  EXPECT_NE(line.find("loss 1234 "), std::string::npos) << line;  // not 1.23e+03
  EXPECT_NE(line.find("\u00b7 1234 steps/s"), std::string::npos) << line;
  EXPECT_EQ(line.find("e+"), std::string::npos) << line;
  for (double v : {9.95e-3, 9.999e-4, 99999.0, 999999.0, -9.96e-7, 0.0099999}) {
    p.learning_rate = v;
    const std::string l = FormatProgressLine(p);
    EXPECT_EQ(l.find("10e"), std::string::npos) << v << ": " << l;
    EXPECT_EQ(l.find("e+"), std::string::npos) << v << ": " << l;
  }
}

TEST(Progress, TheBarDrawsOnlyOnATerminal) {
  FILE* pipe_end = tmpfile();
  ProgressBar off(pipe_end);
  EXPECT_FALSE(off.enabled());
  off.Update(1, 10, 1);
  EXPECT_EQ(ftell(pipe_end), 0);
  fclose(pipe_end);

  int master = -1, slave = -1;
  ASSERT_EQ(openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  FILE* tty = fdopen(slave, "w");
  ProgressBar bar(tty);
  ASSERT_TRUE(bar.enabled());
  bar.Update(5, 20, 2.5);
  bar.Clear();
  fflush(tty);
  // A pty may hand the bytes over in more than one read: read until Clear's sequence, which comes
  // last (poll's 10 s only bound a failure, they are not a wait for the bytes).
  std::string out;
  const std::string clear = "\r\x1b[K";
  while (out.size() < clear.size() || out.compare(out.size() - clear.size(), clear.size(), clear)) {
    pollfd pfd{master, POLLIN, 0};
    if (poll(&pfd, 1, 10000) <= 0) break;
    char buf[512];
    const ssize_t n = read(master, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ASSERT_FALSE(out.empty());
  // 25% of 30 columns: 7 '=' then '>'; 15 steps left at 2.5 steps/s: 0:06.
  EXPECT_EQ(out.rfind("\r[=======>", 0), 0u) << out;
  EXPECT_NE(out.find("] 5/20 25% \u00b7 2.5 steps/s \u00b7 ETA 0:06\x1b[K"), std::string::npos)
      << out;
  EXPECT_NE(out.find("\r\x1b[K"), std::string::npos);  // Clear
  fclose(tty);
  close(master);
}

TEST(Progress, SetupStepsCountInAPipe) {
  EXPECT_EQ(WithCommas(0), "0");
  EXPECT_EQ(WithCommas(1234567), "1,234,567");
  EXPECT_EQ(WithCommas(-1000), "-1,000");
  FILE* f = tmpfile();
  {
    CountProgress p(f, "counting unigrams over Train", "batches", /*every_seconds=*/0);
    p.Add();
    p.Add(2);
    p.Done(", 42 tokens");
  }
  rewind(f);
  char buf[1024];
  const size_t n = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  const std::string out(buf, n);
  // A line per Add (every 0 s) and the final one; no carriage returns outside a terminal.
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_EQ(out.rfind("counting unigrams over Train: 1 batches (", 0), 0u) << out;
  EXPECT_NE(out.find("\ncounting unigrams over Train: 3 batches ("), std::string::npos) << out;
  EXPECT_NE(out.find("), 42 tokens\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace glossa
