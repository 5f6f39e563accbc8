"""Atomic file writing: a temporary file beside the target, then ``os.replace``.

An interrupted run never leaves a truncated output behind, so a stage that finds a file can trust it (the
recipes' resumption relies on this). Every writer of the package goes through :func:`atomic_path`: text
(:func:`write_text_atomic`), checkpoints (:mod:`avsr.checkpoint`), wav and mp4 (:mod:`avsr.data.media`),
k-means models and feature shards (:mod:`avsr.clustering`), plots and ESPnet dumps.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["tmp_path_for", "atomic_path", "write_text_atomic", "remove_stale_tmp", "settled_media_dir"]

_TMP = re.compile(r"^\..+\.(\d+)\.tmp$")


def tmp_path_for(path: str | os.PathLike) -> Path:
    """A temporary path in the same directory as ``path`` (so that ``os.replace`` onto it is atomic), unique
    per process: ``<dir>/.<name>.<pid>.tmp``."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Write ``path`` atomically: yields a temporary path beside it (:func:`tmp_path_for`, suffix ``.tmp``,
    so writers that infer a format from the name must be told it) to write to, which replaces ``path`` when
    the block ends normally and is removed when it raises (the exception propagates)::

        with atomic_path(out) as tmp:
            torch.save(state, tmp)

    Raises:
        OSError: the rename fails (e.g. ``path``'s directory does not exist).
    """
    path = Path(path)
    tmp = tmp_path_for(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; the temporary file is removed if writing fails.

    Raises:
        OSError: the directory does not exist or is not writable (as :meth:`pathlib.Path.write_text`).
    """
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user
        return True
    return True


def remove_stale_tmp(directory: str | os.PathLike, recursive: bool = False) -> list[Path]:
    """Remove the temporary files (:func:`tmp_path_for`) that interrupted writes left in ``directory``: those
    of processes no longer running on this machine. Returns the removed paths (logged by the caller)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in directory.rglob(".*.tmp") if recursive else directory.glob(".*.tmp"):
        match = _TMP.match(path.name)
        if match and path.is_file() and not _alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def settled_media_dir(dst: str | os.PathLike, settings: dict, record: str) -> Path:
    """``<dst>/media`` of a data dir made from another (a test set with other edges or other lips), ready to
    fill: media made with other ``settings`` (a JSON-able dict: the source and the options) are removed, the
    settings are recorded in ``<dst>/<record>``, so that media made with these settings are kept and an
    interrupted run resumes.

    Raises:
        OSError: the folder cannot be made or emptied.
    """
    dst = Path(dst)
    media, path = dst / "media", dst / record
    if media.exists() and (not path.exists() or json.loads(path.read_text()) != settings):
        logging.getLogger("avsr.fileio").info(
            "%s was made from another source or with other options: its media are made anew", dst)
        shutil.rmtree(media)
    media.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(settings, indent=1) + "\n")
    return media
