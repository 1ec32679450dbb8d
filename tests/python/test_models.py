"""Python model configurations trained by the C++ runtime: `glossa train --model=py:...`,
`python3 -m glossa train ...` and glossa.train() all write the checkpoint the CLI writes for the
same Params and seed."""
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import glossa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pymodels  # noqa: E402  (registers py:pymodels.TinyLm)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = HERE + ":" + env.get("PYTHONPATH", "")
    return env


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=HERE, **kw)


def _assert_same_checkpoint(a, b):
    ta, tb = glossa.load_checkpoint(a), glossa.load_checkpoint(b)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name


def test_registered_under_its_module_and_name():
    assert "py:pymodels.TinyLm" in glossa.model_registry.keys()
    p = glossa.model_registry.get_params(pymodels.TinyLm, "Dev")
    assert p.task.stack.mdl_dim == 16
    assert p.task.input.repeat_count == 1
    assert p.task.input.file_pattern.endswith("austen/dev.txt")


def test_python_config_trains_to_the_cli_checkpoint(glossa_cli, tmp_path):
    flags = ["--random_seed=5", "--intra_op_threads=1"]
    # 1. The glossa program, on the Python class (it re-runs itself as python3 -m glossa).
    r = _run([glossa_cli, "train", "--model=py:pymodels.TinyLm", "--logdir=%s" % (tmp_path / "py")]
             + flags)
    assert r.returncode == 0, r.stderr
    assert "step 6/6" in r.stdout
    # 2. The C++ model with the Python model's Params as an override file: the same Params.
    text = glossa.model_registry.get_params("py:pymodels.TinyLm", "Train").ToText()
    (tmp_path / "params.txt").write_text(text)
    r = _run([glossa_cli, "train", "--model=lm.austen.TransformerLmTiny",
              "--model_params_file_override=%s" % (tmp_path / "params.txt"),
              "--logdir=%s" % (tmp_path / "cli")] + flags)
    assert r.returncode == 0, r.stderr
    r_py = (tmp_path / "py" / "control" / "params.txt").read_text()
    assert r_py == (tmp_path / "cli" / "control" / "params.txt").read_text()
    _assert_same_checkpoint(tmp_path / "py" / "train" / "ckpt-00000006",
                            tmp_path / "cli" / "train" / "ckpt-00000006")
    # 3. glossa.train in this process (seeded the same way as --random_seed).
    p = glossa.model_registry.get_params("py:pymodels.TinyLm", "Train")
    p.random_seed = 5
    p.task.random_seed = 5
    lines = []
    step = glossa.train(p, str(tmp_path / "inproc"), intra_op_threads=1, log=lines.append)
    assert step == 6
    assert any(line.startswith("step 6/6") for line in lines), lines
    _assert_same_checkpoint(tmp_path / "inproc" / "train" / "ckpt-00000006",
                            tmp_path / "cli" / "train" / "ckpt-00000006")
    # Resuming at max_steps does nothing more.
    assert glossa.train(p, str(tmp_path / "inproc"), intra_op_threads=1, log=lines.append) == 6
    assert glossa.train(p, str(tmp_path / "inproc"), max_steps=9, intra_op_threads=1,
                        verbosity=0) == 9


def test_python_m_glossa_and_undecorated_classes(tmp_path):
    r = _run([sys.executable, "-m", "glossa", "inspect_model", "--model=py:pymodels.Undecorated"])
    assert r.returncode == 0, r.stderr
    assert "task.stack.mdl_dim : 16" in r.stdout
    r = _run([sys.executable, "-m", "glossa", "list_models", "--model=py:pymodels.TinyLm"])
    assert r.returncode != 0  # list_models takes no --model: the CLI's own error
    r = _run([sys.executable, "-m", "glossa", "list_models"])
    assert r.returncode == 0 and "lm.austen.TransformerLmTiny" in r.stdout


@pytest.mark.parametrize("model,message", [
    ("py:pymodels.Nope", "module 'pymodels' has no class 'Nope' (its classes: Raises, "
                         "ReturnsWrongType, TinyLm, TwoLms, Undecorated)"),
    ("py:no_such_module.X", "cannot import module 'no_such_module'"),
    ("py:Lonely", "expected py:<module>.<Class>"),
    ("py:pymodels.ReturnsWrongType", "model py:pymodels.ReturnsWrongType: Task() returned a dict, "
                                     "not glossa.Params"),
    ("py:pymodels.Raises", "model py:pymodels.Raises: Task() raised ValueError: no task today"),
])
def test_bad_python_models_fail_with_the_reason(glossa_cli, tmp_path, model, message):
    r = _run([glossa_cli, "train", "--model=" + model, "--logdir=%s" % tmp_path])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert message in r.stderr
    assert not (tmp_path / "train").exists()


def test_train_pins_kernel_choices_for_the_call(tmp_path, capfd):
    p = glossa.model_registry.get_params("py:pymodels.TinyLm", "Train")
    with pytest.raises(ValueError, match="gemm_split must be measure, aten or native, got 'fast'"):
        glossa.train(p, str(tmp_path / "bad"), gemm_split="fast")
    assert not (tmp_path / "bad" / "train").exists()
    # The fp32 projections' GEMMs split over the kernel threads or on OpenBLAS's: a choice made
    # where there are several kernel threads (every machine of 2 cores or more), which
    # gemm_split="aten" pins, as the CLI's --gemm_split=aten does.
    capfd.readouterr()
    assert glossa.train(p, str(tmp_path / "pinned"), max_steps=1, verbosity=0,
                        gemm_split="aten") == 1
    err = capfd.readouterr().err
    if (os.cpu_count() or 1) >= 2:
        assert re.search(r"kernel choice: fp32_affine .*: aten \(one GEMM at a time on OpenBLAS's "
                         r"threads\), as --gemm_split says", err), err
    else:  # one kernel thread: nothing to split, no choice made
        assert "fp32_affine" not in err, err


def test_train_rejects_what_is_not_a_model(tmp_path):
    p = glossa.model_registry.get_params("py:pymodels.TinyLm", "Train")
    with pytest.raises(ValueError, match="must be a model's Params"):
        glossa.train(p.task, str(tmp_path))
    with pytest.raises(ValueError, match="max_steps must be >= 0"):
        glossa.train(p, str(tmp_path), max_steps=-1)
    with pytest.raises(TypeError, match="defines no Task\\(\\)"):
        glossa.model_registry.register_single_task_model(type("NoTask", (), {}))


def test_keyboard_interrupt_saves_and_stops(tmp_path):
    """SIGINT during glossa.train: the step finishes, a checkpoint is saved, KeyboardInterrupt."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""
        import sys, glossa, pymodels
        p = glossa.model_registry.get_params("py:pymodels.TinyLm", "Train")
        p.task.train.Set(steps_per_loop=1, save_interval_steps=100000)
        def log(line):
            print(line, flush=True)
        try:
            glossa.train(p, sys.argv[1], max_steps=100000, log=log)
        except KeyboardInterrupt as e:
            print("interrupted:", e, flush=True)
            raise
    """))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "lm")], cwd=HERE,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    for line in proc.stdout:  # waits for the event: the first progress line
        out.append(line)
        if line.startswith("step "):
            proc.send_signal(signal.SIGINT)
            break
    rest, err = proc.communicate(timeout=120)
    out.append(rest)
    text = "".join(out)
    # Python re-raises an uncaught KeyboardInterrupt as death by SIGINT.
    assert proc.returncode == -signal.SIGINT, (text, err)
    assert "KeyboardInterrupt: glossa.train stopped at step" in err
    stopped = int(text.split("interrupted: glossa.train stopped at step ")[1].split()[0])
    assert 1 <= stopped < 100000
    ckpt = tmp_path / "lm" / "train" / ("ckpt-%08d" % stopped)
    assert glossa.load_checkpoint(str(ckpt))["global_step"].item() == stopped


def test_multitask_python_model_trains(tmp_path):
    p = glossa.model_registry.get_params("py:pymodels.TwoLms", "Train")
    assert p.main_task == "deep" and p.task_params.deep.stack.num_layers == 2
    assert glossa.train(p, tmp_path, max_steps=4, verbosity=0) == 4
    names = glossa.load_checkpoint(tmp_path / "train" / "ckpt-00000004")
    assert any("/short/" in n or n.startswith("short/") for n in names), sorted(names)[:5]
    assert any("/deep/" in n or n.startswith("deep/") for n in names)
    with pytest.raises(KeyError, match="has no dataset Dev"):
        glossa.model_registry.get_params("py:pymodels.TwoLms", "Dev")
