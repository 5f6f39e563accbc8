"""Custom autograd functions.

* :class:`GradMultiply` / :func:`grad_multiply` -- identity forward, scaled gradient (slower front-ends).
* :class:`LinearAverageOp` / :class:`MomentumLabelMemory` -- a non-parametric memory of unit vectors (one per
  class) scored by a dot product, whose rows are updated by a momentum average of the inputs in the backward
  pass (NPID's ``LinearAverage``); used as momentum cluster-label embeddings in pretraining.

:class:`GradMultiply` is the identity in the forward pass and scales the gradient in the backward pass.
AV-HuBERT (Shi et al., 2022) applies it, with the factor ``feature_grad_mult``, to the output of each
modality front-end so that the front-ends learn more slowly than the transformer (fairseq
``fairseq/modules/grad_multiply.py``; ``AVHubertModel.forward_features`` in ``avhubert/hubert.py``).

Unlike fairseq's version, :class:`GradMultiply` is written in the ``setup_context`` style of
:class:`torch.autograd.Function`, so it also works under ``torch.func`` transforms (``grad``, ``vmap``,
``jvp``/``jacfwd``) and is captured by ``torch.compile(fullgraph=True)`` without graph breaks.

Dynamo refuses to trace an ``autograd.Function`` that defines ``jvp`` ("Unsupported custom jvp", a graph
break), so the class is registered with :func:`torch.compiler.allow_in_graph`: Dynamo then records the
``apply`` call as one opaque node and AOTAutograd traces its forward and backward (checked with the
``aot_eager`` and ``inductor`` backends).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GradMultiply", "grad_multiply", "LinearAverageOp", "MomentumLabelMemory", "momentum_update_"]


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


@torch.no_grad()
def momentum_update_(memory: torch.Tensor, x: torch.Tensor, y: torch.Tensor, momentum: float) -> None:
    """In place: ``memory[k] <- normalize(momentum * memory[k] + (1 - momentum) * mean{x_i : y_i = k})``.

    The rule of NPID's ``LinearAverageOp.backward`` (``weight_pos = memory[y] * m + x * (1 - m)``, divided by
    its L2 norm, written back with ``index_copy_``), with one difference: when several rows of ``x`` share a
    target, the original keeps only one of them (the last on CPU, an arbitrary one on CUDA); here their mean
    is used, so the update is deterministic and uses every sample (with one sample per target both agree).
    Rows whose class is not among ``y`` are left untouched; targets ``< 0`` are ignored. The update is done
    with tensor ops only (no host synchronisation).

    Args:
        memory: ``(K, D)`` float, modified in place.
        x: ``(N, D)`` float (any float dtype; cast to ``memory``'s), the new samples.
        y: ``(N,)`` int64 targets in ``[0, K)``, or negative to skip a row.
        momentum: ``m`` in ``[0, 1]``; 1 keeps the old direction (rows are still re-normalised).

    Raises:
        ValueError: shapes that do not match.
    """
    if x.dim() != 2 or x.shape[1] != memory.shape[1] or y.shape != (x.shape[0],):
        raise ValueError(f"momentum_update_: need x (N, D={memory.shape[1]}) and y (N,), got x "
                         f"{tuple(x.shape)} and y {tuple(y.shape)}")
    k = memory.shape[0]
    valid = y >= 0
    idx = torch.where(valid, y, 0).long()
    weight = valid.to(memory.dtype)
    sums = memory.new_zeros(memory.shape).index_add_(0, idx, x.to(memory.dtype) * weight[:, None])
    counts = memory.new_zeros(k).index_add_(0, idx, weight)
    mean = sums / counts.clamp(min=1.0)[:, None]
    updated = F.normalize(momentum * memory + (1.0 - momentum) * mean, dim=1)
    memory.copy_(torch.where((counts > 0)[:, None], updated, memory))


class LinearAverageOp(torch.autograd.Function):
    """Dot-product scores against a memory bank whose target rows move towards the inputs in backward.

    ``LinearAverageOp.apply(x, y, memory, temperature, momentum)``:

    * ``x``: ``(N, D)`` float, normally L2-normalised rows (then the scores are cosine similarities);
    * ``y``: ``(N,)`` int64 target class of each row (negative: no update from that row);
    * ``memory``: ``(K, D)`` float (same dtype as ``x``), unit rows; a buffer, not a learned parameter;
    * ``temperature``: Python float ``T > 0``; ``momentum``: Python float ``m`` in ``[0, 1]``.

    Forward returns the logits ``x @ memory.T / T``, ``(N, K)``.

    Backward returns ``grad_out @ memory / T`` for ``x`` (``None`` when ``x`` needs no gradient) and
    ``None`` for every other input: the memory gets no gradient. As a side effect it then updates
    ``memory`` in place with :func:`momentum_update_` (``memory[y] <- normalize(m * memory[y] + (1 - m) *
    x)``, the mean over rows sharing a target). So the memory changes only when a backward pass runs
    through the op -- never under ``torch.no_grad()`` or when ``x`` does not require grad. The gradient is
    the exact one of the forward pass: it uses a copy of the memory taken in the forward pass (``K x D``
    floats), so it is not affected by updates made in between (another call on the same memory in the same
    graph, or a repeated backward with ``retain_graph``).

    Source: Wu et al., "Unsupervised Feature Learning via Non-Parametric Instance Discrimination" (CVPR
    2018), Sec. 3.1-3.2 (memory bank, ``v <- m v + (1 - m) f``, re-normalised); code
    zhirongw/lemniscate.pytorch ``lib/LinearAverage.py``. Rewritten in the ``setup_context`` style; not
    usable under ``torch.func`` transforms (the update is a side effect).
    """

    @staticmethod
    def forward(x: torch.Tensor, y: torch.Tensor, memory: torch.Tensor, temperature: float,  # type: ignore[override]
                momentum: float) -> torch.Tensor:
        """``x @ memory.T / temperature``, ``(N, K)``."""
        return torch.mm(x, memory.t()) / temperature

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        """Save ``x``, ``y`` and a copy of ``memory`` (for the gradient); keep ``memory`` itself by reference
        (it is updated in place in backward, so it must not be a version-checked saved tensor)."""
        x, y, memory, temperature, momentum = inputs
        ctx.save_for_backward(x, y, memory.detach().clone() if x.requires_grad else memory.detach())
        ctx.memory = memory
        ctx.temperature = temperature
        ctx.momentum = momentum

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None]:  # type: ignore[override]
        """Gradient for ``x`` (if needed), then the momentum update of ``memory``."""
        x, y, snapshot = ctx.saved_tensors
        grad_x = torch.mm(grad_out, snapshot) / ctx.temperature if ctx.needs_input_grad[0] else None
        momentum_update_(ctx.memory, x.detach(), y, ctx.momentum)
        return grad_x, None, None, None, None


class MomentumLabelMemory(nn.Module):
    """A memory of ``K`` unit vectors scored by ``x @ memory.T / temperature`` and updated by momentum.

    NPID's ``LinearAverage`` module (see :class:`LinearAverageOp`) as a label-embedding table: for cluster
    prediction, ``x`` are the L2-normalised projected frames and ``y`` their cluster labels; each backward
    pass moves the rows of the seen clusters towards the mean of their frames.

    Args:
        num_classes: ``K``.
        dim: ``D``.
        temperature: logit temperature ``T`` (NPID's default 0.07; AV-HuBERT's ``logit_temp`` is 0.1).
        momentum: ``m`` (NPID's default 0.5).

    The memory is the buffer ``memory`` ``(K, D)`` float32 (saved in the state dict), initialised with random
    unit rows (Gaussian rows, normalised; NPID draws ``U(-s, s)`` with ``s = sqrt(3 / D)``, whose rows have
    unit norm only in expectation).

    Raises:
        ValueError: ``num_classes`` or ``dim`` < 1, ``temperature <= 0``, ``momentum`` outside ``[0, 1]``.
    """

    def __init__(self, num_classes: int, dim: int, temperature: float = 0.07, momentum: float = 0.5) -> None:
        super().__init__()
        if num_classes < 1 or dim < 1:
            raise ValueError(f"num_classes and dim must be >= 1, got {num_classes} and {dim}")
        if not (temperature > 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must lie in [0, 1], got {momentum}")
        self.temperature = float(temperature)
        self.momentum = float(momentum)
        self.register_buffer("memory", F.normalize(torch.randn(num_classes, dim), dim=1))

    @torch.compiler.disable
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Logits ``(N, K)`` float32 (``memory``'s dtype) for ``x`` ``(N, D)`` (cast to that dtype; computed
        outside autocast) and targets ``y`` ``(N,)`` int64 (negative: no update). The memory is updated in
        the backward pass (see :class:`LinearAverageOp`).

        Raises:
            ValueError: ``x`` not ``(N, D)`` or ``y`` not ``(N,)``.
        """
        if x.dim() != 2 or x.shape[1] != self.memory.shape[1] or y.shape != (x.shape[0],):
            raise ValueError(f"MomentumLabelMemory: need x (N, {self.memory.shape[1]}) and y (N,), got x "
                             f"{tuple(x.shape)} and y {tuple(y.shape)}")
        with torch.autocast(x.device.type, enabled=False):
            return LinearAverageOp.apply(x.to(self.memory.dtype), y.to(x.device, torch.long), self.memory,
                                         self.temperature, self.momentum)

    def extra_repr(self) -> str:
        """Size, temperature and momentum, for ``print(model)``."""
        k, d = self.memory.shape
        return f"num_classes={k}, dim={d}, temperature={self.temperature}, momentum={self.momentum}"
