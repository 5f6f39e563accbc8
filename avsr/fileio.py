"""Atomic file writing: a temporary file beside the target, then ``os.replace``.

An interrupted run never leaves a truncated output behind, so a stage that finds a file can trust it (the
recipes' resumption relies on this). Binary outputs with their own writers (checkpoints, wav, mp4, k-means
models) follow the same pattern in :mod:`avsr.train.checkpoint`, :mod:`avsr.data.media` and
:mod:`avsr.clustering.kmeans`.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["tmp_path_for", "write_text_atomic"]


def tmp_path_for(path: str | os.PathLike) -> Path:
    """A temporary path in the same directory as ``path`` (so that ``os.replace`` onto it is atomic), unique
    per process: ``<dir>/.<name>.<pid>.tmp``."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; the temporary file is removed if writing fails.

    Raises:
        OSError: the directory does not exist or is not writable (as :meth:`pathlib.Path.write_text`).
    """
    tmp = tmp_path_for(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
