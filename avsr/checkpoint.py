"""Atomic checkpoint writing, discovery of the last checkpoint, and parameter averaging.

A checkpoint is a ``torch.save`` dict. Writes go to a temporary file in the same directory followed by
``os.replace``, so an interrupted write never leaves a truncated checkpoint behind. The trainer's checkpoints
record the version of avsr that wrote them (``avsr_version``, :func:`written_by`); checkpoints without it
(written before avsr recorded it, or by other tools) load all the same.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from avsr.compat.safe_load import load_error
from avsr.fileio import atomic_path


def save_atomic(obj: object, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint written by :func:`save_atomic` (weights_only, so no code is executed).

    The file is memory-mapped, so reading only its metadata (e.g. ``valid`` when choosing checkpoints to
    average) does not read every tensor.

    Raises:
        FileNotFoundError: no such file.
        avsr.compat.CheckpointError: the file is truncated or not a torch checkpoint, or it holds objects
            outside the allowed set (the message names the file; :func:`avsr.compat.safe_load.load_error`).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except Exception as e:  # torch raises several types for corrupt files
        raise load_error(path, e) from e


def written_by(state: dict) -> str | None:
    """The avsr version recorded in a loaded checkpoint (``avsr_version``), or None where it records none."""
    version = state.get("avsr_version")
    return str(version) if version is not None else None


def epoch_checkpoints(exp_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """The ``epoch<N>.pt`` files of ``exp_dir`` as (N, path), sorted by N."""
    found = []
    for p in Path(exp_dir).glob("epoch*.pt"):
        m = re.fullmatch(r"epoch(\d+)\.pt", p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def best_checkpoints(exp_dir: str | os.PathLike, nbest: int) -> list[Path]:
    """The ``nbest`` epoch checkpoints of ``exp_dir`` with the highest validation accuracy (ESPnet's
    ``valid.acc.ave``; an epoch without validation counts as its epoch number), sorted by path.

    Raises:
        FileNotFoundError: ``exp_dir`` holds no ``epoch<N>.pt``.
    """
    found = epoch_checkpoints(exp_dir)
    if not found:
        raise FileNotFoundError(f"no epoch<N>.pt checkpoint in {exp_dir}: run the training stage first")
    scored = []
    for n, p in found:
        valid = load_checkpoint(p).get("valid") or {}
        scored.append((float(valid.get("acc", n)), n, p))
    scored.sort(reverse=True)
    return sorted(p for _, _, p in scored[:nbest])


def average_state_dicts(paths: list[str | os.PathLike], key: str = "model") -> dict[str, torch.Tensor]:
    """Element-wise mean of the floating-point parameters of several checkpoints (ESPnet's
    ``average_nbest_models``); integer buffers (e.g. BatchNorm's ``num_batches_tracked``) come from the last.

    Raises:
        ValueError: ``paths`` is empty or the checkpoints hold different keys.
    """
    if not paths:
        raise ValueError("average_state_dicts: no checkpoint given")
    avg: dict[str, torch.Tensor] = {}
    for i, p in enumerate(paths):
        state = load_checkpoint(p)[key]
        if i and set(state) != set(avg):
            raise ValueError(f"checkpoint {p} has other parameters than {paths[0]}")
        for k, v in state.items():
            if not v.is_floating_point():
                avg[k] = v.clone()
            elif i == 0:
                avg[k] = v.clone().double()
            else:
                avg[k] += v.double()
    return {k: (v / len(paths)).to(torch.float32) if v.is_floating_point() else v for k, v in avg.items()}
