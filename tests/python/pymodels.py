"""Model configurations written in Python, for test_models.py (imported as `pymodels` by
`glossa train --model=py:pymodels.TinyLm`, with this directory on PYTHONPATH)."""
import os

import glossa

DATA = os.environ.get("GLOSSA_DATA_DIR",
                      os.path.join(os.path.dirname(__file__), "..", "..", "data"))


def _input(split, train):
    """The Austen text input, built from the input generator's own Params."""
    p = glossa.class_params("glossa.input.TextLmInput")
    p.name = "input"
    p.file_pattern = "text:" + os.path.join(DATA, "austen", split + ".txt")
    tok = glossa.class_params("glossa.input.SentencePieceTokenizer")
    tok.Set(spm_model_file=os.path.join(DATA, "austen", "spm_2k.model"), vocab_size=2000)
    p.tokenizer = tok
    p.target_max_length = 32
    p.bucket_upper_bound = [16, 32]
    p.bucket_batch_limit = [8, 4]
    p.file_parallelism = 1
    if not train:
        p.repeat_count = 1
        p.require_sequential_order = True
    return p


@glossa.model_registry.register_single_task_model
class TinyLm:
    """The Austen LM's task, shrunk in Python: 1 layer of width 16."""

    def Task(self):
        p = glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Train").task
        p.emb.embedding_dim = 16
        p.position_emb.embedding_dim = 16
        p.softmax.input_dim = 16
        p.stack.Set(num_layers=1, mdl_dim=16, hidden_dim=32, num_atten_heads=2)
        p.train.Set(max_steps=6, steps_per_loop=3, save_interval_steps=3,
                    summary_interval_steps=3)
        p.train.learner.learning_rate = 1e-2
        return p

    def Train(self):
        return _input("train", True)

    def Dev(self):
        return _input("dev", False)

    # Every dataset of lm.austen.*, so that its Params (datasets.* included) are the C++ model's.
    def Test(self):
        return _input("test", False)


class Undecorated:
    """Registered by `python3 -m glossa` itself when named with --model=py:."""

    def Task(self):
        return TinyLm().Task()

    def Train(self):
        return _input("train", True)


class ReturnsWrongType:
    def Task(self):
        return {"not": "params"}

    def Train(self):
        return _input("train", True)


class Raises:
    def Task(self):
        raise ValueError("no task today")

    def Train(self):
        return _input("train", True)


@glossa.model_registry.register_multitask_model
class TwoLms:
    """Two tasks sharing nothing, sampled half and half (Lingvo's MultiTaskModel)."""

    def Model(self):
        p = glossa.class_params("glossa.model.MultiTaskModel")
        tasks, probs = glossa.Params(), glossa.Params()
        for name, layers in (("short", 1), ("deep", 2)):
            t = TinyLm().Task()
            t.name = name
            t.stack.num_layers = layers
            tasks.Define(name, t, "")
            probs.Define(name, 0.5, "")
        p.Set(task_params=tasks, task_probs=probs, main_task="deep")
        return p

    def Train(self):
        p = glossa.Params()
        p.Define("short", _input("train", True), "").Define("deep", _input("train", True), "")
        return p
