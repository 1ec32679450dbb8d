"""glossa's Python Params and model registry against the C++ ones (pytest; run by CTest with
PYTHONPATH=<build>/python and Debian's /usr/bin/python3)."""
import subprocess

import pytest
import torch

import glossa

def test_model_params_equal_the_cli_text(glossa_cli):
    p = glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Train")
    text = subprocess.run([glossa_cli, "inspect_model", "--model=lm.austen.TransformerLmTiny"],
                          capture_output=True, text=True, check=True).stdout
    # inspect_model prints the params text, then the variables.
    assert text.startswith(p.ToText())


def test_attribute_access_reaches_nested_params():
    p = glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Train")
    assert p.task.stack.num_layers == 2
    p.task.stack.num_layers = 4
    assert p.task.stack.num_layers == 4
    assert "task.stack.num_layers : 4" in p.ToText()
    p.Set(name="renamed")
    assert p.name == "renamed"
    q = p.Copy()
    q.task.stack.num_layers = 6
    assert p.task.stack.num_layers == 4  # a copy is deep
    assert "num_layers" in p.TextDiff(q)


def test_a_handle_keeps_its_params_when_the_parent_entry_is_replaced():
    p = glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Train")
    s = p.task.stack
    other = p.task.stack.Copy()
    other.num_layers = 7
    p.task.stack = other
    # As in Python: s is the object it was taken from, p holds the new one.
    assert s.num_layers == 2
    assert p.task.stack.num_layers == 7
    assert "num_layers : 2" in s.ToText()
    t = p.task
    p.task = p.task.Copy()       # a deeper handle survives its grandparent's replacement too
    assert t.stack.num_layers == 7
    del s, t
    p.task.stack = other         # the replaced values are freed once no handle refers to them


def test_params_from_threads_never_crash():
    import threading
    p = glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Train")
    orig = p.task.stack.Copy()
    errors = []

    def writer():
        try:
            for _ in range(300):
                p.task.stack = orig.Copy()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader():
        try:
            for _ in range(300):
                assert p.task.stack.num_layers == 2
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (writer, writer, reader, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_nesting_depth_is_bounded():
    p = glossa.Params()
    p.Define("v", None, "a value")
    deep = []
    for _ in range(20000):
        deep = [deep]
    with pytest.raises(ValueError, match="may nest at most 100"):
        p.v = deep
    ok = []
    for _ in range(50):
        ok = [ok]
    p.v = ok
    assert p.ToText().count("[") == 51


def test_values_map_both_ways():
    p = glossa.Params()
    p.Define("i", 1, "an int").Define("f", 0.5, "a float").Define("s", "x", "a string")
    p.Define("b", True, "a bool").Define("n", None, "none").Define("l", [1, 2.5, "y"], "a list")
    p.Define("d", {"k": 3}, "a dict").Define("dt", glossa.dtype(torch.bfloat16), "a dtype")
    child = glossa.Params()
    child.Define("dim", 8, "")
    p.Define("child", child, "nested")
    assert (p.i, p.f, p.s, p.b, p.n, p.l, p.d) == (1, 0.5, "x", True, None, [1, 2.5, "y"], {"k": 3})
    assert glossa.to_torch_dtype(p.dt) is torch.bfloat16
    assert p.child.dim == 8
    assert list(p) == ["i", "f", "s", "b", "n", "l", "d", "dt", "child"]
    back = p.Copy()
    back.i, back.s, back.l = 7, "z", []
    back.child.dim = 9
    back.FromText(p.ToText())
    assert back.ToText() == p.ToText() and back.child.dim == 8
    with pytest.raises(TypeError, match="cannot descend into 'child'"):
        bare = glossa.Params()
        bare.Define("child", None, "")
        bare.FromText("child.dim : 8")
    # Lingvo's Hyperparam proto (floats are float32 there: these are exact).
    assert glossa.Params.FromProto(p.ToProto()).ToText() == p.ToText()


def test_errors_are_python_exceptions():
    p = glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Train")
    with pytest.raises(AttributeError, match=r"did you mean: \[num_layers\]"):
        p.task.stack.num_layer = 3
    with pytest.raises(AttributeError, match="num_layr"):
        p.task.stack.num_layr
    with pytest.raises(KeyError, match="TransformerLmTiny"):
        glossa.model_registry.get_params("lm.austen.TransformerLmTni")
    with pytest.raises(KeyError, match="Dev"):
        glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Dve")
    with pytest.raises(ValueError, match="line 1"):
        glossa.Params().FromText("this is not params text")
    with pytest.raises(TypeError, match="cannot be a"):
        glossa.Params().Define("x", object(), "")
    with pytest.raises(ValueError, match="float32"):
        glossa.Params().Define("x", glossa.dtype("float33"), "")


def test_values_python_cannot_hold_are_value_and_type_errors():
    p = glossa.Params()
    p.Define("i", 1, "an int").Define("s", "x", "a string").Define("f", 0.5, "a float")
    p.Define("n", None, "none")
    with pytest.raises(ValueError, match="does not fit in a 64-bit integer"):
        p.i = 2**70
    with pytest.raises(ValueError, match="not valid Unicode"):
        p.s = "a\ud800b"
    with pytest.raises(ValueError, match="does not fit in a 64-bit integer"):
        glossa.Params().Define("big", [1, -2**64], "")
    # A scalar field keeps its kind when set (max_steps = 'abc' would fail only when read).
    with pytest.raises(TypeError, match="param 'i' is a int, not a str"):
        p.i = "abc"
    task = glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Train").task
    with pytest.raises(TypeError, match="param 'max_steps' is a int, not a str"):
        task.train.max_steps = "abc"
    assert task.train.max_steps != "abc"
    p.f = 2            # an int sets a float field
    p.n = "anything"   # a None field takes any kind
    p.i = None
    assert (p.i, p.f, p.n) == (None, 2, "anything")


def test_registry_lists_classes_and_models():
    assert "lm.austen.TransformerLmTiny" in glossa.model_registry.keys()
    assert "glossa.layers.FeedForward" in glossa.registered_classes() or glossa.registered_classes()
    ff = glossa.class_params(glossa.registered_classes()[0])
    assert isinstance(ff, glossa.Params)
