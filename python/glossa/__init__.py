"""Glossa from Python: Lingvo-style Params and the model registry (docs/python.md).

    import glossa
    p = glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Train")
    p.task.stack.num_layers          # attribute access into nested Params
    p.task.train.max_steps = 10      # errors: AttributeError with did-you-mean, ValueError, ...
    print(p.ToText())
"""
import torch  # noqa: F401  (loads libtorch the way python3-torch does, before the extension)

from ._glossa import Params, GlossaError, registered_classes, registered_models, class_params
from ._glossa import nested_map, flatten, pack
from . import _glossa

__all__ = ["Params", "GlossaError", "model_registry", "registered_classes", "dtype"]


def dtype(value):
    """A Params dtype from a torch.dtype (or its name): p.task.fprop_dtype = glossa.dtype(torch.bfloat16)."""
    name = str(value).replace("torch.", "") if isinstance(value, torch.dtype) else str(value)
    return _glossa._DTypeName(name)


def to_torch_dtype(value):
    """The torch.dtype of a Params dtype value."""
    return getattr(torch, value.name)


class _ModelRegistry:
    """Lingvo's model_registry: the registered models and their Params."""

    @staticmethod
    def get_params(key, dataset="Train", override=""):
        return _glossa.get_params(key, dataset, override)

    @staticmethod
    def keys():
        return registered_models()


model_registry = _ModelRegistry()
