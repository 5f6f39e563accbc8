"""Numeric precision of training and inference: ``fp32`` or ``bf16`` (bfloat16 autocast).

One setting, ``precision``, used alike by the trainer (``precision:`` in a training YAML), the decoding tools
and the Transcriber:

* ``fp32``: every operation in float32 -- the computation of the original AV-HuBERT code.
* ``bf16``: :func:`torch.autocast` with ``dtype=torch.bfloat16`` on the device of the model (CPU or CUDA).
  Matrix products and convolutions run in bfloat16 (8-bit mantissa, float32's exponent range, so no loss
  scaling is needed), with float32 accumulation inside the kernels; parameters, gradients and optimiser
  state stay float32. What must stay float32 is computed outside autocast or on ``.float()`` inputs by
  the models: CTC (log-softmax and the loss), the attention loss's log-softmax, beam-search scores, the
  pretraining logits and the momentum label memory, the feature penalty. On CPUs with AVX-512 BF16 / AMX
  (Intel Sapphire Rapids and later, AMD Zen 4 and later) and on Ampere or later GPUs the bfloat16 kernels
  are several times faster than float32; elsewhere bfloat16 may be slower.

Source: PyTorch automatic mixed precision (``torch.amp``), Micikevicius et al. (2018), "Mixed Precision
Training", Sec. 3 (float32 master weights; reductions in float32), and Kalamkar et al. (2019), "A Study of
BFLOAT16 for Deep Learning Training".
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["PRECISIONS", "check_precision", "autocast_context", "fp32_context", "autocast_dtype",
           "flush_denormal"]

#: accepted values of the ``precision`` setting.
PRECISIONS = ("fp32", "bf16")


def check_precision(precision: str, where: str = "precision") -> str:
    """Return ``precision`` if it is one of :data:`PRECISIONS`.

    Args:
        precision: the value to check.
        where: what is being checked, for the message (e.g. ``"conf/train/x.yaml: precision"``).

    Raises:
        ValueError: any other value (the message names ``where`` and the accepted values).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"{where} must be one of {list(PRECISIONS)}, got {precision!r}")
    return precision


def _device_type(device: str | torch.device) -> str:
    """``"cpu"``, ``"cuda"``, ... of ``device`` (``"cuda:1"`` -> ``"cuda"``)."""
    return torch.device(device).type


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of ``precision``: ``torch.bfloat16`` for ``bf16``, None for ``fp32``.

    Raises:
        ValueError: unknown ``precision``.
    """
    return torch.bfloat16 if check_precision(precision) == "bf16" else None


def autocast_context(device: str | torch.device, precision: str) -> contextlib.AbstractContextManager:
    """A context manager that runs the enclosed model code on ``device`` in ``precision``.

    ``bf16``: ``torch.autocast(device_type, dtype=torch.bfloat16)``. ``fp32``: ``torch.autocast(device_type,
    enabled=False)``, which also switches off an autocast region the caller may have opened, so that
    ``fp32`` always means float32. Use it around the forward pass only (not around ``backward()`` or the
    optimiser step, which follow the forward's dtypes by themselves)::

        with autocast_context(model_device, "bf16"):
            hyps = model.decode_nbest(audio, video, lengths)      # encoder + decoder in bf16, scores fp32

    Args:
        device: the device the model runs on (``"cpu"``, ``"cuda"``, ``"cuda:0"`` or a ``torch.device``);
            only its type matters.
        precision: one of :data:`PRECISIONS`.

    Returns:
        A fresh context manager (one per ``with``).

    Raises:
        ValueError: unknown ``precision``, or a device type that autocast does not support (the message of
            :class:`torch.autocast`).
    """
    dtype = autocast_dtype(precision)
    device_type = _device_type(device)
    try:
        if dtype is None:
            return torch.autocast(device_type, enabled=False)
        return torch.autocast(device_type, dtype=dtype)
    except RuntimeError as e:  # e.g. an unknown device type
        raise ValueError(f"precision {precision!r} on device {device!s}: {e}") from e


def fp32_context(device: str | torch.device) -> contextlib.AbstractContextManager:
    """A region computed in float32 even inside an autocast region (autocast switched off for ``device``).

    The inputs must be float32 already (call ``.float()`` on them): autocast being off, operations take
    their inputs' dtypes. Same as ``autocast_context(device, "fp32")``.
    """
    return autocast_context(device, "fp32")


def flush_denormal(enabled: bool = True) -> bool:
    """Treat subnormal float32/bfloat16 numbers (magnitude below 1.18e-38) as zero on the CPU (FTZ/DAZ).

    As training proceeds, attention and output distributions sharpen and GELU sees large negative inputs:
    ``exp`` underflows into the subnormal range, and x86 CPUs compute on subnormals up to ~100x slower
    (microcode assists). In the SynthGRID recipe the steps of the 2nd epoch took 124.6 instead of 138.3 ms
    with the flush, and with a trained model's weights its audio-only steps 65 instead of 89 ms
    (``benchmarks/profile_train.py``, 2 threads). Values that small carry no
    information for training (GPUs flush them in most kernels too); inference and the parity tests keep
    the default (off).

    The flag is per thread (the MXCSR register) and new threads inherit it: call this before the first
    parallel torch operation of the process (before building the model), so that the intra-op worker
    threads are created with it; called later, only the calling thread has it.

    Args:
        enabled: True to flush, False to restore IEEE subnormals.

    Returns:
        whether the CPU supports it (x86 with SSE3; False elsewhere, where nothing changes).

    Source: :func:`torch.set_flush_denormal`; Intel 64 and IA-32 Architectures Optimization Reference
    Manual, "Floating-point exceptions / denormals" (FTZ and DAZ).
    """
    return bool(torch.set_flush_denormal(bool(enabled)))
