#!/usr/bin/python3
"""Every fenced block of README.md and docs/*.md is run or checked (CTest `docs_test`).

Usage: docs_test.py <source dir> <build dir> [--only PAGE ...] [--list]

What each block gets, by its language and the marker comment on the line right above its fence
(`<!-- docs_test: ... -->`):

- ```bash / ```sh: run with bash (`set -eo pipefail`), in order, in one scratch copy of the
  repository (git's files, with build/ pointing at the build under test), with
  GLOSSA_DOCS_MAX_STEPS set so that every `glossa train` stops after a few steps. Markers:
    `skip: <why>`          not run, for the reason given (e.g. it needs two machines);
    `name: <label>`        its output is kept under that label for an output block;
    `server`               its first command is a server: started in the background, the rest
                           of the block runs once its port is known ($PORT), then it is stopped;
    `fails: <regex>`       the block must fail with output matching <regex> (a documented
                           failure, such as Debian's broken torchrun).
- ```cpp: must be a slice of a file under docs/examples/ (the stripped lines in order), which the
  unit tests compile and run; or marked `skip: <why>`.
- ```python: run by tests/python/test_docs.py (docs/python.md), or a slice of docs/examples/, or
  `skip: <why>`.
- ```text: not a command (a diagram, a file's layout, a format), unless marked
  `output: <label>`: then each of its lines must match a line of that block's output, in order,
  with every number in the sample standing for any number and `...` for anything (the format is
  checked), after the same path mapping as the commands (below). The marker
  `range: <words> <lo>..<hi>, ...` (<words> quoted when they hold spaces) also checks the value: the last number after <word> in the
  output must fall in [lo, hi].
- a fence without a language is an error: every block says what it is.

Without Slurm, tests/tools/fake_slurm/ stands in for `srun` and `scontrol` on one node. The
scratch copy maps a few things no test may touch for real, and says so here: absolute paths
under /models, /tmp, /opt and /shared go under the scratch directory; `--port=8080` is a free
port; `ckpt-<step>` names the last checkpoint of the shortened run.
"""
import argparse
import glob
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

MAX_STEPS = 60  # GLOSSA_DOCS_MAX_STEPS: every documented training stops here.
BLOCK_TIMEOUT = 900

FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*docs_test:\s*(.*?)\s*-->\s*$")


class Block:
    def __init__(self, page, line, lang, text, marker):
        self.page, self.line, self.lang, self.text, self.marker = page, line, lang, text, marker

    def where(self):
        return "%s:%d" % (self.page, self.line)

    def marker_value(self, key):
        """'key: value' or bare 'key' from the marker (several separated by ' | ')."""
        for part in (self.marker or "").split(" | "):
            part = part.strip()
            if part == key:
                return ""
            if part.startswith(key + ":"):
                return part[len(key) + 1:].strip()
        return None


def parse_blocks(source_dir, pages):
    blocks = []
    for page in pages:
        lines = open(os.path.join(source_dir, page), encoding="utf-8").read().split("\n")
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if j == len(lines):
                raise SystemExit("%s:%d: unclosed code fence" % (page, i + 1))
            marker = None
            k = i - 1
            if k >= 0:
                mm = MARKER.match(lines[k])
                if mm:
                    marker = mm.group(1)
            blocks.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1:j]), marker))
            i = j + 1
    return blocks


def stripped_lines(text):
    return [l.strip() for l in text.split("\n") if l.strip()]


def is_slice(needle, haystack):
    n, h = stripped_lines(needle), stripped_lines(haystack)
    if not n:
        return True
    for s in range(len(h) - len(n) + 1):
        if h[s:s + len(n)] == n:
            return True
    return False


NUMBER = r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:e[-+]?\d+)?[kM%]?"


def sample_regex(line):
    """A sample output line as a regex: numbers match any number, '...' anything, runs of spaces
    any run of spaces."""
    out, pos = [], 0
    for m in re.finditer(r"\.\.\.|" + NUMBER + r"|\s+", line):
        out.append(re.escape(line[pos:m.start()]))
        tok = m.group(0)
        if tok == "...":
            out.append(".*")
        elif tok.isspace():
            out.append(r"\s+")
        else:
            out.append(NUMBER)
        pos = m.end()
    out.append(re.escape(line[pos:]))
    return re.compile("".join(out))


def check_output(block, output, scratch):
    """Each sample line matches an output line, in order (with the commands' path mapping)."""
    out_lines = output.split("\n")
    pos = 0
    for sample in rewrite(block.text, scratch).split("\n"):
        if not sample.strip():
            continue
        rx = sample_regex(sample.strip())
        while pos < len(out_lines) and not rx.search(out_lines[pos]):
            pos += 1
        if pos == len(out_lines):
            return "no line of the output matches the sample line %r (as %s); output:\n%s" % (
                sample, rx.pattern, output[-3000:])
        pos += 1
    ranges = block.marker_value("range")
    for spec in (ranges.split(",") if ranges else []):
        word, bounds = shlex.split(spec)
        lo, hi = (float(x) for x in bounds.split(".."))
        found = re.findall(re.escape(word) + r"\s*:?\s*(" + NUMBER + ")", output)
        if not found:
            return "no number after '%s' in the output" % word
        v = float(found[-1].replace(",", "").rstrip("kM%"))
        if not lo <= v <= hi:
            return "%s %g is outside the documented range [%g, %g]" % (word, v, lo, hi)
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rewrite(text, scratch):
    text = re.sub(r"(?<![\w./])/(models|tmp|opt|shared)/", scratch + r"/abs/\1/", text)
    text = re.sub(r"(?<![\w./])/(models|tmp|opt|shared)(?=[\s'\"]|$)", scratch + r"/abs/\1", text)
    text = re.sub(r"ckpt-\d{8}", "ckpt-%08d" % MAX_STEPS, text)
    return text


def make_scratch(source_dir, build_dir):
    scratch = tempfile.mkdtemp(prefix="glossa_docs_")
    repo = os.path.join(scratch, "repo")
    files = subprocess.run(["git", "-C", source_dir, "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in files:
        if not f:
            continue
        src, dst = os.path.join(source_dir, f), os.path.join(repo, f)
        if not os.path.isfile(src):
            continue  # deleted in the work tree
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
    os.symlink(os.path.abspath(build_dir), os.path.join(repo, "build"))
    for d in ("models", "tmp", "opt", "shared"):
        os.makedirs(os.path.join(scratch, "abs", d), exist_ok=True)
    return scratch, repo


def run_shell(block, repo, env, scratch):
    script = rewrite(block.text, scratch)
    server = block.marker_value("server") is not None
    if not server:
        p = subprocess.run(["bash", "-c", "set -eo pipefail\n" + script], cwd=repo, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=BLOCK_TIMEOUT)
        return p.returncode, p.stdout.decode(errors="replace")
    # The first command (with its continuation lines) is the server.
    lines = script.split("\n")
    n = 1
    while lines[n - 1].rstrip().endswith("\\"):
        n += 1
    port_file = os.path.join(scratch, "port_%d" % block.line)
    server_cmd = "\n".join(lines[:n]).split("#")[0].rstrip()
    server_cmd = re.sub(r"--port=\d+", "--port=0 --port_file=" + port_file, server_cmd)
    log_path = os.path.join(scratch, "server_%d.log" % block.line)
    log = open(log_path, "wb")
    srv = subprocess.Popen(["bash", "-c", "exec " + server_cmd], cwd=repo, env=env, stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while not os.path.exists(port_file):
            if srv.poll() is not None or time.time() > deadline:
                return 1, "the server did not start:\n" + open(log_path).read()
            time.sleep(0.1)
        port = open(port_file).read().strip()
        rest = "\n".join(lines[n:]).replace("localhost:8080", "localhost:" + port)
        p = subprocess.run(["bash", "-c", "set -eo pipefail\n" + rest], cwd=repo, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=BLOCK_TIMEOUT)
        out = p.stdout.decode(errors="replace")
        rc = p.returncode
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
        log.close()
    server_out = open(log_path).read()
    if srv.returncode != 0:
        return srv.returncode, "the server exited %d:\n%s" % (srv.returncode, server_out)
    return rc, server_out + out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source_dir")
    ap.add_argument("build_dir")
    ap.add_argument("--only", nargs="*", help="pages to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the blocks and what they get")
    args = ap.parse_args()
    src = os.path.abspath(args.source_dir)
    pages = ["README.md"] + sorted(os.path.relpath(p, src)
                                   for p in glob.glob(os.path.join(src, "docs", "*.md")))
    # Pages that use what another page's commands made run after it.
    order = ["README.md", "docs/tutorial.md", "docs/inference.md"]
    pages = [p for p in order if p in pages] + [p for p in pages if p not in order]
    blocks = parse_blocks(src, pages)
    examples = {f: open(f, encoding="utf-8").read()
                for f in glob.glob(os.path.join(src, "docs", "examples", "*"))}
    python_doc_blocks = "docs/python.md"

    failures = []
    names = {}
    # Static checks first: every block says what it is, C++ is compiled, markers are well formed.
    for b in blocks:
        skip = b.marker_value("skip")
        if skip is not None and not skip:
            failures.append("%s: 'skip' needs a reason" % b.where())
        if b.lang == "":
            failures.append("%s: a fence without a language (bash, cpp, python, text, ...)" %
                            b.where())
        elif b.lang == "cpp" and skip is None:
            if not any(is_slice(b.text, t) for t in examples.values()):
                failures.append("%s: this C++ block is not a slice of any file under "
                                "docs/examples/ (which the tests compile)" % b.where())
        elif b.lang == "python" and skip is None and b.page != python_doc_blocks:
            if not any(is_slice(b.text, t) for t in examples.values()):
                failures.append("%s: this Python block is run by no test" % b.where())
        elif b.lang == "text" and b.marker_value("output") is not None:
            label = b.marker_value("output")
            if not any(x.marker_value("name") == label for x in blocks):
                failures.append("%s: output of '%s', which no block is named" % (b.where(), label))
        elif b.lang not in ("bash", "sh", "cpp", "python", "text", "cmake"):
            failures.append("%s: unknown block language '%s'" % (b.where(), b.lang))
        elif b.lang == "cmake" and skip is None and b.marker_value("slice-of") is None:
            failures.append("%s: a cmake block needs 'slice-of: <file>' or 'skip: <why>'" %
                            b.where())
        if b.marker_value("slice-of") is not None:
            path = os.path.join(src, b.marker_value("slice-of"))
            if not os.path.isfile(path) or not is_slice(b.text, open(path).read()):
                failures.append("%s: not a slice of %s" % (b.where(), b.marker_value("slice-of")))
    if args.list:
        for b in blocks:
            print("%-28s %-7s %s" % (b.where(), b.lang, b.marker or ""))
        return 0

    if args.only:
        pages = [p for p in pages if p in args.only]
    scratch, repo = make_scratch(src, args.build_dir)
    env = dict(os.environ)
    env["GLOSSA_DOCS_MAX_STEPS"] = str(MAX_STEPS)
    env["PATH"] = os.path.join(repo, "build", "bin") + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.path.join(repo, "build", "python")
    env.pop("WORLD_SIZE", None)
    if not shutil.which("srun"):  # Slurm's srun and scontrol, as they behave on one node
        env["PATH"] = os.path.join(src, "tests", "tools", "fake_slurm") + os.pathsep + env["PATH"]
    ran = skipped = 0
    try:
        for b in blocks:
            if b.page not in pages or b.lang not in ("bash", "sh"):
                continue
            if b.marker_value("skip") is not None:
                print("skip %s: %s" % (b.where(), b.marker_value("skip")), flush=True)
                skipped += 1
                continue
            t0 = time.time()
            try:
                rc, out = run_shell(b, repo, env, scratch)
            except subprocess.TimeoutExpired:
                failures.append("%s: still running after %d s" % (b.where(), BLOCK_TIMEOUT))
                continue
            ran += 1
            print("ran  %s (%.0f s, exit %d)" % (b.where(), time.time() - t0, rc), flush=True)
            fails = b.marker_value("fails")
            if fails is not None:
                if rc == 0:
                    failures.append("%s: documented to fail, but exited 0:\n%s" % (b.where(), out))
                elif not re.search(fails, out):
                    failures.append("%s: failed, but not as documented (%s):\n%s" %
                                    (b.where(), fails, out[-3000:]))
            elif rc != 0:
                failures.append("%s: exited %d:\n%s\n%s" % (b.where(), rc, b.text, out[-4000:]))
            if b.marker_value("name") is not None:
                names[b.marker_value("name")] = out
        for b in blocks:
            if b.page not in pages or b.lang != "text" or b.marker_value("output") is None:
                continue
            label = b.marker_value("output")
            if label not in names:
                continue  # its command was not run (--only)
            err = check_output(b, names[label], scratch)
            if err:
                failures.append("%s: %s" % (b.where(), err))
            else:
                print("ok   %s: the sample matches the output of '%s'" % (b.where(), label))
    finally:
        if failures:
            print("scratch copy kept for inspection: %s" % scratch)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    for f in failures:
        print("FAIL " + f)
    print("docs_test: %d blocks run, %d skipped with a reason, %d failures" %
          (ran, skipped, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
