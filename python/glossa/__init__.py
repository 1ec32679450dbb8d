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

# OpenBLAS kernels without AVX2 (the kernel sets it settles on in some VMs) run fp32 GEMMs 2-3x
# slower, and give other bits than the glossa program, which re-executes itself with
# OPENBLAS_CORETYPE naming the best kernels (glossa/runtime/cpu_runtime.h). The same here, while
# OpenBLAS is not loaded yet: import glossa before torch.
_OLD_BLAS_CORES = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge",
                   "Barcelona", "Bobcat", "Katmai", "Coppermine", "Northwood", "Banias",
                   "Opteron", "Opteron_SSE3"}
_BLAS_PROBE = """
import ctypes
try:
    f = ctypes.CDLL("libblas.so.3").openblas_get_corename
except (OSError, AttributeError):
    raise SystemExit
f.restype = ctypes.c_char_p
print(f().decode())
"""


def _best_blas_core():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":")[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        return None
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= set(flags):
        return "SkylakeX"
    if {"avx2", "fma"} <= set(flags):
        return "Haswell"
    return None


def _use_best_blas_kernels():
    if os.environ.get("OPENBLAS_CORETYPE") or os.environ.get("GLOSSA_KEEP_BLAS_KERNELS"):
        return
    if "torch" in sys.modules:
        try:
            import ctypes
            f = ctypes.CDLL("libblas.so.3").openblas_get_corename
            f.restype = ctypes.c_char_p
            core = f().decode()
        except (OSError, AttributeError):
            return
        if core in _OLD_BLAS_CORES and _best_blas_core():
            warnings.warn("OpenBLAS runs its %s kernels (no AVX2) because torch was imported "
                          "before glossa: GEMMs run 2-3x slower than in the glossa program. "
                          "Import glossa first, or set OPENBLAS_CORETYPE=%s."
                          % (core, _best_blas_core()), RuntimeWarning, stacklevel=3)
        return
    core = subprocess.run([sys.executable, "-c", _BLAS_PROBE], capture_output=True, text=True,
                          env=dict(os.environ, OPENBLAS_NUM_THREADS="1")).stdout.strip()
    best = _best_blas_core()
    if core in _OLD_BLAS_CORES and best:
        os.environ["OPENBLAS_CORETYPE"] = best


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
