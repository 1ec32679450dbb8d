"""The type stubs name everything the extension and the package define, and help() reads."""
import ast
import os
import pydoc

import glossa
from glossa import _glossa

PKG = os.path.dirname(glossa.__file__)


def _stub(name):
    with open(os.path.join(PKG, name)) as f:
        tree = ast.parse(f.read())
    defs, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            defs.add(node.name)
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} | {
                n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
        elif isinstance(node, ast.ImportFrom):
            defs.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.AnnAssign):
            defs.add(node.target.id)
    return defs, classes


def test_extension_stub_is_complete():
    defs, classes = _stub("_glossa.pyi")
    assert os.path.exists(os.path.join(PKG, "py.typed"))
    for name in dir(_glossa):
        if name.startswith("__") and name != "__version__":
            continue
        obj = getattr(_glossa, name)
        if isinstance(obj, type):
            assert name in classes, "class %s missing from _glossa.pyi" % name
            for member in vars(obj):
                if member.startswith("__") and member not in (
                        "__getattr__", "__setattr__", "__call__", "__iter__", "__next__",
                        "__enter__", "__exit__", "__len__", "__contains__", "__eq__"):
                    continue
                assert member in classes[name], "%s.%s missing from _glossa.pyi" % (name, member)
        else:
            assert name in defs, "%s missing from _glossa.pyi" % name


def test_package_stub_is_complete():
    defs, classes = _stub("__init__.pyi")
    for name in glossa.__all__:
        assert name in defs or name in classes, "%s missing from __init__.pyi" % name
    for member in ("get_params", "keys", "register_single_task_model", "register_multitask_model"):
        assert member in classes["_ModelRegistry"]


def test_help_reads():
    assert "Lingvo's Params" in pydoc.render_doc(glossa.Params)
    text = pydoc.render_doc(glossa.Layer)
    assert "FProp(theta" in text and "backward()" in text
    assert "KeyboardInterrupt" in glossa.train.__doc__
    assert "Thread-safe" in pydoc.render_doc(glossa.Predictor)
    p = glossa.class_params("glossa.layers.ProjectionLayer")
    assert p.Doc("input_dim") == "Depth of the input."
    assert "# Depth of the input." in p.ToTextWithDocs()
    assert "input_dim" in dir(p)  # editors complete the keys
