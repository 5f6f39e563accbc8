"""Feature shards for k-means: dumping features of a data dir, and reading them back.

As HuBERT's ``simple_kmeans`` (``dump_*_feature.py``, ``feature_utils.py``), the utterances of a data dir
(sorted by id) are split into ``nshard`` contiguous shards and shard ``rank`` is written under
``<feat-dir>/<split>_<rank>_<nshard>``:

- ``.npy``: float32 ``(sum of T, D)``, the frames of the shard's utterances one after the other;
- ``.len``: one line ``<utt-id> <T>`` per utterance, in the order of the ``.npy`` rows;
- ``.json``: ``{"features", "rate" (Hz), "dim", "data_dir", "rank", "nshard", "num_utts", "num_frames"}``.

Each file is written atomically and the ``.json`` last, so a shard is complete when its ``.json`` exists;
a complete shard of the same features is skipped when the dump is run again (resume). Unlike the original,
utterance ids are stored with the lengths, so labels can be written per utterance.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from avsr.data.datadir import Utterance
from avsr.fileio import atomic_path, tmp_path_for, write_text_atomic

__all__ = ["FeatureDumpError", "FeatureExtractor", "FeatureShard", "shard_prefix", "shard_range",
           "dump_shard", "dump_data_dir", "read_shard", "find_shards"]

logger = logging.getLogger("avsr.clustering.shards")


class FeatureDumpError(ValueError):
    """Feature shards are missing, unfinished, inconsistent or of other features; the message names the
    file."""


class FeatureExtractor(Protocol):
    """What :func:`dump_shard` needs from a feature extractor (see :mod:`avsr.clustering.extract`).

    Attributes:
        description: what the features are, e.g. ``mfcc`` or ``layer6 of exp/iter1/epoch100.pt``.
        rate: frames per second (Hz) of the features.
    """

    description: str
    rate: int

    def __call__(self, utts: Sequence[Utterance]) -> Iterator[tuple[str, np.ndarray]]:
        """Yield ``(utt_id, float32 (T, D))`` once for every utterance, in any order."""
        ...


@dataclass
class FeatureShard:
    """A shard read back by :func:`read_shard`.

    Attributes:
        prefix: ``<feat-dir>/<split>_<rank>_<nshard>``.
        feats: float32 ``(N, D)`` (memory-mapped).
        utt_ids: the utterances, in row order.
        lengths: int64 ``(num_utts,)`` frames per utterance; ``lengths.sum() == N``.
        info: the ``.json`` metadata.
    """

    prefix: Path
    feats: np.ndarray
    utt_ids: list[str]
    lengths: np.ndarray
    info: dict[str, Any]

    def offsets(self) -> np.ndarray:
        """int64 ``(num_utts + 1,)``: utterance ``i`` is rows ``offsets[i]:offsets[i + 1]``."""
        return np.concatenate([[0], np.cumsum(self.lengths)])


def shard_prefix(feat_dir: str | os.PathLike, split: str, rank: int, nshard: int) -> Path:
    """``<feat_dir>/<split>_<rank>_<nshard>`` (the original's file naming, without extension)."""
    return Path(feat_dir) / f"{split}_{rank}_{nshard}"


def shard_range(num_utts: int, nshard: int, rank: int) -> tuple[int, int]:
    """Utterances ``[start, end)`` of shard ``rank``: ``start = rank * num_utts // nshard`` (contiguous and as
    even as possible, so no shard is empty when ``nshard <= num_utts``).

    Raises:
        FeatureDumpError: ``rank`` not in ``0..nshard-1`` or more shards than utterances.
    """
    if nshard < 1 or not 0 <= rank < nshard:
        raise FeatureDumpError(f"shard rank {rank} must be in 0..nshard-1 (nshard={nshard})")
    if nshard > num_utts:
        raise FeatureDumpError(f"{nshard} shards for {num_utts} utterances: use --nshard <= {num_utts}")
    return rank * num_utts // nshard, (rank + 1) * num_utts // nshard


def _file(prefix: Path, ext: str) -> Path:
    """``<prefix><ext>`` (``with_suffix`` would cut a split name that has a dot)."""
    return prefix.with_name(prefix.name + ext)


def _finished(prefix: Path, description: str, data_dir: str, utt_ids: list[str], overwrite: bool) -> bool:
    """True when the shard is complete with the same features and utterances; raise when it holds others."""
    meta = _file(prefix, ".json")
    if not meta.is_file() or overwrite:
        return False
    info = json.loads(meta.read_text(encoding="utf-8"))
    done_ids = [line.split()[0] for line in _file(prefix, ".len").read_text(encoding="utf-8").splitlines()]
    if info.get("features") != description or sorted(done_ids) != sorted(utt_ids):
        raise FeatureDumpError(
            f"{meta}: a finished shard of other features or utterances ('{info.get('features')}' of "
            f"{info.get('data_dir')}) is in the way of '{description}' of {data_dir}; remove it, use another "
            "feature dir, or --overwrite"
        )
    return True


def dump_shard(
    utts: Sequence[Utterance], extractor: FeatureExtractor, feat_dir: str | os.PathLike, split: str,
    nshard: int = 1, rank: int = 0, data_dir: str = "", overwrite: bool = False,
) -> Path:
    """Compute the features of shard ``rank`` of ``utts`` and write its three files (see module docstring).

    The ``.npy`` is streamed: frames go to a raw temporary file as they are computed, and the final file is
    its ``.npy`` header followed by those bytes, so a shard never has to fit in memory.

    Args:
        utts: all utterances of the data dir, sorted by id (the shard takes its contiguous part).
        extractor: gives ``(utt_id, (T, D) float32)`` per utterance.
        feat_dir: output directory (created).
        split: name of the set (file name prefix), e.g. ``train``.
        nshard, rank: this process writes shard ``rank`` of ``nshard``.
        data_dir: recorded in the metadata.
        overwrite: recompute a finished shard.

    Returns:
        the shard's prefix ``<feat_dir>/<split>_<rank>_<nshard>``.

    Raises:
        FeatureDumpError: bad ``rank``/``nshard``; a finished shard of other features is in the way; the
            extractor gives features of another dimension, an empty one or a missing/extra utterance
            (named).
        avsr.data.media.MediaError, avsr.data.datadir.DataDirError: from reading media (file named).
    """
    start, end = shard_range(len(utts), nshard, rank)
    part = list(utts[start:end])
    ids = [u.utt_id for u in part]
    prefix = shard_prefix(feat_dir, split, rank, nshard)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    if _finished(prefix, extractor.description, data_dir, ids, overwrite):
        logger.info("%s: finished shard, skipped", prefix)
        return prefix
    _file(prefix, ".json").unlink(missing_ok=True)  # the shard is unfinished until its new .json exists
    npy, raw = _file(prefix, ".npy"), tmp_path_for(_file(prefix, ".raw"))
    lengths: dict[str, int] = {}
    order: list[str] = []
    dim = None
    try:
        with open(raw, "wb") as f:
            for utt_id, feats in tqdm(extractor(part), total=len(part), desc=f"{split} {rank}/{nshard}",
                                      unit="utt", mininterval=5):
                feats = np.ascontiguousarray(feats, dtype=np.float32)
                if utt_id not in ids or utt_id in lengths:
                    raise FeatureDumpError(f"{prefix}: the extractor gave utterance '{utt_id}' unexpectedly")
                if feats.ndim != 2 or feats.shape[0] == 0 or (dim is not None and feats.shape[1] != dim):
                    raise FeatureDumpError(
                        f"{prefix}: utterance '{utt_id}' has features of shape {feats.shape} "
                        f"(expected (T >= 1, {dim or 'D'}))"
                    )
                dim = feats.shape[1]
                f.write(feats.tobytes())
                lengths[utt_id] = feats.shape[0]
                order.append(utt_id)
        missing = [u for u in ids if u not in lengths]
        if missing:
            raise FeatureDumpError(
                f"{prefix}: no features for utterance '{missing[0]}' ({len(missing)} in all)"
            )
        total = sum(lengths.values())
        with atomic_path(npy) as tmp, open(tmp, "wb") as out, open(raw, "rb") as src:
            np.lib.format.write_array_header_1_0(
                out, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False,
                      "shape": (total, dim)})
            shutil.copyfileobj(src, out, 1 << 24)
    finally:
        raw.unlink(missing_ok=True)
    write_text_atomic(_file(prefix, ".len"), "".join(f"{u} {lengths[u]}\n" for u in order))
    info = {"features": extractor.description, "rate": extractor.rate, "dim": dim, "data_dir": data_dir,
            "rank": rank, "nshard": nshard, "num_utts": len(order), "num_frames": total}
    write_text_atomic(_file(prefix, ".json"), json.dumps(info, indent=1) + "\n")
    logger.info("%s: %d utterances, %d frames of dim %d", prefix, len(order), total, dim)
    return prefix


def dump_data_dir(data_dir: str | os.PathLike, extractor: FeatureExtractor, feat_dir: str | os.PathLike,
                  split: str | None = None, nshard: int = 1, rank: int | None = None,
                  overwrite: bool = False) -> int:
    """Dump the features of a data dir (transcripts not needed): shard ``rank`` of ``nshard``, or every
    shard one after the other when ``rank`` is None (:func:`dump_shard`; ``split`` defaults to the data dir's
    name). Returns the number of utterances of the data dir.

    Raises:
        as :func:`avsr.data.datadir.read_datadir` and :func:`dump_shard`.
    """
    from avsr.data.datadir import read_datadir

    utts = read_datadir(data_dir, require_text=False)
    split = split or Path(data_dir).name
    for r in range(nshard) if rank is None else [rank]:
        dump_shard(utts, extractor, feat_dir, split, nshard, r, str(data_dir), overwrite)
    return len(utts)


def read_shard(prefix: str | os.PathLike) -> FeatureShard:
    """Read a finished shard (features memory-mapped).

    Raises:
        FeatureDumpError: the shard is unfinished (no ``.json``), or its ``.len`` disagrees with the ``.npy``
            (file named).
    """
    prefix = Path(prefix)
    meta = _file(prefix, ".json")
    if not meta.is_file():
        raise FeatureDumpError(f"{meta} not found: shard {prefix} is missing or unfinished")
    info = json.loads(meta.read_text(encoding="utf-8"))
    feats = np.load(_file(prefix, ".npy"), mmap_mode="r")
    utt_ids, lengths = [], []
    for lineno, line in enumerate(_file(prefix, ".len").read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise FeatureDumpError(f"{_file(prefix, '.len')}:{lineno}: expected '<utt-id> <frames>'")
        utt_ids.append(parts[0])
        lengths.append(int(parts[1]))
    lengths_arr = np.asarray(lengths, dtype=np.int64)
    if feats.ndim != 2 or feats.shape[0] != lengths_arr.sum():
        raise FeatureDumpError(f"{prefix}.npy has shape {feats.shape} but {prefix}.len lists "
                               f"{int(lengths_arr.sum())} frames")
    return FeatureShard(prefix, feats, utt_ids, lengths_arr, info)


def find_shards(feat_dir: str | os.PathLike, split: str) -> list[Path]:
    """The prefixes of the finished shards ``<split>_<rank>_<nshard>`` of ``feat_dir``, by rank.

    Raises:
        FeatureDumpError: no finished shard, shards of several ``nshard`` values, or a rank missing (named).
    """
    feat_dir = Path(feat_dir)
    pattern = re.compile(re.escape(split) + r"_(\d+)_(\d+)\.json")
    found: dict[int, dict[int, Path]] = {}
    for p in feat_dir.glob(f"{split}_*_*.json"):
        m = pattern.fullmatch(p.name)
        if m:
            found.setdefault(int(m.group(2)), {})[int(m.group(1))] = p.with_name(p.name[: -len(".json")])
    if not found:
        raise FeatureDumpError(f"no finished feature shard {split}_<rank>_<nshard> in {feat_dir}")
    if len(found) > 1:
        raise FeatureDumpError(f"{feat_dir}: shards of {split} for several shard counts {sorted(found)}")
    nshard, ranks = next(iter(found.items()))
    missing = [r for r in range(nshard) if r not in ranks]
    if missing:
        first = shard_prefix(feat_dir, split, missing[0], nshard)
        raise FeatureDumpError(
            f"{feat_dir}: shard {first} is missing or unfinished ({len(missing)} of {nshard} in all)"
        )
    return [ranks[r] for r in range(nshard)]
