"""Glossa layers from Python: FProp on torch tensors equals the C++ result, gradients from
Python's backward() equal the C++ autograd gradients and finite differences, and a Glossa layer
learns inside a PyTorch training loop."""
import os

import pytest
import torch

import glossa


def _layer(key, dtype=None, **kw):
    p = glossa.class_params(key)
    p.Set(**kw)
    if dtype is not None:
        p.dtype = glossa.dtype(dtype)
    return p.Instantiate()


def _proj(**kw):
    args = dict(name="proj", input_dim=4, output_dim=3, has_bias=True, activation="TANH")
    args.update(kw)
    return _layer("glossa.layers.ProjectionLayer", **args)


def test_projection_equals_its_definition():
    layer = _proj()
    assert layer.cls == "glossa.layers.ProjectionLayer"
    assert sorted(layer.theta) == ["b", "w"]
    assert [n for n, _ in layer.variables()] == ["proj/w", "proj/b"]
    x = torch.randn(2, 5, 4)
    y = layer.FProp(layer.theta, x)
    w, b = layer.vars["w"], layer.vars["b"]
    torch.testing.assert_close(y, torch.tanh(x @ w + b))
    # theta holds the variables themselves: no copies.
    assert layer.theta["w"].data_ptr() == w.data_ptr()
    # Any theta works (Lingvo's explicit weights): here doubled weights.
    y2 = layer.FProp({"w": 2 * w, "b": 2 * b}, x)
    torch.testing.assert_close(y2, torch.tanh(x @ (2 * w) + 2 * b))


@pytest.mark.parametrize("key,kw,inputs", [
    ("glossa.layers.ProjectionLayer", dict(input_dim=6, output_dim=5, has_bias=True),
     lambda: [torch.randn(3, 4, 6)]),
    ("glossa.layers.LayerNorm", dict(input_dim=6), lambda: [torch.randn(3, 4, 6)]),
    ("glossa.layers.TransformerFeedForwardLayer", dict(input_dim=6, hidden_dim=10),
     lambda: [torch.randn(2, 4, 6), torch.tensor([[0, 0, 0, 1], [0, 0, 1, 1]], dtype=torch.float32)]),
    ("glossa.layers.TransformerLayer", {"input_dim": 8, "num_heads": 2, "mask_self_atten": True,
                                        "tr_fflayer_tpl.hidden_dim": 12},
     lambda: [torch.randn(2, 5, 8), torch.tensor([[0, 0, 0, 0, 1], [0, 0, 1, 1, 1]], dtype=torch.float32)]),
])
def test_fprop_and_backward_equal_cpp(key, kw, inputs):
    p = glossa.class_params(key)
    for k, v in kw.items():
        p.SetPath(k, v)
    p.name = "l"
    p.random_seed = 7
    layer = p.Instantiate()
    args = inputs()
    out = layer.FProp(layer.theta, *args)
    outs = list(out) if isinstance(out, tuple) else [out]
    cots = [torch.randn_like(o) for o in outs]
    loss = sum((o * c).sum() for o, c in zip(outs, cots))
    loss.backward()
    ref_out, ref_grads = glossa._glossa._cpp_fprop_and_grads(layer, args, cots)
    ref_outs = list(ref_out) if isinstance(ref_out, tuple) else [ref_out]
    for o, r in zip(outs, ref_outs):
        torch.testing.assert_close(o.detach(), r, rtol=0, atol=0)
    flat = dict(glossa.flatten(layer.vars))
    assert sorted(ref_grads) == sorted(flat)
    for name, g in ref_grads.items():
        assert flat[name].grad is not None, name
        torch.testing.assert_close(flat[name].grad, g, rtol=1e-6, atol=1e-7)


def test_gradients_match_finite_differences_in_double():
    layer = _layer("glossa.layers.TransformerFeedForwardLayer", dtype=torch.float64, name="ff",
                   input_dim=4, hidden_dim=6, random_seed=3)
    theta = {k: v.detach().clone().requires_grad_(True) for k, v in glossa.flatten(layer.theta)}
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    keys = sorted(theta)

    def f(x, *leaves):
        flat = dict(zip(keys, leaves))
        return layer.FProp(glossa.pack(layer.theta, [flat[k] for k, _ in glossa.flatten(layer.theta)]), x)

    assert torch.autograd.gradcheck(f, (x, *[theta[k] for k in keys]), eps=1e-6, atol=1e-6)


def test_glossa_layer_learns_in_a_pytorch_loop():
    torch.manual_seed(0)
    layer = _layer("glossa.layers.ProjectionLayer", name="fit", input_dim=8, output_dim=1,
                   has_bias=True, activation="NONE", random_seed=1)
    true_w = torch.randn(8, 1)
    opt = torch.optim.Adam(layer.parameters(), lr=0.05)
    losses = []
    for step in range(200):
        x = torch.randn(32, 8)
        loss = ((layer(x) - (x @ true_w + 0.5)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 100, (losses[0], losses[-1])
    torch.testing.assert_close(layer.vars["w"].detach(), true_w, atol=0.05, rtol=0)
    torch.testing.assert_close(layer.vars["b"].detach(), torch.tensor([0.5]), atol=0.05, rtol=0)


def test_glossa_layer_inside_a_torch_module():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.glossa_ln = _layer("glossa.layers.LayerNorm", name="ln", input_dim=4)
            self.head = torch.nn.Linear(4, 2)
            for i, t in enumerate(self.glossa_ln.parameters()):
                self.register_parameter("ln_%d" % i, torch.nn.Parameter(t, requires_grad=True))

        def forward(self, x):
            return self.head(self.glossa_ln(x))

    net = Net()
    y = net(torch.randn(3, 4))
    y.sum().backward()
    assert net.head.weight.grad is not None
    assert all(t.grad is not None for t in net.glossa_ln.parameters())


def test_calls_by_name_and_signatures():
    layer = _layer("glossa.layers.MultiHeadedAttention", name="att", input_dim=8, hidden_dim=8,
                   num_heads=2)
    assert layer.fprop_signature.startswith(
        "FProp(theta, query, key, value, paddings=None, causal=None, segment_ids=None, "
        "source_segment_ids=None) -> (context, probs)")
    q = torch.randn(2, 3, 8)
    ctx, probs = layer.FProp(layer.theta, q, q, q, causal=True)
    assert ctx.shape == (2, 3, 8) and probs.shape == (2, 2, 3, 3)
    assert float(probs[0, 0, 0, 1:].abs().sum()) == 0.0  # causal: no attention to the future
    # Packed rows: segment ids keep each query to the keys of its own segment.
    seg = torch.tensor([[1, 1, 2], [1, 2, 2]])
    _, probs = layer.FProp(layer.theta, q, q, q, segment_ids=seg)
    assert float(probs[0, :, 2, :2].abs().sum()) == 0.0 and float(probs[1, :, 0, 1:].abs().sum()) == 0.0
    with pytest.raises(TypeError, match="missing 'value'"):
        layer.FProp(layer.theta, q, q)
    with pytest.raises(TypeError, match=r"unexpected argument casual \(keys are \[.*'causal'"):
        layer.FProp(layer.theta, q, q, q, casual=True)
    with pytest.raises(TypeError, match="takes 7 inputs after theta, got 8"):
        layer.FProp(layer.theta, q, q, q, None, False, None, None, 1)
    with pytest.raises(ValueError, match="inputs must end in input_dim 4"):
        _proj()(torch.randn(2, 5))
    with pytest.raises(TypeError, match="not a layer or input generator"):
        glossa.class_params("glossa.optim.Adam").Instantiate()
    with pytest.raises(TypeError, match="name no class"):
        glossa.Params().Instantiate()


def test_children_tasks_and_eval_mode():
    p = glossa.model_registry.get_params("lm.austen.TransformerLmTiny", "Train")
    p.task.stack.num_layers = 1
    task = p.task.Instantiate()
    assert "stack" in task.children()
    ff = task.child("stack.x_layers[0].fflayer")
    assert ff.path == "lm.stack.x_layers_0.fflayer"
    x = torch.randn(1, 3, 128)
    with glossa.EvalMode():  # no dropout: the same output twice
        torch.testing.assert_close(ff(x), ff(x))
    inp = p.task.input.Instantiate()
    assert isinstance(inp, glossa.InputGenerator)
    batch = next(iter(inp))
    metrics, per_example = task.FProp(task.theta, batch)
    loss, weight = metrics["loss"]
    assert loss.requires_grad and float(weight) > 0
    loss.backward()
    assert task.child("softmax").vars["weight_0"].grad is not None


def test_a_users_cpp_layer_is_called_with_no_binding_code():
    """A layer registered in a library of its own (tests/python/user_layer/user_layer.cc): loaded,
    instantiated from its Params and called through its uniform call, FPropMap."""
    path = os.environ.get("GLOSSA_TEST_USER_LAYER")
    if not path:
        pytest.skip("GLOSSA_TEST_USER_LAYER is not set (CTest sets it)")
    glossa.load_library(path)
    layer = glossa.class_params("user.ScaleShiftLayer").Set(name="ss", dim=3).Instantiate()
    assert layer.fprop_signature == (
        "FProp(theta, inputs, mask=None) -> (outputs, mean)  [ScaleShiftLayer]")
    x = torch.tensor([[1.0, 2.0, 3.0]])
    y, mean = layer.FProp(layer.theta, x)
    assert torch.equal(y, x * 2 + 0.5)
    assert torch.allclose(mean, torch.tensor([4.5]))
    y2, _ = layer.FProp(layer.theta, x, mask=torch.tensor([[1.0, 0.0, 1.0]]))
    assert torch.equal(y2, torch.tensor([[2.5, 0.0, 6.5]]))
    # Autograd flows through the C++ body into Python's tensors.
    theta = {k: v.detach().clone().requires_grad_(True) for k, v in layer.theta.items()}
    layer.FProp(theta, x)[0].sum().backward()
    assert torch.equal(theta["scale"].grad, x[0])
    with pytest.raises(TypeError, match="missing 'inputs'"):
        layer.FProp(layer.theta, mask=x)
    with pytest.raises(TypeError, match=r"unexpected argument masks"):
        layer.FProp(layer.theta, x, masks=x)

