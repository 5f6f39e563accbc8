"""Cluster label files: ``<data-dir>/<name>.km`` and their ``<name>.km.json`` metadata.

A label file is Kaldi-style text, one line per utterance sorted by utterance id::

    <utt-id> l1 l2 l3 ...

with one non-negative integer label per feature frame at the label rate (100 Hz for MFCC labels, 25 Hz for
labels of encoder-layer features). Unlike AV-HuBERT's ``<split>.km`` (labels only, in the order of the
``.tsv`` manifest), every line names its utterance, so a label file stays valid when the data dir is
re-sorted or subset. The metadata file beside it is JSON::

    {"label_rate": 100 | 25, "num_classes": K, "features": "mfcc" | "layer6 of <ckpt>",
     "kmeans_model": "<path of the k-means model>"}
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from avsr.fileio import write_text_atomic

__all__ = ["LabelError", "read_labels", "write_labels", "read_label_meta", "write_label_meta", "meta_path"]

#: keys of the metadata file, all required.
META_KEYS = ("label_rate", "num_classes", "features", "kmeans_model")


class LabelError(ValueError):
    """A label file or its metadata is malformed; the message names the file (and line)."""


def meta_path(path: str | os.PathLike) -> Path:
    """The metadata file of a label file: ``<path>.json`` (``train/km.km`` -> ``train/km.km.json``)."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def _first_bad(tokens: list[str]) -> str:
    """The first token that is not an int64 (for error messages)."""
    for token in tokens:
        try:
            if -(2**63) <= int(token) < 2**63:
                continue
        except ValueError:
            pass
        return token
    return "?"


def read_labels(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a label file.

    Args:
        path: the ``.km`` file (lines ``<utt-id> l1 l2 ...``; blank lines are skipped).

    Returns:
        ``{utt_id: int64 tensor (T,)}`` in file order.

    Raises:
        FileNotFoundError: no such file.
        LabelError: a line without labels, a label that is not a non-negative integer, or a repeated utterance
            id; the message gives ``<file>:<line>`` and the utterance.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"label file not found: {path}")
    out: dict[str, torch.Tensor] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            utt = parts[0]
            if len(parts) == 1:
                raise LabelError(f"{path}:{lineno}: utterance '{utt}' has no labels")
            if utt in out:
                raise LabelError(f"{path}:{lineno}: utterance '{utt}' is listed twice")
            try:
                labels = np.array(parts[1:], dtype=np.int64)
            except (ValueError, OverflowError):
                raise LabelError(
                    f"{path}:{lineno}: utterance '{utt}': label '{_first_bad(parts[1:])}' is not an integer"
                ) from None
            if labels.min() < 0:
                raise LabelError(f"{path}:{lineno}: utterance '{utt}': negative label {int(labels.min())}")
            out[utt] = torch.from_numpy(labels)
    return out


def write_labels(
    path: str | os.PathLike, labels: Mapping[str, torch.Tensor | np.ndarray | list[int]]
) -> None:
    """Write a label file, sorted by utterance id, atomically (temporary file + ``os.replace``).

    Args:
        path: the ``.km`` file; its directory must exist.
        labels: ``{utt_id: (T,) integer labels}``, tensors, arrays or lists, T >= 1.

    Raises:
        LabelError: an utterance id with whitespace, an empty, non-integer or negative label sequence (the
            message names the utterance and the file).
    """
    path = Path(path)
    lines = []
    for utt in sorted(labels):
        if not utt or any(c.isspace() for c in utt):
            raise LabelError(f"{path}: utterance id {utt!r} is empty or has whitespace")
        value = labels[utt]
        arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        if arr.ndim != 1 or arr.size == 0:
            raise LabelError(f"{path}: utterance '{utt}': labels must be a non-empty 1-D sequence, "
                             f"got shape {arr.shape}")
        if not np.issubdtype(arr.dtype, np.integer):
            raise LabelError(f"{path}: utterance '{utt}': labels must be integers, got {arr.dtype}")
        if arr.min() < 0:
            raise LabelError(f"{path}: utterance '{utt}': negative label {int(arr.min())}")
        lines.append(f"{utt} {' '.join(map(str, arr.tolist()))}\n")
    write_text_atomic(path, "".join(lines))


def write_label_meta(path: str | os.PathLike, label_rate: int, num_classes: int, features: str,
                     kmeans_model: str) -> None:
    """Write the metadata ``<path>.json`` of label file ``path`` atomically (see the module docstring).

    Args:
        path: the ``.km`` label file the metadata describes.
        label_rate: labels per second (Hz): 100 for MFCC, 25 for encoder layers.
        num_classes: K, the number of clusters (labels are in ``0..K-1``).
        features: what was clustered, e.g. ``mfcc`` or ``layer6 of exp/pretrain/iter1/epoch100.pt``.
        kmeans_model: path of the k-means model that gave the labels.
    """
    info = {"label_rate": int(label_rate), "num_classes": int(num_classes), "features": str(features),
            "kmeans_model": str(kmeans_model)}
    write_text_atomic(meta_path(path), json.dumps(info, indent=1) + "\n")


def read_label_meta(path: str | os.PathLike) -> dict[str, Any]:
    """Read the metadata of label file ``path`` (the ``<path>.json`` beside it).

    Returns:
        ``{"label_rate": int, "num_classes": int, "features": str, "kmeans_model": str}`` (and any further
        keys the file has).

    Raises:
        FileNotFoundError: no metadata file.
        LabelError: not JSON, a required key missing, or a rate / class count that is not a positive integer
            (the message names the file and key).
    """
    meta = meta_path(path)
    if not meta.is_file():
        raise FileNotFoundError(f"label metadata not found: {meta} (written by `avsr.bin.kmeans apply`)")
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LabelError(f"{meta}: not valid JSON ({e})") from e
    if not isinstance(info, dict):
        raise LabelError(f"{meta}: expected a JSON object")
    for key in META_KEYS:
        if key not in info:
            raise LabelError(f"{meta}: missing key '{key}'")
    for key in ("label_rate", "num_classes"):
        if not isinstance(info[key], int) or info[key] < 1:
            raise LabelError(f"{meta}: '{key}' must be a positive integer, got {info[key]!r}")
    return info
