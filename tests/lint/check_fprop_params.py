#!/usr/bin/env python3
"""Keeps Params and child lookups out of the computation: no `params()`, `train_params()`,
`GetChild(`, `GetChildAs<` or `GetChildren(` inside the bodies of FProp, FPropBlock, ExtendStep,
ComputePredictions, ComputeLoss, Logits or the helpers they call (Norm, Residual, Attend, Dropout,
Sample, ReverseAndGrad) anywhere under glossa/.

Layers read their Params into members in the constructor (Lingvo's __init__); the per-call path
reads members only. The export rooms, which write a layer's forward in another format
(glossa/layers/onnx_export.cc, torchscript_export.cc: EXPORT_ROOMS), are checked whole: each of
their lines is part of a forward. Usage: check_fprop_params.py <source root>; exits 1 listing each offence as
file:line: function.
"""
import pathlib
import re
import sys

FUNCS = (r"(FProp\w*|ExtendStep|ComputePredictions|ComputeLoss|Logits|Norm|Residual|Attend|"
         r"Dropout|Sample|ReverseAndGrad)")
# What the per-call path must not do: look up Params, or find children by name (keep the typed
# handles CreateChild<T> returns instead).
FORBIDDEN = re.compile(r"\b(?:train_params|params)\(\)|\bGetChild\s*\(|\bGetChildAs\s*<|"
                       r"\bGetChildren\s*\(")
# Files every line of which writes a forward (issue 50: the exports read what FProp reads).
EXPORT_ROOMS = ("glossa/layers/onnx_export.cc", "glossa/layers/torchscript_export.cc")
# A definition: `Class::Name(` (out of line) or `Name(` in a class body followed by a body.
DEF = re.compile(r"\b(?:\w+::)?" + FUNCS + r"\s*\(")


def strip_comments_and_strings(src):
    """Blanks comments and string/char literals, keeping offsets and newlines."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def bodies(src):
    """Yields (name, start offset, body text) for each definition of a checked function."""
    for m in DEF.finditer(src):
        # Skip calls: a definition's parameter list is followed by qualifiers and then `{`.
        depth, i = 0, m.end() - 1
        while i < len(src):
            if src[i] == "(":
                depth += 1
            elif src[i] == ")":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        tail = re.match(r"\s*(const)?\s*(override|final)?\s*(noexcept)?\s*\{", src[i + 1 :])
        if not tail:
            continue
        start = i + 1 + tail.end() - 1
        depth, j = 0, start
        while j < len(src):
            if src[j] == "{":
                depth += 1
            elif src[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        yield m.group(1), m.start(), src[start : j + 1]


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    offences = []
    files = sorted(list(root.glob("glossa/**/*.cc")) + list(root.glob("glossa/**/*.h")))
    if not files:
        print(f"check_fprop_params: no sources under {root}/glossa", file=sys.stderr)
        return 2
    for room in EXPORT_ROOMS:
        if not (root / room).is_file():
            print(f"check_fprop_params: {room} is gone; update EXPORT_ROOMS", file=sys.stderr)
            return 2
    for path in files:
        src = strip_comments_and_strings(path.read_text())
        rel = path.relative_to(root).as_posix()
        whole = [("the export room", 0, src)] if rel in EXPORT_ROOMS else []
        for name, pos, body in whole + list(bodies(src)):
            found = sorted({m.group(0).rstrip("(< ") for m in FORBIDDEN.finditer(body)})
            if found:
                if whole and name != "the export room":
                    continue  # reported once, for the whole file
                line = src.count("\n", 0, pos + (body.find(found[0]) if whole else 0)) + 1
                offences.append(
                    f"{path.relative_to(root)}:{line}: {name} calls {', '.join(found)}")
    for o in offences:
        print(o)
    if offences:
        print(f"{len(offences)} FProp bodies look up Params or children; read Params into "
              "members and keep CreateChild<T> handles in the constructor instead", file=sys.stderr)
        return 1
    print(f"check_fprop_params: {len(files)} files, no Params or child lookups in FProp bodies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
