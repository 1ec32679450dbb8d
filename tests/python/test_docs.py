"""Every Python block of docs/python.md runs, in order, in one namespace."""
import os
import re

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")


def test_docs_python_examples_run(tmp_path, monkeypatch, capsys):
    with open(DOC) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) >= 6
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "glossa_docs"}
    for i, block in enumerate(blocks):
        exec(compile(block, "docs/python.md block %d" % (i + 1), "exec"), namespace)
    out = capsys.readouterr().out
    assert "py:glossa_docs.AustenSmall True" in out
    assert "loss after 150 steps" in out
