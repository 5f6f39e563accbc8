"""Numeric precision of training and inference: ``auto``, ``fp32`` or ``bf16`` (bfloat16 autocast).

One setting, ``precision``, used alike by the trainer (``precision:`` and ``video_precision:`` in a training
YAML), the decoding tools and the Transcriber:

* ``auto``: ``bf16`` where the device computes bfloat16 natively, ``fp32`` elsewhere
  (:func:`resolve_precision`, :func:`native_bf16`). bfloat16 without hardware support is emulated and
  slower than float32: on a 2-core AMD EPYC with AVX2 only, the forward + backward pass of the SynthGRID
  recipe's video front-end took 10.7 s in bf16 against 2.0 s in fp32.
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
import functools
import logging
import os
import platform

import torch

__all__ = ["PRECISIONS", "check_precision", "native_bf16", "resolve_precision", "machine_summary",
           "autocast_context", "fp32_context", "autocast_dtype", "flush_denormal"]

logger = logging.getLogger(__name__)

#: accepted values of the ``precision`` setting.
PRECISIONS = ("auto", "fp32", "bf16")

#: torch's CPU capabilities (:func:`torch.backends.cpu.get_cpu_capability`) whose kernels use the CPU's
#: bfloat16 instructions when it has them (x86: AVX-512 BF16 and AMX; Arm: SVE with BF16).
_BF16_KERNEL_CAPABILITIES = ("AVX512", "SVE256")


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


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first CPU's fields of Linux's ``/proc/cpuinfo`` (``{}`` where there is none), read once."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if not sep:  # the blank line after the first processor
                    break
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (``flags`` on x86, ``Features`` on Arm); else empty."""
    info = _cpuinfo()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def _cpu_model() -> str:
    """The CPU's model name (``lscpu``'s "Model name"), else :func:`platform.processor`."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown CPU"


def native_bf16(device: str | torch.device = "cpu") -> tuple[bool, str]:
    """Whether ``device`` computes bfloat16 natively (fast), and why, in words.

    * CPU: the CPU has bfloat16 instructions (x86: ``avx512_bf16`` or ``amx_bf16`` in its flags; Arm:
      ``bf16``) *and* torch runs its kernels at a capability that uses them
      (:func:`torch.backends.cpu.get_cpu_capability` ``AVX512`` / ``SVE256``; the environment variable
      ``ATEN_CPU_CAPABILITY=avx2`` lowers it, as on an AVX2-only CPU). Without them, oneDNN and ATen emulate
      bfloat16 by converting to float32 around every kernel: on an AVX2-only AMD EPYC the video front-end's
      forward + backward pass runs 5x slower than in float32.
    * CUDA: :func:`torch.cuda.is_bf16_supported` without emulation (Ampere and later GPUs).
    * any other device type: False.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a :class:`torch.device`.

    Returns:
        ``(native, reason)``: e.g. ``(True, "Intel(R) Xeon(R) Processor has AMX-BF16 (torch CPU capability
        AVX512)")``.

    Source: Intel 64 and IA-32 Architectures Software Developer's Manual (AVX512_BF16, AMX-BF16 CPUID flags);
    PyTorch ``torch.backends.cpu.get_cpu_capability`` and ``torch.cuda.is_bf16_supported``.
    """
    device = torch.device(device)
    return _native_bf16(device.type, device.index)


@functools.cache
def _native_bf16(device_type: str, index: int | None) -> tuple[bool, str]:
    """:func:`native_bf16` of one device, worked out once per process: :func:`autocast_context` asks on every
    forward pass, and neither the hardware nor torch's kernel capability changes while a process runs."""
    device = torch.device(device_type, index) if index is not None else torch.device(device_type)
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return False, "CUDA is not available"
        name = torch.cuda.get_device_name(device)
        try:
            native = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch < 2.4 has no including_emulation
            native = torch.cuda.is_bf16_supported()
        return native, f"{name} {'computes' if native else 'does not compute'} bfloat16 natively"
    if device_type != "cpu":
        return False, f"no bfloat16 rule for device type {device_type!r}"
    flags, model = _cpu_flags(), _cpu_model()
    capability = torch.backends.cpu.get_cpu_capability()
    units = [name for flag, name in (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX-512 BF16"),
                                     ("bf16", "BF16")) if flag in flags]
    if not units:
        return False, (f"{model} has no bfloat16 instructions (no AVX-512 BF16 or AMX; torch CPU capability "
                       f"{capability})")
    if capability not in _BF16_KERNEL_CAPABILITIES:
        return False, (f"{model} has {units[0]} but torch runs its {capability} kernels "
                       f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '')!r})")
    return True, f"{model} has {units[0]} (torch CPU capability {capability})"


def machine_summary(device: str | torch.device = "cpu") -> str:
    """One line naming the machine a figure was measured on, for benchmarks and logs.

    CPU: model, the cores this process may use, torch's kernel capability and whether bfloat16 is native,
    e.g. ``"CPU Intel(R) Xeon(R) Processor, 2 cores, torch AVX512 kernels, native bf16: yes"``. CUDA: the
    GPU's name, compute capability and memory, then the CPU line.

    Args:
        device: the device the figures come from.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    native = native_bf16("cpu")[0]
    cpu = (f"CPU {_cpu_model()}, {cores} cores, torch {torch.backends.cpu.get_cpu_capability()} kernels, "
           f"native bf16: {'yes' if native else 'no'}")
    if _device_type(device) == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        gpu_native = native_bf16(device)[0]
        return (f"GPU {props.name} (compute capability {props.major}.{props.minor}, "
                f"{props.total_memory / 2**30:.0f} GiB), native bf16: {'yes' if gpu_native else 'no'}; {cpu}")
    return cpu


_logged: set[tuple] = set()


def resolve_precision(precision: str, device: str | torch.device, what: str = "precision") -> str:
    """``precision`` made concrete for ``device``: ``fp32`` or ``bf16``.

    ``auto`` becomes ``bf16`` where :func:`native_bf16` says the device computes it natively and ``fp32``
    elsewhere; the choice is logged once per process (per setting, device type and outcome) with its reason.
    An explicit ``bf16`` on a device without native bfloat16 is kept, with a one-line warning (once) that
    it runs emulated and slower than ``fp32``. ``fp32`` stays ``fp32``.

    Args:
        precision: one of :data:`PRECISIONS`.
        device: the device the model runs on.
        what: the setting's name, for the log line and errors (e.g. ``"video_precision"``).

    Returns:
        ``"fp32"`` or ``"bf16"``.

    Raises:
        ValueError: unknown ``precision`` (the message names ``what``).
    """
    check_precision(precision, what)
    if precision == "fp32":
        return "fp32"
    native, reason = native_bf16(device)
    if precision == "auto":
        chosen = "bf16" if native else "fp32"
        key = ("auto", what, _device_type(device), chosen)
        if key not in _logged:
            _logged.add(key)
            logger.info("%s auto -> %s on %s: %s", what, chosen, _device_type(device), reason)
        return chosen
    key = ("bf16", what, _device_type(device), native)
    if not native and key not in _logged:
        _logged.add(key)
        logger.warning("%s bf16 on %s without native bfloat16 (%s): emulated, expect it several times slower "
                       "than fp32 (5x for the video front-end on an AVX2-only CPU); 'auto' would choose fp32",
                       what, _device_type(device), reason)
    return "bf16"


def _device_type(device: str | torch.device) -> str:
    """``"cpu"``, ``"cuda"``, ... of ``device`` (``"cuda:1"`` -> ``"cuda"``)."""
    return torch.device(device).type


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a concrete ``precision``: ``torch.bfloat16`` for ``bf16``, None for ``fp32``.

    Raises:
        ValueError: unknown ``precision``, or ``auto`` (resolve it first with :func:`resolve_precision`).
    """
    if check_precision(precision) == "auto":
        raise ValueError("precision 'auto' has no dtype before it is resolved for a device "
                         "(resolve_precision)")
    return torch.bfloat16 if precision == "bf16" else None


def autocast_context(device: str | torch.device, precision: str) -> contextlib.AbstractContextManager:
    """A context manager that runs the enclosed model code on ``device`` in ``precision``.

    ``bf16``: ``torch.autocast(device_type, dtype=torch.bfloat16)``. ``auto``: as
    :func:`resolve_precision` chooses for ``device``. ``fp32``: ``torch.autocast(device_type,
    enabled=False)``, which also switches off an autocast region the caller may have opened, so that
    ``fp32`` always means float32. Use it around the forward pass only (not around ``backward()`` or the
    optimiser step, which follow the forward's dtypes by themselves)::

        with autocast_context(model_device, "bf16"):
            result = searcher.decode(audio, video, lengths)     # encoder + decoder in bf16, scores fp32

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
    dtype = autocast_dtype(resolve_precision(precision, device))
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
    (``benchmarks/profile_train.py``, 2 threads of an Intel Xeon with AVX-512 BF16 and AMX). Values that
    small carry no information for training (GPUs flush them in most kernels too); inference and the
    parity tests keep the default (off).

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
