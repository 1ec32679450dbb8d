#!/usr/bin/python3
"""The house rules of glossa/ (docs/architecture.md), checked on every file of the library.

  /usr/bin/python3 tests/lint/check_rooms.py <repo>              # the check (CTest rooms_lint)
  /usr/bin/python3 tests/lint/check_rooms.py <repo> --self-test  # it fails on each kind of breach

1. Includes: a file in room R includes only R itself and the rooms R's row of the table in
   docs/architecture.md (between <!-- rooms:begin --> and <!-- rooms:end -->) allows. python/ is a
   room of its own; of its files only python/cli_entry.cc may include tools/.
2. No library file (glossa/**/*.h, *.cc) over 600 lines.
3. No function over 80 lines unless a comment at its top (the comment just above it, or the
   first lines of its body) holds "long function:" and says why it is not split.
4. x86 intrinsics (<immintrin.h>, __builtin_cpu_supports, target attributes) only in
   glossa/kernels/ (and base/crc32c.cc's hardware CRC), and there <immintrin.h> only under
   GLOSSA_X86_SIMD.
5. Tests mirror the code: every glossa/<room>/<file>.cc has tests/<room>/<file>_test.cc or a row
   in tests/COVERAGE.md naming existing tests that cover it.
6. The table allows only edges that exist: every room a row names is included by some file of
   that room (a dependency that is gone leaves the table with it).
7. Headers and sources pair: what a header declares (its classes' members, its free functions)
   is defined in the .cc of its name and at most one more file; a header implemented elsewhere
   names its own .cc among them. A concept that needs a third file gets a header of its own.
8. Layer headers (glossa/layers/*.h) include no glossa/kernels/ header: a kernel's argument
   structs and switches stay in the .cc files that fill them (glossa/layers/fused_step.cc for the
   fused decoding step), so a layer's interface is its Params, theta and FProp (issue 50).

Prints each breach as file:line: message and exits 1 if there is any.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
LONG_MARK = "long function:"
INTRINSICS_OK = {"glossa/base/crc32c.cc"}
PYTHON_TOOLS_OK = {"python/cli_entry.cc"}


def read_rooms(repo):
    path = os.path.join(repo, "docs", "architecture.md")
    text = open(path, encoding="utf-8").read()
    m = re.search(r"<!-- rooms:begin -->(.*?)<!-- rooms:end -->", text, re.S)
    if not m:
        sys.exit(f"{path}: no <!-- rooms:begin --> ... <!-- rooms:end --> table")
    rooms = {}
    order = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("room", "") or set(cells[0]) <= set("-"):
            continue
        name, allowed = cells[0], cells[1].split()
        for a in allowed:
            if a not in rooms:
                sys.exit(f"{path}: room '{name}' may include '{a}', which is not a room above it")
        rooms[name] = set(allowed)
        order.append(name)
    if not rooms:
        sys.exit(f"{path}: the rooms table is empty")
    return rooms


def library_files(repo):
    for top in ("glossa", "python"):
        for dirpath, _, names in os.walk(os.path.join(repo, top)):
            for n in sorted(names):
                if n.endswith((".h", ".cc")):
                    full = os.path.join(dirpath, n)
                    yield os.path.relpath(full, repo).replace(os.sep, "/"), full


def room_of(rel):
    parts = rel.split("/")
    return "python" if parts[0] == "python" else parts[1]


def strip_code(text):
    """The text with comments and string/char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            k = text.find("(", i)
            delim = ")" + text[i + 2:k] + '"'
            j = text.find(delim, k)
            j = n if j < 0 else j + len(delim)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + "".join(ch if ch == "\n" else " " for ch in text[i + 1:j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else|try)\s*(\(|\{|$)")


def long_functions(text):
    """(start line, end line) of each function body opened at namespace or class level."""
    code = strip_code(text)
    # Preprocessor lines end declarations, too (a function often follows an #include or #endif).
    code = "\n".join(" " * len(l) if l.lstrip().startswith("#") else l for l in code.split("\n"))
    stack = []  # (kind, start line)
    header_start = None
    header = []
    line = 1
    for ch in code:
        if ch == "\n":
            line += 1
            header.append(" ")
            continue
        if ch in ";{}":
            if ch == "{":
                h = "".join(header).strip()
                inside_function = any(k in ("func", "other") for k, _ in stack)
                if inside_function:
                    kind = "other"
                elif re.match(r"^(extern\s+\"C\"|namespace\b|(inline\s+)?namespace\b)", h) or h == 'extern ""':
                    kind = "ns"
                elif re.match(r"^(template\s*<.*>\s*)?(class|struct|union|enum)\b", h) and "(" not in h.split(":")[0]:
                    kind = "class"
                elif "(" in h and not h.endswith("=") and not CONTROL.search(h):
                    kind = "func"
                else:
                    kind = "other"
                stack.append((kind, header_start or line))
            elif ch == "}" and stack:
                kind, start = stack.pop()
                if kind == "func":
                    yield start, line
            header = []
            header_start = None
            continue
        if header_start is None and not ch.isspace():
            header_start = line
        header.append(ch)


def function_allowed(lines, start, end):
    above = []
    i = start - 2
    while i >= 0 and lines[i].strip().startswith("//"):
        above.append(lines[i])
        i -= 1
    body_top = lines[start - 1:min(end, start + 4)]
    return any(LONG_MARK in l for l in above + body_top)


def check(repo):
    rooms = read_rooms(repo)
    errors = []
    used = set()  # (room, included room) edges that some include uses
    for rel, full in library_files(repo):
        text = open(full, encoding="utf-8", errors="replace").read()
        lines = text.split("\n")
        room = room_of(rel)
        if room not in rooms:
            errors.append(f"{rel}:1: room '{room}' is not in the table of docs/architecture.md")
            continue
        allowed = rooms[room] | {room}
        if rel in PYTHON_TOOLS_OK:
            allowed = allowed | {"tools"}
        for no, l in enumerate(lines, 1):
            m = re.match(r'\s*#\s*include\s+"glossa/([a-z_]+)/', l)
            if m:
                used.add((room, m.group(1)))
            if m and m.group(1) == "kernels" and rel.startswith("glossa/layers/") and \
                    rel.endswith(".h"):
                errors.append(f"{rel}:{no}: a layer header includes glossa/kernels/: keep the "
                              f"kernel's structs in the .cc that fills them")
            if m and m.group(1) not in allowed:
                errors.append(f"{rel}:{no}: room '{room}' includes glossa/{m.group(1)}/, which "
                              f"its row of docs/architecture.md does not allow")
        if rel.startswith("glossa/") and len(lines) - (1 if text.endswith("\n") else 0) > MAX_FILE_LINES:
            errors.append(f"{rel}:1: {len(lines) - 1} lines, over {MAX_FILE_LINES}: split it by concept")
        for start, end in long_functions(text):
            if end - start + 1 > MAX_FUNCTION_LINES and not function_allowed(lines, start, end):
                errors.append(f"{rel}:{start}: a function of {end - start + 1} lines, over "
                              f"{MAX_FUNCTION_LINES}, with no '// {LONG_MARK} <why>' comment at its top")
        in_kernels = rel.startswith("glossa/kernels/")
        guard = []  # conditions of the enclosing #if blocks
        for no, l in enumerate(lines, 1):
            s = l.strip()
            if s.startswith("#if"):
                guard.append(s)
            elif s.startswith("#else") and guard:
                guard[-1] = "!" + guard[-1]
            elif s.startswith("#endif") and guard:
                guard.pop()
            uses = ("<immintrin.h>" in s and s.startswith("#include")) or \
                "__builtin_cpu_supports" in s or "__attribute__((target(" in s
            if not uses or s.startswith("//"):
                continue
            if not in_kernels and rel not in INTRINSICS_OK:
                errors.append(f"{rel}:{no}: x86 intrinsics outside glossa/kernels/ (put the kernel there)")
            elif in_kernels and s.startswith("#include") and \
                    not any(g.startswith("#if GLOSSA_X86_SIMD") for g in guard) and \
                    not re.search(r"#if !GLOSSA_X86_SIMD\s*\n\s*#error", text):
                errors.append(f"{rel}:{no}: <immintrin.h> outside #if GLOSSA_X86_SIMD")
    for room, allowed in rooms.items():
        for a in sorted(allowed):
            if (room, a) not in used:
                errors.append(f"docs/architecture.md:1: room '{room}' may include '{a}', but no file "
                              f"of {room} does: drop '{a}' from its row of the rooms table")
    return errors + check_coverage(repo) + check_pairing(repo)


def check_coverage(repo):
    errors = []
    path = os.path.join(repo, "tests", "COVERAGE.md")
    rows = {}
    if os.path.exists(path):
        for no, line in enumerate(open(path, encoding="utf-8"), 1):
            m = re.match(r"\|\s*`(glossa/[^`]+\.cc)`\s*\|(.*)\|\s*$", line)
            if m:
                rows[m.group(1)] = (no, m.group(2))
    for rel, _ in library_files(repo):
        if not rel.startswith("glossa/") or not rel.endswith(".cc"):
            continue
        mirror = os.path.join(repo, "tests", rel[len("glossa/"):-3] + "_test.cc")
        if os.path.exists(mirror):
            if rel in rows:
                errors.append(f"tests/COVERAGE.md:{rows[rel][0]}: {rel} has its own test; drop the row")
            continue
        if rel not in rows:
            errors.append(f"{rel}:1: no tests/{rel[len('glossa/'):-3]}_test.cc and no row in tests/COVERAGE.md")
            continue
        no, cell = rows[rel]
        named = re.findall(r"`(tests/[^`]+)`", cell)
        if not named:
            errors.append(f"tests/COVERAGE.md:{no}: the row of {rel} names no test (`tests/...`)")
        for t in named:
            if not os.path.exists(os.path.join(repo, t)):
                errors.append(f"tests/COVERAGE.md:{no}: {t} does not exist")
    return errors



# ---- 7. Headers and sources pair ----

NOT_FUNCTIONS = re.compile(r"^(using|typedef|class|struct|union|enum|namespace|friend|static_assert|"
                           r"return|template\s*<[^>]*>\s*(class|struct))\b")


def namespace_statements(text):
    """(line, head, namespace) of each declaration or definition head at namespace level; a head
    that opens a body ends with '{'; namespace is the enclosing path ("glossa::mt"), with
    "{anon}" for an anonymous one."""
    code = strip_code(text)
    code = "\n".join(" " * len(l) if l.lstrip().startswith("#") else l for l in code.split("\n"))
    stack = []  # namespace names, or None for any other brace
    head, start, line = [], None, 1
    for ch in code:
        if ch == "\n":
            line += 1
            head.append(" ")
            continue
        at_ns = None not in stack
        if ch in ";{}":
            h = " ".join("".join(head).split())
            m = re.match(r"^(?:inline\s+)?namespace\s*([\w:]*)$", h) if at_ns else None
            if ch == "{":
                if m:
                    stack.append(m.group(1) or "{anon}")
                elif at_ns and re.match(r'^extern\s+"', h):
                    stack.append("")
                else:
                    if at_ns and h:
                        yield start, h + " {", "::".join(n for n in stack if n)
                    stack.append(None)
            elif ch == ";" and at_ns and h:
                yield start, h + ";", "::".join(n for n in stack if n)
            elif ch == "}" and stack:
                stack.pop()
            head, start = [], None
            continue
        if start is None and not ch.isspace():
            start = line
        head.append(ch)


def declarator(head):
    """(qualifier chain, name) of a function head, or None when it is not a function."""
    if "(" not in head or NOT_FUNCTIONS.match(head) or "=" in head.split("(")[0]:
        return None
    before = re.sub(r"<[^<>]*>", "", re.sub(r"<[^<>]*>", "", head.split("(")[0])).strip()
    m = re.search(r"((?:\w+::)*)(~?\w+)$", before)
    if not m or re.fullmatch(r"[A-Z][A-Z0-9_]+", m.group(2)) or not re.search(r"[\s*&>]", before.replace(m.group(0), " x")):
        return None
    return m.group(1)[:-2], m.group(2)


def check_pairing(repo):
    classes, functions, files = {}, {}, []  # "ns::Name" -> headers declaring it
    for rel, full in library_files(repo):
        if not rel.startswith("glossa/"):
            continue
        text = open(full, encoding="utf-8", errors="replace").read()
        files.append((rel, text))
        if not rel.endswith(".h"):
            continue
        for _, head, ns in namespace_statements(text):
            if "{anon}" in ns:
                continue
            m = re.match(r"^(?:template\s*<.*>\s*)?(?:class|struct)\s+([\w:]+)(?:\s+final)?\s*[:{]", head)
            if m:
                classes.setdefault(f"{ns}::{m.group(1)}", set()).add(rel)
                continue
            d = declarator(head)
            if d and not d[0] and head.endswith(";"):
                functions.setdefault(f"{ns}::{d[1]}", set()).add(rel)
    implemented = {}  # header -> {source: first line}
    for rel, text in files:
        if not rel.endswith(".cc"):
            continue
        includes = set(re.findall(r'#\s*include\s+"([^"]+)"', text))
        for line, head, ns in namespace_statements(text):
            d = declarator(head)
            if not d or not head.endswith("{") or "{anon}" in ns:
                continue
            chain, name = d
            if chain:
                parts = chain.split("::")
                owners = set()
                for k in range(len(parts), 0, -1):
                    owners = classes.get(f"{ns}::" + "::".join(parts[:k]), set())
                    if owners:
                        break
            else:
                owners = functions.get(f"{ns}::{name}", set())
            for h in owners & includes:
                implemented.setdefault(h, {}).setdefault(rel, line)
    errors = []
    sources_of = {r for r, _ in files}
    for h, sources in sorted(implemented.items()):
        own = h[:-2] + ".cc"
        others = sorted(s for s in sources if s != own)
        where = ", ".join(f"{s}:{sources[s]}" for s in others)
        if len(sources) > 2:
            errors.append(f"{h}:1: implemented across {len(sources)} files ({where} beside "
                          f"{own}): a header pairs with its .cc (and at most one more); give "
                          f"the other concepts headers of their own")
        elif others and own not in sources and own in sources_of:
            errors.append(f"{h}:1: implemented in {where}, not in its own {own}")
        elif len(others) == 2:
            errors.append(f"{h}:1: implemented in {where}, neither of them {own}")
    return errors


def self_test(repo):
    """Each kind of breach, injected into a copy of the tree, makes the check fail."""
    failures = 0
    base = tempfile.mkdtemp(prefix="rooms_lint_")
    try:
        for name, inject, expect in INJECTIONS:
            copy = os.path.join(base, name)
            for top in ("glossa", "python", "docs", "tests"):
                shutil.copytree(os.path.join(repo, top), os.path.join(copy, top),
                                ignore=shutil.ignore_patterns("testdata", "*.safetensors"))
            inject(copy)
            errs = check(copy)
            hit = [e for e in errs if expect in e]
            print(f"self-test {name}: {'caught' if hit else 'MISSED'}"
                  f"{': ' + hit[0] if hit else ''}")
            failures += not hit
        clean = check(repo)
        if clean:
            print("self-test: the tree itself is not clean")
            failures += 1
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return failures


def _append(path, text):
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def _write_sub(path, old, new):
    text = open(path, encoding="utf-8").read()
    assert old in text, (path, old)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new, 1))


def _prepend(path, text):
    old = open(path, encoding="utf-8").read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + old)


INJECTIONS = [
    ("upward_include", lambda d: _prepend(os.path.join(d, "glossa/layers/linear.cc"),
                                          '#include "glossa/runtime/executor.h"\n'),
     "includes glossa/runtime/"),
    ("sideways_include", lambda d: _prepend(os.path.join(d, "glossa/metrics/bleu.cc"),
                                            '#include "glossa/summary/summary.h"\n'),
     "includes glossa/summary/"),
    ("long_file", lambda d: _append(os.path.join(d, "glossa/base/strings.cc"),
                                    "// filler\n" * 700),
     "over 600"),
    ("long_function", lambda d: _append(os.path.join(d, "glossa/base/strings.cc"),
                                        "namespace glossa {\nint Injected(int x) {\n" +
                                        "  x += 1;\n" * 85 + "  return x;\n}\n}  // namespace glossa\n"),
     "a function of 88 lines"),
    ("intrinsics_outside_kernels", lambda d: _prepend(os.path.join(d, "glossa/layers/linear.cc"),
                                                      "#include <immintrin.h>\n"),
     "outside glossa/kernels/"),
    ("untested_file", lambda d: _append(os.path.join(d, "glossa/base/untested.cc"), "int x;\n"),
     "no tests/base/untested_test.cc"),
    ("unused_edge", lambda d: _write_sub(os.path.join(d, "docs/architecture.md"),
                                         "| core | base |", "| core | base kernels |"),
     "room 'core' may include 'kernels', but no file"),
    ("header_across_three_files", lambda d: [
        _append(os.path.join(d, "glossa/base/paired.h"),
                "#pragma once\nnamespace glossa {\nclass Paired {\n public:\n  void A();\n"
                "  void B();\n  void C();\n};\n}  // namespace glossa\n")] + [
        _append(os.path.join(d, f"glossa/base/{stem}.cc"),
                f'#include "glossa/base/paired.h"\nnamespace glossa {{\nvoid Paired::{fn}() {{}}\n'
                f'}}  // namespace glossa\n')
        for stem, fn in (("paired", "A"), ("paired_more", "B"), ("paired_too", "C"))],
     "glossa/base/paired.h:1: implemented across 3 files"),
    ("kernel_structs_in_a_layer_header",
     lambda d: _prepend(os.path.join(d, "glossa/layers/linear.h"),
                        '#include "glossa/kernels/decoder_step.h"\n'),
     "a layer header includes glossa/kernels/"),
    ("unguarded_intrinsics", lambda d: _prepend(os.path.join(d, "glossa/kernels/parallel.cc"),
                                                "#include <immintrin.h>\n"),
     "outside #if GLOSSA_X86_SIMD"),
]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    repo = sys.argv[1]
    if "--self-test" in sys.argv[2:]:
        sys.exit(1 if self_test(repo) else 0)
    errors = check(repo)
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} breach(es) of the house rules (docs/architecture.md)")
        sys.exit(1)
    print("rooms lint: clean")


if __name__ == "__main__":
    main()
