"""glossa.Predictor from Python against `glossa predict`, and the module used from several Python
threads at once (Predictor runs, layer FProps, Params, model registry callbacks, training)."""
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

import glossa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pymodels  # noqa: E402,F401

TEXTS = ["It is a truth universally acknowledged", "Emma Woodhouse, handsome, clever, and rich",
         "The family of Dashwood had long been settled in Sussex", "Mr. Darcy", "She was"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, request):
    cli = os.path.abspath(request.config.getoption("--glossa_cli"))
    d = tmp_path_factory.mktemp("bundle")
    p = glossa.model_registry.get_params("py:pymodels.TinyLm", "Train")
    glossa.train(p, str(d / "lm"), max_steps=3, verbosity=0)
    env = dict(os.environ, PYTHONPATH=HERE + ":" + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([cli, "export", "--model=py:pymodels.TinyLm", "--logdir=%s" % (d / "lm"),
                        "--out=%s" % (d / "bundle")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return cli, str(d / "bundle"), d


def test_predictor_equals_glossa_predict(bundle):
    cli, path, d = bundle
    pred = glossa.Predictor(path)
    assert pred.global_step == 3
    spec = pred.subgraphs()
    assert spec["default"]["feeds"]["text"]["dtype"] == "string"
    out = pred.run("default", text=TEXTS)
    assert isinstance(out["total_log_prob"], torch.Tensor)
    (d / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    r = subprocess.run([cli, "predict", "--bundle=" + path, "--input=%s" % (d / "texts.txt")],
                       capture_output=True, text=True, check=True)
    cli_lp = [json.loads(line)["total_log_prob"] for line in r.stdout.splitlines()]
    torch.testing.assert_close(out["total_log_prob"].double(), torch.tensor(cli_lp, dtype=torch.float64),
                               rtol=1e-6, atol=1e-5)
    # Values Python holds and the Predictor cannot: ValueError naming the feed, not RuntimeError.
    with pytest.raises(ValueError, match="feed 'max_new_tokens': 10+ does not fit in a 64-bit integer"):
        pred.run("generate", prompt=["Emma"], max_new_tokens=10**30)
    with pytest.raises(ValueError, match="feed 'text': the string is not valid Unicode"):
        pred.run("default", text=["Emma \ud800"])
    gen = pred.run("generate", prompt=["It is a truth"], max_new_tokens=4)
    assert isinstance(gen["text"], list) and isinstance(gen["text"][0], str)
    # The plan made at load: int8 on request, close to float32 and not the same.
    assert pred.compute == "float32, fused decoder step"
    # Every decoder layer takes the fused step: the plan has nothing to say (it would say why not).
    if os.environ.get("GLOSSA_KERNELS") != "reference":
        assert pred.plan_notes == []
    int8 = glossa.Predictor(path, precision="int8", batch_invariant=True)
    assert int8.compute == "int8, batch-invariant, fused decoder step"
    lp8 = int8.run("default", text=TEXTS)["total_log_prob"]
    assert not torch.equal(lp8, out["total_log_prob"])
    torch.testing.assert_close(lp8, out["total_log_prob"], rtol=0.05, atol=0.5)
    with pytest.raises(ValueError, match="precision is 'int4'; it must be float32, bf16 or int8"):
        glossa.Predictor(path, precision="int4")
    # Bad feeds: the Predictor's own checks, as Python exceptions naming the feed.
    with pytest.raises(ValueError, match="unknown feed 'txt'"):
        pred.run("default", txt=TEXTS)
    with pytest.raises(KeyError, match="no subgraph 'translate'"):
        pred.run("translate", text=TEXTS)
    with pytest.raises(TypeError, match="feed 'text': a batch of strings is a list of str"):
        pred.run("default", text="one string")
    with pytest.raises(TypeError, match="a list feed holds str, not int"):
        pred.run("default", text=[1, 2])
    # A path that does not exist is NotFound (KeyError, as every NotFound); a directory that is not
    # a bundle is a damaged one (DataLoss: GlossaError).
    with pytest.raises(KeyError, match="does not exist"):
        glossa.Predictor(str(d / "no_such_bundle"))
    (d / "not_a_bundle").mkdir()
    with pytest.raises(glossa.GlossaError, match="has no MANIFEST.json"):
        glossa.Predictor(str(d / "not_a_bundle"))


def test_calls_from_several_threads(bundle):
    _, path, d = bundle
    pred = glossa.Predictor(path)
    expected = {t: pred.run("default", text=[t])["total_log_prob"] for t in TEXTS}
    layer = glossa.class_params("glossa.layers.TransformerFeedForwardLayer").Set(
        name="ff", input_dim=8, hidden_dim=16, random_seed=2).Instantiate()
    x = torch.randn(4, 6, 8)
    with glossa.EvalMode():
        y_ref = layer(x).detach()
    errors = []
    barrier = threading.Barrier(4)

    def worker(i):
        try:
            barrier.wait()
            for k in range(15):
                t = TEXTS[(i + k) % len(TEXTS)]
                # The sequential results: bit for bit where OpenBLAS gives a row the same bits
                # whatever the GEMM's split (SkylakeX kernels); other kernel sets
                # (OPENBLAS_CORETYPE=Haswell on an AVX-512 AMD EPYC) round a GEMM split among
                # concurrent callers differently, within float32 rounding.
                lp = pred.run("default", text=[t])["total_log_prob"]
                torch.testing.assert_close(lp, expected[t], rtol=1e-6, atol=0, msg=t)
                with glossa.EvalMode():
                    torch.testing.assert_close(layer(x).detach(), y_ref, rtol=1e-6, atol=1e-7)
                p = glossa.model_registry.get_params("py:pymodels.TinyLm", "Train")
                p.task.stack.num_layers = i + k
                assert p.task.stack.num_layers == i + k
                assert p.Copy().FromText(p.ToText()) == p
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_training_in_a_thread_leaves_python_running(tmp_path):
    p = glossa.model_registry.get_params("py:pymodels.TinyLm", "Train")
    p.task.train.steps_per_loop = 1
    seen = []  # the main thread's counter, read at each progress line
    counter = [0]
    done = threading.Event()

    def train():
        try:
            glossa.train(p, str(tmp_path / "lm"), max_steps=6, log=lambda line: seen.append(counter[0]))
        finally:
            done.set()

    t = threading.Thread(target=train)
    t.start()
    while not done.is_set():
        counter[0] += 1
    t.join()
    assert len(seen) >= 6
    # Python kept running between the steps: the C++ steps ran without the GIL.
    assert seen[-1] > seen[0]
    assert glossa.load_checkpoint(str(tmp_path / "lm" / "train" / "ckpt-00000006"))["global_step"].item() == 6
