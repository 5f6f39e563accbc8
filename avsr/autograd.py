"""Custom autograd functions.

:class:`GradMultiply` is the identity in the forward pass and scales the gradient in the backward pass.
AV-HuBERT (Shi et al., 2022) applies it, with the factor ``feature_grad_mult``, to the output of each
modality front-end so that the front-ends learn more slowly than the transformer (fairseq
``fairseq/modules/grad_multiply.py``; ``AVHubertModel.forward_features`` in ``avhubert/hubert.py``).

Unlike fairseq's version, this one is written in the ``setup_context`` style of
:class:`torch.autograd.Function`, so it also works under ``torch.func`` transforms (``grad``, ``vmap``,
``jvp``/``jacfwd``) and is captured by ``torch.compile(fullgraph=True)`` without graph breaks.

Dynamo refuses to trace an ``autograd.Function`` that defines ``jvp`` ("Unsupported custom jvp", a graph
break), so the class is registered with :func:`torch.compiler.allow_in_graph`: Dynamo then records the
``apply`` call as one opaque node and AOTAutograd traces its forward and backward (checked with the
``aot_eager`` and ``inductor`` backends).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GradMultiply", "grad_multiply"]


class GradMultiply(torch.autograd.Function):
    """Identity forward, gradient times ``scale`` backward.

    ``GradMultiply.apply(x, scale)``:

    * ``x``: a floating-point tensor of any shape, dtype and device;
    * ``scale``: a Python float (the gradient factor, e.g. AV-HuBERT's ``feature_grad_mult`` = 0.1).

    Returns a new tensor (not a view) equal to ``x``, same shape/dtype/device.

    Derivatives: the function declares its derivative to be ``scale * I``. The backward pass (reverse mode,
    ``torch.autograd.backward``, ``torch.func.grad``/``vjp``) returns ``scale * grad_output`` for ``x`` and
    ``None`` for ``scale``; the forward-mode rule (``torch.func.jvp``/``jacfwd``) returns
    ``scale * tangent``, so forward and reverse Jacobians agree. ``vmap`` uses the generated rule.

    Source: fairseq ``GradMultiply`` (used by wav2vec 2.0, HuBERT and AV-HuBERT), rewritten in the
    ``setup_context`` style documented in "Extending torch.func with autograd.Function".
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        """Return a copy of ``x`` (a new tensor, so that autograd never sees the input as an output)."""
        return x.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        """Store the factor on ``ctx`` (nothing else is needed: the function is linear)."""
        _, scale = inputs
        ctx.scale = scale

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:  # type: ignore[override]
        """``(scale * grad_output, None)``; ``None`` for ``x`` when it needs no gradient."""
        grad_x = grad_output * ctx.scale if ctx.needs_input_grad[0] else None
        return grad_x, None

    @staticmethod
    def jvp(ctx: Any, x_tangent: torch.Tensor, scale_tangent: Any) -> torch.Tensor:
        """Forward-mode rule: the output tangent is ``scale * x_tangent``."""
        return x_tangent * ctx.scale


torch.compiler.allow_in_graph(GradMultiply)


def grad_multiply(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Functional form of :class:`GradMultiply`: ``x`` forward, gradient times ``scale`` backward.

    Args:
        x: floating-point tensor, any shape.
        scale: gradient factor (Python float). ``1.0`` returns ``x`` itself (no copy, no autograd node).

    Returns:
        A tensor equal to ``x`` (same shape, dtype and device).

    Raises:
        TypeError: ``scale`` is not a real number.
    """
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"grad_multiply: scale must be a Python float, got {type(scale).__name__}")
    if scale == 1.0:
        return x
    return GradMultiply.apply(x, float(scale))
