"""`python3 -m glossa <command> ...`: the glossa command line, able to run Python model
configurations (--model=py:<module>.<Class>, imported from the current directory or PYTHONPATH).
`glossa train --model=py:...` runs this."""
import importlib
import os
import sys
import traceback

import glossa
from glossa import _glossa


def _model_flag(argv):
    for i, a in enumerate(argv):
        if a.startswith("--model="):
            return a[len("--model="):]
        if a == "--model" and i + 1 < len(argv):
            return argv[i + 1]
    return ""


def _import_model(spec):
    """Imports py:<module>.<Class> and registers the class if its module did not."""
    module_name, _, class_name = spec[len("py:"):].rpartition(".")
    if not module_name or not class_name:
        raise SystemExit("glossa: --model=%s: expected py:<module>.<Class>" % spec)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001  (the user's module: say what failed, exit 1)
        traceback.print_exc()
        raise SystemExit("glossa: --model=%s: cannot import module '%s'" % (spec, module_name))
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        classes = sorted(n for n, v in vars(module).items() if isinstance(v, type))
        raise SystemExit("glossa: --model=%s: module '%s' has no class '%s' (its classes: %s)" %
                         (spec, module_name, class_name, ", ".join(classes) or "none"))
    if glossa._model_key(cls) != spec:
        # Imported under another name (e.g. a re-export): register under the name asked for.
        _glossa._register_model(spec, cls, hasattr(cls, "Model") and not hasattr(cls, "Task"))
    elif spec not in glossa.registered_models():
        _glossa._register_model(spec, cls, hasattr(cls, "Model") and not hasattr(cls, "Task"))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    spec = _model_flag(argv)
    if spec.startswith("py:"):
        _import_model(spec)
    return _glossa.cli_main(["glossa"] + argv, [sys.executable, "-m", "glossa"])


if __name__ == "__main__":
    sys.exit(main())
