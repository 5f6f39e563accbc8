"""GradMultiply: identity forward, scaled gradient; works under torch.func and torch.compile.
LinearAverageOp / MomentumLabelMemory: NPID's momentum memory (gradient, update rule, learning)."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch.func import grad, jacfwd, jacrev, jvp, vmap

from avsr.autograd import GradMultiply, LinearAverageOp, MomentumLabelMemory, grad_multiply, momentum_update_
from avsr.encoder import AVHubertEncoder

SCALE = 0.25


def _x(*shape: int) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(*shape, dtype=torch.double)


def test_forward_is_a_new_tensor_equal_to_input():
    x = _x(3, 4)
    y = GradMultiply.apply(x, SCALE)
    assert torch.equal(y, x)
    assert y is not x
    assert y.data_ptr() != x.data_ptr()


def test_backward_scales_gradient():
    x = _x(3, 4).requires_grad_()
    g = torch.randn(3, 4, dtype=torch.double)
    GradMultiply.apply(x, SCALE).backward(g)
    torch.testing.assert_close(x.grad, SCALE * g, rtol=0, atol=0)


def test_backward_respects_needs_input_grad():
    g = torch.ones(2)
    ctx = SimpleNamespace(scale=3.0, needs_input_grad=(False, False))
    assert GradMultiply.backward(ctx, g) == (None, None)
    ctx = SimpleNamespace(scale=3.0, needs_input_grad=(True, False))
    grad_x, grad_scale = GradMultiply.backward(ctx, g)
    assert torch.equal(grad_x, 3 * g) and grad_scale is None
    # through autograd: x without grad, another input with grad
    x, w = _x(3), _x(3).requires_grad_()
    (GradMultiply.apply(x, SCALE) * w).sum().backward()
    assert x.grad is None and torch.equal(w.grad, x)


# torch's forward-AD check (check_forward_ad) scripts its own jvp decompositions with torch.jit.script, which
# warns in torch >= 2.10; the warning is torch's, not this package's
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_gradcheck_and_gradgradcheck():
    x = _x(2, 3).requires_grad_()
    # numerical == analytical only for scale 1 (by design the declared derivative is scale * I)
    assert torch.autograd.gradcheck(lambda t: GradMultiply.apply(t, 1.0).sin() * t, (x,),
                                    check_forward_ad=True, check_batched_grad=True)
    # the backward (grad_out -> scale * grad_out) is itself consistent for any scale
    assert torch.autograd.gradgradcheck(lambda t: GradMultiply.apply(t, SCALE), (x,), check_fwd_over_rev=True)


def test_torch_func_grad_vmap_jvp():
    x = _x(5)
    f = lambda t: (GradMultiply.apply(t, SCALE) ** 2).sum()  # noqa: E731
    torch.testing.assert_close(grad(f)(x), SCALE * 2 * x)
    xb = _x(4, 5)
    torch.testing.assert_close(vmap(lambda t: GradMultiply.apply(t, SCALE))(xb), xb)
    torch.testing.assert_close(vmap(grad(f))(xb), SCALE * 2 * xb)
    t = torch.randn(5, dtype=torch.double)
    out, tangent = jvp(lambda u: GradMultiply.apply(u, SCALE), (x,), (t,))
    torch.testing.assert_close(out, x)
    torch.testing.assert_close(tangent, SCALE * t)
    eye = SCALE * torch.eye(5, dtype=torch.double)
    torch.testing.assert_close(jacrev(lambda u: GradMultiply.apply(u, SCALE))(x), eye)
    torch.testing.assert_close(jacfwd(lambda u: GradMultiply.apply(u, SCALE))(x), eye)


def test_torch_compile_fullgraph():
    # backend="aot_eager": dynamo + AOTAutograd capture the Function (a graph break would raise under
    # fullgraph=True) without inductor's C++ code generation, which takes tens of seconds on 2 CPU cores.
    torch._dynamo.reset()

    def f(t: torch.Tensor) -> torch.Tensor:
        return (grad_multiply(t.sin(), SCALE) * 2).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = _x(6).requires_grad_()
    out = compiled(x)
    out.backward()
    torch.testing.assert_close(out, f(x.detach()))
    torch.testing.assert_close(x.grad, SCALE * 2 * x.detach().cos())


def test_grad_multiply_functional():
    x = _x(3)
    assert grad_multiply(x, 1.0) is x
    with pytest.raises(TypeError, match="scale"):
        grad_multiply(x, torch.tensor(0.5))


TINY = dict(encoder_layers=1, encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=2,
            conv_pos=4, conv_pos_groups=2, resnet_widths=[2, 4, 4, 8], audio_feat_dim=104, dropout=0.0,
            dropout_input=0.0, attention_dropout=0.0, encoder_layerdrop=0.0, modality_dropout=0.0)


def _frontend_grads(mult: float, state: dict) -> dict[str, torch.Tensor | None]:
    enc = AVHubertEncoder(**TINY, feature_grad_mult=mult).double().eval()
    enc.load_state_dict(state)
    torch.manual_seed(1)
    xs = {"audio": torch.randn(2, 104, 6, dtype=torch.double),
          "video": torch.randn(2, 1, 6, 12, 12, dtype=torch.double)}
    hidden, _, _ = enc(xs, torch.tensor([6, 4]))
    hidden.pow(2).sum().backward()
    return {n: p.grad for n, p in enc.named_parameters()}


def test_encoder_front_end_gradients_scaled_by_feature_grad_mult():
    torch.manual_seed(0)
    state = AVHubertEncoder(**TINY).double().state_dict()
    ref, scaled, frozen = (_frontend_grads(m, state) for m in (1.0, 0.1, 0.0))
    front = [n for n in ref if n.startswith("feature_extractor_")]
    assert front and len(front) < len(ref)
    for name in ref:
        if name in front:
            torch.testing.assert_close(scaled[name], 0.1 * ref[name], rtol=1e-12, atol=1e-15)
            assert frozen[name] is None, name
            assert ref[name].abs().sum() > 0, name
        else:
            torch.testing.assert_close(scaled[name], ref[name], rtol=1e-12, atol=1e-15)
            torch.testing.assert_close(frozen[name], ref[name], rtol=1e-12, atol=1e-15)


def _unit_rows(k: int, d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(k, d, generator=g, dtype=torch.double), dim=1)


def test_linear_average_gradcheck():
    # The backward updates the memory in place, and gradcheck evaluates the function many times (finite
    # differences, then backward passes, repeated to check reentrancy). To keep the function deterministic,
    # each call gets a fresh copy of the memory, which its backward updates and nothing reads again; the
    # op's own forward-time snapshot makes repeated backward passes of one graph give the same gradient.
    memory = _unit_rows(5, 4)
    before = memory.clone()
    x = _x(6, 4).requires_grad_()
    y = torch.tensor([0, 2, 2, 4, -1, 0])
    assert torch.autograd.gradcheck(lambda t: LinearAverageOp.apply(t, y, memory.clone(), 0.1, 0.5), (x,))
    assert torch.equal(memory, before)


def test_linear_average_forward_backward_and_update_rule():
    memory = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=torch.double)
    old = memory.clone()
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [5.0, 5.0]], dtype=torch.double, requires_grad=True)
    y = torch.tensor([0, 0, 1, -1])  # two rows share class 0; the last row has no target
    logits = LinearAverageOp.apply(x, y, memory, 0.5, 0.5)
    torch.testing.assert_close(logits, x.detach() @ old.t() / 0.5, rtol=0, atol=0)
    g = torch.arange(12, dtype=torch.double).view(4, 3)
    logits.backward(g)
    torch.testing.assert_close(x.grad, g @ old / 0.5, rtol=0, atol=0)  # the memory before the update
    # class 0: 0.5 * [1, 0] + 0.5 * mean([1, 0], [0, 1]) = [0.75, 0.25] -> [3, 1] / sqrt(10)
    # class 1: 0.5 * [0, 1] + 0.5 * [1, 0] = [0.5, 0.5] -> [1, 1] / sqrt(2); class 2: not seen, unchanged
    expected = torch.tensor([[3 / math.sqrt(10), 1 / math.sqrt(10)], [1 / math.sqrt(2), 1 / math.sqrt(2)],
                             [0.6, 0.8]], dtype=torch.double)
    torch.testing.assert_close(memory, expected, rtol=0, atol=1e-15)
    assert torch.equal(memory[2], old[2])


def test_linear_average_gradient_uses_the_forward_memory():
    # two calls on one memory in one graph, and a repeated backward: each gradient is that of its forward
    memory = _unit_rows(3, 2)
    x = _x(2, 2).requires_grad_()
    y = torch.tensor([0, 1])
    m0 = memory.clone()
    first = LinearAverageOp.apply(x, y, memory, 0.1, 0.5)
    out = first.sum() + 2 * LinearAverageOp.apply(x, y, memory, 0.1, 0.5).sum()
    out.backward(retain_graph=True)
    expected = 3 * torch.ones(2, 3, dtype=torch.double) @ m0 / 0.1
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=1e-12)
    assert not torch.equal(memory, m0)  # but the memory was updated
    x.grad = None
    out.backward()
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=1e-12)


def test_momentum_update_single_sample_matches_npid_formula():
    memory = _unit_rows(4, 3, seed=1)
    x = torch.nn.functional.normalize(_x(2, 3), dim=1)
    y = torch.tensor([3, 1])
    expected = memory.clone()
    for i in range(2):  # NPID: weight_pos = memory[y] * m + x * (1 - m), divided by its norm
        w = memory[y[i]] * 0.3 + x[i] * 0.7
        expected[y[i]] = w / w.norm()
    momentum_update_(memory, x, y, 0.3)
    torch.testing.assert_close(memory, expected, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="x"):
        momentum_update_(memory, x[:, :2], y, 0.3)


def test_linear_average_respects_needs_input_grad():
    memory = _unit_rows(3, 2)
    x, y = _x(2, 2), torch.tensor([1, 1])
    ctx = SimpleNamespace(saved_tensors=(x, y, memory.clone()), memory=memory, temperature=0.1, momentum=0.5,
                          needs_input_grad=(False, False, False, False, False))
    before = memory.clone()
    assert LinearAverageOp.backward(ctx, torch.ones(2, 3, dtype=torch.double)) == (None,) * 5
    assert not torch.equal(memory[1], before[1]) and torch.equal(memory[[0, 2]], before[[0, 2]])
    ctx.needs_input_grad = (True, False, False, False, False)
    grad_x, *rest = LinearAverageOp.backward(ctx, torch.ones(2, 3, dtype=torch.double))
    assert grad_x.shape == (2, 2) and rest == [None] * 4
    # no backward, no update: x without grad, or under no_grad
    before = memory.clone()
    out = LinearAverageOp.apply(x, y, memory, 0.1, 0.5)
    assert out.grad_fn is None
    with torch.no_grad():
        LinearAverageOp.apply(x.clone().requires_grad_(), y, memory, 0.1, 0.5)
    assert torch.equal(memory, before)


def test_momentum_label_memory_module():
    torch.manual_seed(0)
    mem = MomentumLabelMemory(7, 5, temperature=0.2, momentum=0.9)
    assert mem.memory.shape == (7, 5) and mem.memory.dtype == torch.float32
    torch.testing.assert_close(mem.memory.norm(dim=1), torch.ones(7))
    assert "memory" in mem.state_dict()
    x = torch.nn.functional.normalize(torch.randn(4, 5), dim=1).requires_grad_()
    out = mem(x, torch.tensor([0, 1, 1, 6]))
    torch.testing.assert_close(out, x.detach() @ mem.memory.t() / 0.2)
    for bad in (dict(num_classes=0, dim=5), dict(num_classes=3, dim=5, temperature=0.0),
                dict(num_classes=3, dim=5, momentum=1.5)):
        with pytest.raises(ValueError):
            MomentumLabelMemory(**bad)
    with pytest.raises(ValueError, match="need x"):
        mem(torch.randn(4, 3), torch.zeros(4, dtype=torch.long))


def test_momentum_label_memory_learns_toy_clusters():
    # 4 Gaussian clusters in 6-D; a linear map + L2 normalisation scored against the memory. The memory is
    # not a parameter: it follows the class means through the momentum update while the map learns.
    torch.manual_seed(0)
    k, d = 4, 6
    centres = 3 * torch.randn(k, d)
    y = torch.arange(k).repeat_interleave(64)
    data = centres[y] + torch.randn(len(y), d)
    net = torch.nn.Linear(d, 8)
    mem = MomentumLabelMemory(k, 8, temperature=0.1, momentum=0.5)
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    start_memory = mem.memory.clone()
    losses, accs = [], []
    for _ in range(40):
        logits = mem(torch.nn.functional.normalize(net(data), dim=1), y)
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        accs.append((logits.argmax(1) == y).float().mean().item())
    assert losses[-1] < 0.5 * losses[0]
    assert accs[-1] > 0.95 and accs[-1] > accs[0]
    assert not torch.allclose(mem.memory, start_memory)
    torch.testing.assert_close(mem.memory.norm(dim=1), torch.ones(k))
