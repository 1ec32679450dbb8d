"""NestedMap <-> Python dicts with torch tensors (glossa.nested_map, flatten, pack)."""
import pytest
import torch

import glossa


def test_tensors_cross_without_copies():
    t = torch.arange(6.0).view(2, 3)
    d = glossa.nested_map({"src": {"ids": t, "n": 3}, "lst": [t, "x", None, 2.5, True]})
    assert d["src"]["ids"].data_ptr() == t.data_ptr()  # the same storage, both ways
    d["src"]["ids"][0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    assert d["src"]["n"] == 3 and d["lst"][1:] == ["x", None, 2.5, True]


def test_flatten_and_pack_follow_lingvo_order():
    structure = {"b": 1, "a": {"y": 2, "x": [3, 4]}}
    assert glossa.flatten(structure) == [("a.x[0]", 3), ("a.x[1]", 4), ("a.y", 2), ("b", 1)]
    assert glossa.pack(structure, [10, 11, 20, 30]) == {"a": {"x": [10, 11], "y": 20}, "b": 30}
    with pytest.raises(ValueError):
        glossa.pack(structure, [1, 2])  # too few leaves


def test_bad_keys_and_values_are_errors():
    with pytest.raises(ValueError, match="reserved"):
        glossa.nested_map({"keys": 1})
    with pytest.raises(ValueError):
        glossa.nested_map({"1abc": 1})
    with pytest.raises(TypeError, match="'a.b' cannot be a object"):
        glossa.nested_map({"a": {"b": object()}})
