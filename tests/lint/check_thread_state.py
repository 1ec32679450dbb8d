#!/usr/bin/env python3
"""Keeps every thread-crossing context in glossa/base/thread_state.h's ThreadState (issue 49).

1. Every `thread_local` under glossa/ and python/ is either a ThreadState slot, its declaration
   line saying `// ThreadState: "<slot>"` and the same file registering that variable with
   `GLOSSA_THREAD_STATE_SLOT("<slot>", <variable>)`, or marked `per-thread` (a cache, or a flag
   that must not cross threads) on its line or in the comment just above it (for a group of
   consecutive declarations, above the first).
2. Every GLOSSA_THREAD_STATE_SLOT names a thread_local its file declares, and no slot name is
   registered twice.
3. Threads start through StartThread(state, fn): no `std::thread(...)` construction elsewhere
   (glossa/base/thread_state.h defines StartThread; glossa/kernels/parallel.cc's KernelPool
   workers run arithmetic chunks whose callers decided every context-dependent choice before the
   loop, see glossa/kernels/parallel.h), and no `emplace_back(` of a lambda into a
   std::vector<std::thread>.

4. No thread-local scope decides what is built: the constructors of glossa/layers/ and
   glossa/tasks/ read no ambient context (no `Current...()`, `IsEvalMode()`, step or seed getter,
   kernel-mode probe): a layer's build inputs are its Params and its BuildContext
   (glossa/layers/mesh.h), which BaseLayer copies from its parent.
5. No thread-local scope selects arithmetic: glossa/kernels/ registers no ThreadState slot (what
   a loaded model computes is its inference plan, glossa/kernels/compute_plan.h, or a measured
   kernel choice), and nothing under glossa/ keys a cache by tensor storage (prepared weights are
   keyed by variable name).

Usage: check_thread_state.py <source root> [--self-test]; exits 1 listing each offence as
file:line: what.
"""
import pathlib
import re
import sys

EXEMPT_THREADS = {"glossa/base/thread_state.h", "glossa/kernels/parallel.cc"}
DECL = re.compile(r"\bthread_local\b[^;]*?\b(\w+)\s*(?:[=({;]|\[)")
SLOT = re.compile(r'GLOSSA_THREAD_STATE_SLOT\(\s*"([^"]+)"\s*,\s*(\w+)\s*\)')
ANNOT = re.compile(r'ThreadState:\s*"([^"]+)"')
THREAD_CTOR = re.compile(r"\bstd::thread\s*\w*\s*[({]|\bstd::jthread\b|\bstd::async\s*\(|"
                         r"make_(?:unique|shared)<std::thread>")
VEC_THREADS = re.compile(r"std::(?:vector|deque|list)<std::thread>\s+(\w+)")


def code_part(line):
    i = line.find("//")
    return line if i < 0 else line[:i]


def check_file(rel, text, header_text=""):
    errors = []
    lines = text.split("\n")
    slots = {}
    for m in SLOT.finditer("\n".join(code_part(l) for l in lines)):
        slots.setdefault(m.group(1), []).append(m.group(2))
    declared = set()
    for i, line in enumerate(lines):
        code = code_part(line)
        if "thread_local" not in code or "#define" in code:
            continue
        m = DECL.search(code)
        if not m:
            errors.append(f"{rel}:{i + 1}: a thread_local this lint cannot parse")
            continue
        var = m.group(1)
        declared.add(var)
        annot = ANNOT.search(line)
        if annot:
            slot = annot.group(1)
            if var not in slots.get(slot, []):
                errors.append(f'{rel}:{i + 1}: thread_local {var} says ThreadState: "{slot}" but '
                              f'the file has no GLOSSA_THREAD_STATE_SLOT("{slot}", {var})')
            continue
        # The comment on the line, or the comment lines directly above it.
        notes = [line]
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("//"):
            notes.append(lines[j])
            j -= 1
        if not any("per-thread" in n for n in notes):
            errors.append(f"{rel}:{i + 1}: thread_local {var} is neither a ThreadState slot "
                          f'(// ThreadState: "<slot>" and GLOSSA_THREAD_STATE_SLOT) nor marked '
                          f"per-thread (a cache, or a flag that must not cross threads)")
    for slot, variables in slots.items():
        for var in variables:
            if var not in declared:
                errors.append(f'{rel}: GLOSSA_THREAD_STATE_SLOT("{slot}", {var}) names no '
                              f"thread_local of this file")
    if rel not in EXEMPT_THREADS:
        vectors = set(VEC_THREADS.findall(text)) | set(VEC_THREADS.findall(header_text))
        for i, line in enumerate(lines):
            code = code_part(line)
            if THREAD_CTOR.search(code):
                errors.append(f"{rel}:{i + 1}: a thread started without StartThread "
                              f"(glossa/base/thread_state.h): say which ThreadState it runs under")
            for v in vectors:
                if re.search(r"\b" + v + r"\.(?:emplace_back|push_back|emplace)\(", code) and \
                        "StartThread(" not in code:
                    errors.append(f"{rel}:{i + 1}: a thread started without StartThread into {v}")
    return errors, slots


CTOR = re.compile(r"^(\w+)::\1\([^;{]*?\)\s*(?::[^{;]*)?\{", re.M)
AMBIENT = re.compile(r"\b(?:Current\w*|IsEvalMode|GetGlobalStep|GetStepSeed|GetIncStepSeed)\s*\(")
STORAGE_KEY = re.compile(r"\b(?:unsafeGetStorageImpl|getWeakStorageImpl)\b|"
                         r"weak_intrusive_ptr<\s*c10::StorageImpl")


def check_arithmetic_modes(rel, text):
    """Rule 5: no kernel mode in a thread slot, no cache keyed by tensor storage."""
    errors = []
    for i, line in enumerate(text.split("\n")):
        code = code_part(line)
        if rel.startswith("glossa/kernels/") and SLOT.search(code):
            errors.append(f"{rel}:{i + 1}: a ThreadState slot in the kernels selects arithmetic by "
                          f"thread: put the choice in the inference plan "
                          f"(glossa/kernels/compute_plan.h)")
        if STORAGE_KEY.search(code):
            errors.append(f"{rel}:{i + 1}: a cache keyed by tensor storage: key prepared weights "
                          f"by variable name (ComputePlan)")
    return errors
BUILD_DIRS = ("glossa/layers/", "glossa/tasks/")


def check_constructors(rel, text):
    """Rule 4: a layer's constructor reads no ambient (thread-local) context."""
    if not rel.startswith(BUILD_DIRS) or not rel.endswith(".cc"):
        return []
    errors = []
    for m in CTOR.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = text[m.end():i]
        for line_no, line in enumerate(body.split("\n")):
            a = AMBIENT.search(code_part(line))
            if a:
                at = text.count("\n", 0, m.end()) + line_no + 1
                errors.append(f"{rel}:{at}: {m.group(1)}'s constructor reads ambient context "
                              f"({a.group(0).rstrip('(')}): what a layer builds must come from "
                              f"its Params and build_context()")
    return errors


def check_tree(root):
    root = pathlib.Path(root)
    errors, seen = [], {}
    for base in ("glossa", "python"):
        for path in sorted((root / base).rglob("*")):
            if path.suffix not in (".cc", ".h"):
                continue
            rel = str(path.relative_to(root))
            header = path.with_suffix(".h")
            header_text = header.read_text(encoding="utf-8") if path.suffix == ".cc" and \
                header.exists() else ""
            text = path.read_text(encoding="utf-8")
            errs, slots = check_file(rel, text, header_text)
            errors += errs + check_constructors(rel, text) + check_arithmetic_modes(rel, text)
            for slot in slots:
                if slot in seen and seen[slot] != rel:
                    errors.append(f'{rel}: slot "{slot}" is registered in {seen[slot]} too')
                seen.setdefault(slot, rel)
    return errors


def self_test():
    """Each kind of breach is caught, and the allowed forms pass."""
    ok = ('thread_local int a = 0;  // ThreadState: "a"\n'
          'GLOSSA_THREAD_STATE_SLOT("a", a);\n'
          "// per-thread cache: buffers\n"
          "thread_local std::vector<float> b;\n"
          "thread_local std::vector<float> c;  // per-thread cache\n"
          "std::thread t = StartThread(ThreadState::Fresh(), [] {});\n"
          "std::vector<std::thread> ts;\n"
          "ts.push_back(StartThread(ThreadState::Fresh(), [] {}));\n"
          "int n = std::thread::hardware_concurrency();\n")
    cases = {
        "unmarked": "thread_local int x = 0;\n",
        "unregistered": 'thread_local int x = 0;  // ThreadState: "x"\n',
        "wrong variable": ('thread_local int x = 0;  // ThreadState: "x"\n'
                           'GLOSSA_THREAD_STATE_SLOT("x", y);\n'),
        "raw thread": "std::thread t([] {});\n",
        "raw temporary thread": "std::thread([] {}).detach();\n",
        "vector of raw threads": ("std::vector<std::thread> ts;\n"
                                  "ts.emplace_back([] {});\n"),
        "member function thread": ("std::vector<std::thread> ts;\n"
                                   "ts.emplace_back(&X::Loop, this);\n"),
        "braced thread": "std::thread t{[] {}};\n",
        "jthread": "std::jthread t([] {});\n",
        "async": "auto f = std::async(std::launch::async, [] {});\n",
        "heap thread": "auto t = std::make_unique<std::thread>([] {});\n",
        "unmarked under a marked one": ("// per-thread cache: buffers\n"
                                        "thread_local std::vector<float> b;\n"
                                        "thread_local Ctx* ctx = nullptr;\n"),
    }
    failures = []
    errs, _ = check_file("glossa/x/bad.cc", "threads_.emplace_back([this] { Loop(); });\n",
                         "std::vector<std::thread> threads_;\n")
    if not errs:
        failures.append("not caught: a raw thread into a vector its header declares")
    errs, _ = check_file("glossa/x/ok.cc", ok)
    if errs:
        failures.append(f"allowed forms flagged: {errs}")
    for name, src in cases.items():
        errs, _ = check_file("glossa/x/bad.cc", src)
        if not errs:
            failures.append(f"not caught: {name}")
    built = ("Foo::Foo(const glossa::Params& p) : BaseLayer(p) {\n"
             "  if (p.GetBool(\"x\")) { CreateVariable(\"w\", {}); }\n"
             "  axis_ = build_context().axis(\"model\");\n}\n")
    if check_constructors("glossa/layers/ok.cc", built):
        failures.append("a constructor reading its build context flagged")
    for read in ("CurrentMeshAxis(\"expert\")", "IsEvalMode()", "CurrentBatchShard()",
                 "VariableCollectionScope::Current()"):
        src = built.replace("build_context().axis(\"model\")", read)
        if not check_constructors("glossa/layers/bad.cc", src):
            failures.append(f"not caught: a constructor reading {read}")
    slot = 'thread_local int d = 0;  // ThreadState: "d"\nGLOSSA_THREAD_STATE_SLOT("d", d);\n'
    if not check_arithmetic_modes("glossa/kernels/bad.cc", slot):
        failures.append("not caught: a ThreadState slot in the kernels")
    if check_arithmetic_modes("glossa/runtime/ok.cc", slot):
        failures.append("a ThreadState slot outside the kernels flagged")
    for keyed in ("CacheKey key{w.storage().unsafeGetStorageImpl(), 0};",
                  "c10::weak_intrusive_ptr<c10::StorageImpl> storage;"):
        if not check_arithmetic_modes("glossa/layers/bad.cc", keyed):
            failures.append(f"not caught: a storage-keyed cache ({keyed})")
    return failures


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    if "--self-test" in sys.argv:
        failures = self_test()
        for f in failures:
            print(f)
        print("self-test:", "FAILED" if failures else "ok")
        return 1 if failures else 0
    errors = check_tree(sys.argv[1])
    for e in errors:
        print(e)
    print(f"thread-state lint: {len(errors)} offence(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
