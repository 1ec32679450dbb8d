"""OpenBLAS's kernel set under `import glossa` (python/glossa/__init__.py): the decision the glossa
program makes (glossa/runtime/blas_kernels.h), read from the same cache under the same key, or
measured once by the processes it starts."""
import os
import subprocess
import sys

import glossa
from glossa import _glossa

_SHOW = "import glossa, os; print('coretype', os.environ.get('OPENBLAS_CORETYPE'))"


def _import_glossa(cache):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "GLOSSA_KEEP_BLAS_KERNELS")}
    env["GLOSSA_KERNEL_CHOICE_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-c", _SHOW], capture_output=True, text=True, env=env,
                          timeout=300)


def test_the_key_is_the_programs():
    assert glossa._blas_choice_key(_glossa._blas_core_name()) == _glossa._blas_choice_key()
    # glossa::CpuIdentity's form, the first processor's block only.
    text = ("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
            "stepping\t: 1\nflags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel name\t: Other\n")
    assert glossa._cpu_identity(text).startswith(
        "AMD EPYC (AuthenticAMD family 25 model 17 stepping 1, flags ")
    assert glossa._cpu_identity("").startswith("unknown cpu (? family ? model ? stepping ?")


def test_a_cached_decision_is_applied_and_a_missing_one_measured(tmp_path):
    probe = subprocess.run([sys.executable, "-c", glossa._BLAS_CORE], capture_output=True,
                           text=True, env={k: v for k, v in os.environ.items()
                                           if k != "OPENBLAS_CORETYPE"})
    core = probe.stdout.strip()
    if not core:
        return  # no OpenBLAS behind libblas.so.3: nothing to choose
    key = glossa._blas_choice_key(core)
    other = "Haswell" if core != "Haswell" else "SkylakeX"
    cached = tmp_path / "cached.tsv"
    cached.write_text("%s\t%s\t%s=1,%s=0.5\n" % (key, other, core, other))
    r = _import_glossa(cached)
    assert r.returncode == 0, r.stderr
    assert "coretype %s" % other in r.stdout
    assert "kernel choice: blas_kernels" not in r.stderr  # read, not measured
    measured = tmp_path / "measured.tsv"
    r = _import_glossa(measured)
    assert r.returncode == 0, r.stderr
    assert "kernel choice: blas_kernels (OpenBLAS's kernel set): " in r.stderr
    lines = [l.split("\t") for l in measured.read_text().splitlines()]
    assert len(lines) == 1 and lines[0][0] == key, lines
    chosen = lines[0][1]
    assert "coretype %s" % (chosen if chosen != core else None) in r.stdout
    assert "%s=" % core in lines[0][2]
