#!/usr/bin/env bash
# `glossa report --html` rendered by a real browser (Debian's chromium-headless-shell): two runs
# of the tiny Austen LM (one with its event file truncated), their eval and decoder scores. The
# DOM after the page's script ran must hold every chart with one series per run, as many points
# as the events hold, and the axis extents of the data; the damage is stated; the screenshot's
# plot areas hold both runs' colours.
#   bash tests/tools/html_report_test.sh build/bin/glossa
set -u
glossa="$1"
tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # check, wait_for, wait_until, slowdown
browser=$(command -v chromium-headless-shell || true)
if [ -z "$browser" ]; then
  echo "FAIL: chromium-headless-shell is not installed (bash scripts/setup.sh installs it)"; exit 1
fi
small='task.emb.embedding_dim : 16; task.position_emb.embedding_dim : 16; task.softmax.input_dim : 16; task.stack.num_layers : 1; task.stack.mdl_dim : 16; task.stack.hidden_dim : 32; task.stack.num_atten_heads : 2; task.train.steps_per_loop : 5; task.train.save_interval_steps : 10; task.train.summary_interval_steps : 5; task.eval.samples_per_summary : 32; task.eval.decoder_samples_per_summary : 8; task.decode_max_new_tokens : 6'
flags=(--model=lm.austen.TransformerLmTiny --random_seed=3 --intra_op_threads=1 "--model_params_override=$small")
for run in a b; do
  check "train $run" "$glossa" train "${flags[@]}" --logdir="$tmp/$run" --max_steps=20 > "$tmp/$run.log" 2>&1
  check "eval $run" "$glossa" eval "${flags[@]}" --logdir="$tmp/$run" --once > "$tmp/$run-eval.log" 2>&1
  check "decode $run" "$glossa" decode "${flags[@]}" --logdir="$tmp/$run" --once > "$tmp/$run-decode.log" 2>&1
done
# Run c evaluates inside the trainer (the program schedule), every 10 steps: score files too.
check "train c with the program schedule's eval" "$glossa" train "${flags[@]:0:3}" --logdir="$tmp/c" --max_steps=20 \
  "--model_params_override=$small; program_schedule.eval_dataset_names : ['Dev']; program_schedule.eval_steps_per_loop : 2; program_schedule.train_executions_per_eval : 2" > "$tmp/c.log" 2>&1
check "the schedule's eval leaves score files" test -f "$tmp/c/eval_dev/score-00000010.txt" -a -f "$tmp/c/eval_dev/score-00000020.txt"
check "report --html of run c" "$glossa" report --html="$tmp/report_c.html" --logdir="$tmp/c" > "$tmp/report_c.log" 2>&1
# A missing run is named before any work is done (no headline computed, no file written).
if "$glossa" report --html="$tmp/missing.html" --logdir="$tmp/a" --logdir="$tmp/nope" "${flags[@]}" > "$tmp/missing.log" 2>&1; then
  echo "FAIL: a report with a missing logdir succeeded"; fail=1
fi
check "the missing logdir is named" grep -q "report: no logdir '$tmp/nope'" "$tmp/missing.log"
check "nothing was computed for the missing logdir's report" bash -c "! grep -q 'unigram' '$tmp/missing.log' && test ! -e '$tmp/missing.html'"
ev=$(ls "$tmp"/b/train/events.out.tfevents.*)
truncate -s -7 "$ev"
check "report --html" "$glossa" report --html="$tmp/report.html" --logdir="$tmp/a" --logdir="$tmp/b" "${flags[@]}" > "$tmp/report.log" 2>&1
check "no glog warning in any command's output" bash -c "! grep -l 'Logging before InitGoogleLogging' '$tmp'/*.log"
check "no external resources" bash -c "! grep -Eq '(src|href)=\"(https?:)?//' '$tmp/report.html'"
timeout 120 "$browser" --no-sandbox --disable-gpu --dump-dom "file://$tmp/report.html" > "$tmp/dom.html" 2> /dev/null
# The page's controls, preset from the URL: a log y axis and no smoothing.
timeout 120 "$browser" --no-sandbox --disable-gpu --dump-dom "file://$tmp/report.html#logy&smoothing=0" > "$tmp/dom_log.html" 2> /dev/null
timeout 120 "$browser" --no-sandbox --disable-gpu --window-size=1400,2000 --screenshot="$tmp/shot.png" "file://$tmp/report.html" > /dev/null 2>&1
timeout 120 "$browser" --no-sandbox --disable-gpu --dump-dom "file://$tmp/report_c.html" > "$tmp/dom_c.html" 2> /dev/null
/usr/bin/python3 - "$tmp" <<'PY' || fail=1
import json, re, struct, sys, zlib, html
tmp = sys.argv[1]
dom = open(f"{tmp}/dom.html").read()
ok = True
def fail(msg):
    global ok
    print("FAIL: " + msg); ok = False
# What the intact run's metrics.jsonl holds: tag -> steps.
steps = {}
for line in open(f"{tmp}/a/train/metrics.jsonl"):
    r = json.loads(line)
    steps.setdefault(r["tag"], []).append(r["step"])
charts = re.findall(r'<svg id="train-\d+" class="chart" data-tag="([^"]*)" data-xmin="([^"]*)" data-xmax="([^"]*)" data-ymin="([^"]*)" data-ymax="([^"]*)".*?</svg>', dom, re.S)
if len(charts) < 10:
    fail(f"{len(charts)} training charts in the DOM")
for tag, xmin, xmax, ymin, ymax in charts:
    tag = html.unescape(tag)
    if tag not in steps:
        fail(f"chart {tag} is not a scalar of the events"); continue
    body = re.search(r'data-tag="%s".*?</svg>' % re.escape(html.escape(tag, quote=True)), dom, re.S).group(0)
    for cls in ("raw", "smoothed"):
        n = re.findall(r'<polyline class="series %s" data-run="a" data-points="(\d+)"[^>]*points="([^"]*)"' % cls, body)
        if not n:
            fail(f"{tag}: no {cls} series of run a"); continue
        points = len(n[0][1].split())
        if int(n[0][0]) != len(steps[tag]) or points != len(steps[tag]):
            fail(f"{tag}: {cls} series has {n[0][0]} / {points} points, the events {len(steps[tag])}")
    if 'data-run="b"' not in body and tag in ("loss", "log_pplx"):
        fail(f"{tag}: run b is missing")
    if float(xmin) > min(steps[tag]) or float(xmax) < max(steps[tag]):
        fail(f"{tag}: x axis {xmin}..{xmax} misses steps {min(steps[tag])}..{max(steps[tag])}")
for want in ("eval_dev/log_pplx", "decoder_dev/num_samples_in_batch"):
    if f'data-tag="{want}"' not in dom:
        fail(f"no chart of {want}")
# What a person reads. Tick labels: at most 4 significant digits, short enough for the margin.
def sig_digits(label):
    m = label.lstrip("-").split("e")[0]
    digits = m.replace(".", "").lstrip("0")
    if "." not in m:
        digits = digits.rstrip("0")
    return len(digits)
doms = {"report": dom, "report (log y)": open(f"{tmp}/dom_log.html").read(),
        "report of run c": open(f"{tmp}/dom_c.html").read()}
for name, d in doms.items():
    labels = re.findall(r'<text class="[xy]tick"[^>]*>([^<]*)</text>', d)
    if not labels:
        fail(f"{name}: no tick labels")
    for label in labels:
        if sig_digits(label) > 4 or len(label) > 8:
            fail(f"{name}: tick label '{label}' has more than 4 significant digits or 8 characters")
    # No empty chart: a line through two points or more, or a dot.
    for svg in re.findall(r'<svg [^>]*class="chart".*?</svg>', d, re.S):
        tag = re.search(r'data-tag="([^"]*)"', svg).group(1)
        lines = [int(n) for n in re.findall(r'class="series [a-z]+" data-run="[^"]*" data-points="(\d+)"', svg)]
        if max(lines, default=0) < 2 and '<circle class="point"' not in svg:
            fail(f"{name}: chart {tag} draws nothing")
        xt = re.findall(r'<text class="xtick"[^>]*>([^<]*)</text>', svg)
        if len(xt) != len(set(xt)):
            fail(f"{name}: chart {tag} repeats x ticks {xt}")
# One checkpoint: the eval charts of runs a and b show their point.
ev_chart = re.search(r'<svg [^>]*data-tag="eval_dev/log_pplx".*?</svg>', dom, re.S).group(0)
if len(re.findall(r'<circle class="point"', ev_chart)) < 2:
    fail("the one-checkpoint eval chart has no point per run")
# A metric with one value throughout is a table row, not a chart.
if 'data-tag="total_num_params"' in dom or not re.search(r'class="constants".*?total_num_params', dom, re.S):
    fail("total_num_params (constant) is not in the constants table")
# Two runs of one model: one Params text and one variable table.
tables = dom.count('class="variables"')
if tables != 1:
    fail(f"{tables} variable tables for two runs of one model")
# The schedule's eval (run c): a chart with both evaluations.
m = re.search(r'<svg [^>]*data-tag="eval_dev/log_pplx".*?</svg>', doms["report of run c"], re.S)
if not m or len(re.findall(r'<circle class="point"', m.group(0))) != 2:
    fail("run c's in-trainer eval is not charted with its 2 points")
# The controls: log y on positive charts, and smoothing 0 draws the raw values.
dlog = open(f"{tmp}/dom_log.html").read()
m = re.search(r'<svg[^>]*data-tag="log_pplx"[^>]*>.*?</svg>', dlog, re.S)
if not m or 'data-yscale="log"' not in m.group(0):
    fail("#logy did not switch log_pplx's y axis to log")
else:
    raw = re.search(r'class="series raw" data-run="a"[^>]*points="([^"]*)"', m.group(0)).group(1)
    sm = re.search(r'class="series smoothed" data-run="a"[^>]*points="([^"]*)"', m.group(0)).group(1)
    if raw.split() != sm.split():
        fail("smoothing=0 did not draw the raw values")
    ys = [float(p.split(",")[1]) for p in sm.split()]
    lin = re.search(r'<svg[^>]*data-tag="log_pplx"[^>]*>.*?</svg>', dom, re.S).group(0)
    ys_lin = [float(p.split(",")[1]) for p in re.search(r'class="series raw" data-run="a"[^>]*points="([^"]*)"', lin).group(1).split()]
    if ys == ys_lin:
        fail("the log axis placed the points as the linear one")
if not re.search(r'<circle class="best" data-run="a" data-step="20"', dom):
    fail("the best step is not marked")
if 'class="damage"' not in dom or "events.out.tfevents" not in dom.split('class="damage"')[1][:400]:
    fail("the truncated event file is not stated")
total = re.search(r"total #params: (\d+)", open(f"{tmp}/a/control/model_analysis.txt").read()).group(1)
if f'{int(total):,}' not in dom:
    fail(f"the variable table lacks the total {total}")
if "<details" not in dom or "task.stack.num_layers" not in dom:
    fail("no Params")
if "log_pplx" not in dom.split('id="headline"')[-1][:2000]:
    fail("no headline (the task's report)")
if dom.count("<tr>") < 5:
    fail("no decoder samples or variables")
# The screenshot: decode the PNG (8-bit RGB/RGBA, no interlace) and count series pixels.
data = open(f"{tmp}/shot.png", "rb").read()
w, h, depth, ctype = struct.unpack(">IIBB", data[16:26])
idat = b"".join(data[i + 8:i + 8 + struct.unpack(">I", data[i:i + 4])[0]]
                for i in [m.start() - 4 for m in re.finditer(b"IDAT", data)])
raw = zlib.decompress(idat)
bpp = 4 if ctype == 6 else 3
stride = w * bpp
rows, prev, i = [], bytearray(stride), 0
for _ in range(h):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]; c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line); prev = line
def count(rgb):
    n = 0
    for line in rows:
        for x in range(0, stride, bpp):
            if all(abs(line[x + k] - rgb[k]) < 40 for k in range(3)): n += 1
    return n
blue, red = count((0x1f, 0x77, 0xb4)), count((0xd6, 0x27, 0x28))
if blue < 500 or red < 500:
    fail(f"the screenshot's plots are blank: {blue} blue and {red} red pixels")
sys.exit(0 if ok else 1)
PY
[ "$fail" -eq 0 ] && echo "html_report_test: all checks passed"
exit "$fail"
