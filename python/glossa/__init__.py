"""Glossa from Python: Params, the model registry, layers, training and the Predictor.

    import glossa, torch
    p = glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Train")
    p.task.train.max_steps = 10          # attribute access into nested Params
    glossa.train(p, "/tmp/lm")           # the executor `glossa train` runs

    layer = glossa.class_params("glossa.layers.ProjectionLayer").Set(
        name="proj", input_dim=4, output_dim=2).Instantiate()
    y = layer.FProp(layer.theta, torch.randn(3, 4))   # a torch tensor in the same autograd graph

Model configurations in Python (Lingvo's model_registry):

    @glossa.model_registry.register_single_task_model
    class MyLm:
        def Task(self): ...               # returns glossa.Params
        def Train(self): ...

and `glossa train --model=py:mymodule.MyLm --logdir=...`. See docs/python.md.
"""
import ctypes
import os
import subprocess
import sys
import warnings

# OpenBLAS's kernel set, as the glossa program chooses it (glossa/runtime/blas_kernels.h): the
# sets this CPU supports are timed on fp32 GEMMs, each in a process started with OPENBLAS_CORETYPE
# naming it, and the decision is cached per machine in the kernel-choice cache file. OpenBLAS
# reads OPENBLAS_CORETYPE when it loads, so this runs before torch: import glossa first. A cached
# decision is read here (no process started); a missing one is measured once by a process that
# loads the extension (GLOSSA_BLAS_DECIDING) and probe processes of `import glossa`
# (GLOSSA_BLAS_PROBE).
_BLAS_CORE = """
import ctypes
try:
    f = ctypes.CDLL("libblas.so.3").openblas_get_corename
except (OSError, AttributeError):
    raise SystemExit
f.restype = ctypes.c_char_p
print(f().decode())
"""
_BLAS_DECIDE = """
import sys
import glossa._glossa as g
chosen, description = g._choose_blas_kernels([sys.executable, "-c", "import glossa"])
print(chosen)
print("kernel choice: blas_kernels (OpenBLAS's kernel set): " + description, file=sys.stderr)
"""


def _cpu_identity(cpuinfo):
    """glossa::CpuIdentity (glossa/kernels/kernel_choice.h) of /proc/cpuinfo's text."""
    name, vendor, family, model, stepping, flags = "unknown cpu", "", "", "", "", ""
    for line in cpuinfo.split("\n"):
        colon = line.find(":")
        if colon < 0:
            if flags:
                break  # the end of the first processor's block
            continue
        k, v = line[:colon].strip(), line[colon + 1:].strip()
        if k == "model name" and name == "unknown cpu":
            name = v
        elif k == "vendor_id" and not vendor:
            vendor = v
        elif k == "cpu family" and not family:
            family = v
        elif k == "model" and not model:
            model = v
        elif k == "stepping" and not stepping:
            stepping = v
        elif k == "flags" and not flags:
            flags = v
    h = 1469598103934665603
    for c in flags.encode():
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%s (%s family %s model %s stepping %s, flags %s)" % (
        name, vendor or "?", family or "?", model or "?", stepping or "?", ("%016x" % h)[:8])


def _blas_choice_key(core):
    """glossa::BlasChoiceKey() for OpenBLAS's own pick `core`."""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = _cpu_identity(f.read())
    except OSError:
        cpu = _cpu_identity("")
    return "%s | blas probe 1 | cores %d | openblas %s | blas_kernels" % (cpu, os.cpu_count(), core)


def _kernel_choice_cache():
    """The kernel-choice cache file (glossa/kernels/kernel_choice.h), or None."""
    env = os.environ.get("GLOSSA_KERNEL_CHOICE_CACHE")
    if env is not None:
        return None if env in ("", "none") else env
    for base, sub in ((os.environ.get("XDG_CACHE_HOME"), "glossa"),
                      (os.environ.get("HOME"), os.path.join(".cache", "glossa"))):
        if base:
            return os.path.join(base, sub, "kernel_choices.tsv")
    return None


def _cached_blas_choice(key):
    path = _kernel_choice_cache()
    if path is None:
        return None
    try:
        with open(path, errors="replace") as f:
            lines = f.read().split("\n")
    except OSError:
        return None
    chosen = None
    for line in lines:
        fields = line.split("\t")
        if len(fields) == 3 and fields[0] == key and fields[1].isalnum():
            chosen = fields[1]
    return chosen


def _use_best_blas_kernels():
    if os.environ.get("GLOSSA_BLAS_PROBE"):  # a probe process (see above): time, print, exit
        import torch  # noqa: F401  (the extension needs libtorch loaded first)
        from . import _glossa as g
        g._run_blas_probe()
        os._exit(0)
    if (os.environ.get("GLOSSA_BLAS_DECIDING") or os.environ.get("OPENBLAS_CORETYPE")
            or os.environ.get("GLOSSA_KEEP_BLAS_KERNELS")):
        return
    if "torch" in sys.modules:
        try:
            f = ctypes.CDLL("libblas.so.3").openblas_get_corename
            f.restype = ctypes.c_char_p
            core = f().decode()
        except (OSError, AttributeError):
            return
        # OpenBLAS was loaded by torch: too late to choose. Say so when the choice differs.
        chosen = _cached_blas_choice(_blas_choice_key(core))
        if chosen and chosen != core:
            warnings.warn("OpenBLAS runs its %s kernels because torch was imported before glossa; "
                          "the glossa program runs %s on this machine (measured). Import glossa "
                          "first, or set OPENBLAS_CORETYPE=%s." % (core, chosen, chosen),
                          RuntimeWarning, stacklevel=3)
        return
    core = subprocess.run([sys.executable, "-c", _BLAS_CORE], capture_output=True, text=True,
                          env=dict(os.environ, OPENBLAS_NUM_THREADS="1")).stdout.strip()
    if not core:
        return
    chosen = _cached_blas_choice(_blas_choice_key(core))
    if chosen is None:
        decided = subprocess.run([sys.executable, "-c", _BLAS_DECIDE], stdout=subprocess.PIPE,
                                 text=True, env=dict(os.environ, GLOSSA_BLAS_DECIDING="1"))
        chosen = decided.stdout.strip() if decided.returncode == 0 else ""
    if chosen and chosen != core:
        os.environ["OPENBLAS_CORETYPE"] = chosen


_use_best_blas_kernels()

import torch  # noqa: E402  (loads libtorch the way python3-torch does, before the extension)

from ._glossa import (  # noqa: E402
    GlossaError, InputGenerator, EvalMode, Layer, Params, class_params, flatten, nested_map, pack,
    registered_classes, registered_models)
from . import _glossa  # noqa: E402

__version__ = _glossa.__version__

__all__ = [
    "EvalMode", "GlossaError", "InputGenerator", "Layer", "Params", "Predictor", "class_params",
    "dtype", "flatten", "load_checkpoint", "model_registry", "nested_map", "pack",
    "registered_classes", "registered_models", "run_cli", "to_torch_dtype", "train",
]


def dtype(value):
    """A Params dtype from a torch.dtype (or its name): p.task.fprop_dtype = glossa.dtype(torch.bfloat16)."""
    name = str(value).replace("torch.", "") if isinstance(value, torch.dtype) else str(value)
    return _glossa._DTypeName(name)


def to_torch_dtype(value):
    """The torch.dtype of a Params dtype value."""
    return getattr(torch, value.name)


def train(model_params, logdir, **kwargs):
    return _glossa.train(model_params, os.fspath(logdir), **kwargs)


train.__doc__ = _glossa.train.__doc__


def run_cli(args):
    """Runs `glossa <args>` in this process (e.g. ["export", "--model=...", "--logdir=...",
    "--out=..."]), with the models registered here; returns its exit status."""
    return _glossa.cli_main(["glossa"] + list(args), [sys.executable, "-m", "glossa"])


def load_library(path):
    """Loads a shared library of your own C++ layers, models or input generators (as
    torch.ops.load_library does): its GLOSSA_REGISTER_CLASS registrations join the registry, so
    class_params() finds them, and their layers are called from Python through the uniform call
    (FPropMap) with no binding code."""
    ctypes.CDLL(os.fspath(path), mode=ctypes.RTLD_GLOBAL)


def load_checkpoint(prefix):
    """A checkpoint (e.g. logdir/train/ckpt-00000010) as {variable name: tensor}, with its
    global_step and optimizer slots."""
    return _glossa.load_checkpoint(os.fspath(prefix))


class Predictor(_glossa.Predictor):
    __doc__ = _glossa.Predictor.__doc__

    def __init__(self, bundle_dir, checkpoint="", **kwargs):
        super().__init__(os.fspath(bundle_dir), os.fspath(checkpoint), **kwargs)


def _model_key(cls):
    return "py:%s.%s" % (cls.__module__, cls.__qualname__)


class _ModelRegistry:
    """Lingvo's model_registry: the registered models, their Params, and Python registrations."""

    @staticmethod
    def get_params(key, dataset="Train", override=""):
        """A model's Params for `dataset` (with 'key : value' override lines). `key` is a
        registry key ("lm.austen.TransformerLmTiny", "py:mymodule.MyLm") or a registered class."""
        if isinstance(key, type):
            key = _model_key(key)
        return _glossa.get_params(key, dataset, override)

    @staticmethod
    def key_of(cls):
        """The key a Python model class registers under: "py:<module>.<Class>"."""
        return _model_key(cls)

    @staticmethod
    def keys():
        """Every registered model key (Python ones as "py:<module>.<Class>")."""
        return registered_models()

    @staticmethod
    def register_single_task_model(cls):
        """Registers a class whose Task() returns the task's Params and whose dataset methods
        (Train(), Dev(), Test(), ... : any method named with a capital) return input Params;
        ProgramSchedule() is optional. Its key is "py:<module>.<Class>"."""
        _glossa._register_model(_model_key(cls), cls, False)
        return cls

    @staticmethod
    def register_multitask_model(cls):
        """Registers a class whose Model() returns MultiTaskModel Params and whose dataset
        methods return Params with one input per task."""
        _glossa._register_model(_model_key(cls), cls, True)
        return cls

    # Lingvo's spelling.
    RegisterSingleTaskModel = register_single_task_model
    RegisterMultiTaskModel = register_multitask_model
    GetParams = get_params


model_registry = _ModelRegistry()
