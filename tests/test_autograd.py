"""GradMultiply: identity forward, scaled gradient; works under torch.func and torch.compile."""

from types import SimpleNamespace

import pytest
import torch
from torch.func import grad, jacfwd, jacrev, jvp, vmap

from avsr.autograd import GradMultiply, grad_multiply
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
