"""Quality of cluster labels against frame-level phone labels: phone purity, cluster purity and PNMI.

Definitions of the HuBERT paper (Hsu et al., 2021, Sec. IV-D "Analysis: clustering quality"; the numbers
of fairseq's ``examples/hubert/measure_teacher_quality.py``). With ``y`` the phone and ``z`` the cluster of a
frame, the joint distribution ``p(y, z)`` is the frame-level co-occurrence count divided by the number of
frames, and

- phone purity    ``E_z[max_y p(y | z)] = sum_z max_y p(y, z)`` (how well a cluster predicts one phone),
- cluster purity  ``E_y[max_z p(z | y)] = sum_y max_z p(y, z)`` (how much a phone stays in one cluster),
- PNMI            ``I(y; z) / H(y)`` (the fraction of the phone's uncertainty the cluster removes),

with ``0 log 0 = 0`` (the original adds 1e-8 inside the logs instead). Phones come from the SynthGRID
festival alignments: the ``.phn`` file beside each utterance's wav (``<wav path without .wav>.phn``, lines
``start_s end_s phone``); label frame ``i`` at rate ``r`` takes the phone of the segment holding its centre
time ``(i + 0.5) / r``. Frames outside every segment (after the last one, or in a gap) get the silence phone
``pau`` by default, or are dropped (``outside=None``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from avsr.clustering.labels import read_label_meta, read_labels
from avsr.data.datadir import read_datadir

__all__ = ["PhoneAlignmentError", "read_phn", "frame_phones", "cluster_quality", "label_quality",
           "results_header", "results_row", "quality_report"]

#: SynthGRID's (festival's) silence phone.
SILENCE = "pau"


class PhoneAlignmentError(ValueError):
    """A phone alignment is missing or malformed, or does not match the labels; the message names the file."""


class QualityReportError(ValueError):
    """A file given to :func:`quality_report` is not a cluster quality result; the message names the file."""


#: the keys of a :func:`label_quality` result that :func:`results_row` reads.
RESULT_KEYS = ("labels", "features", "num_classes", "label_rate", "num_frames", "phone_purity",
               "cluster_purity", "pnmi")


def read_phn(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read a ``.phn`` alignment (lines ``start_s end_s phone``, seconds, in time order).

    Returns:
        ``(starts float64 (S,), ends float64 (S,), phones str array (S,))``.

    Raises:
        FileNotFoundError: no such file.
        PhoneAlignmentError: a line that is not ``start end phone`` with ``0 <= start < end``, segments out of
            time order or overlapping, or no segment; ``<file>:<line>`` named.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"phone alignment not found: {path}")
    starts, ends, phones = [], [], []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) != 3:
                raise ValueError
            start, end = float(parts[0]), float(parts[1])
        except ValueError:
            raise PhoneAlignmentError(
                f"{path}:{lineno}: expected 'start_s end_s phone', got {line!r}"
            ) from None
        if not 0 <= start < end or (ends and start < ends[-1] - 1e-9):
            raise PhoneAlignmentError(
                f"{path}:{lineno}: segment {start}-{end} s is empty, negative or overlaps the previous one"
            )
        starts.append(start)
        ends.append(end)
        phones.append(parts[2])
    if not phones:
        raise PhoneAlignmentError(f"{path}: no phone segment")
    return np.asarray(starts), np.asarray(ends), np.asarray(phones)


def frame_phones(starts: np.ndarray, ends: np.ndarray, phones: np.ndarray, num_frames: int, rate: float,
                 outside: str | None = SILENCE) -> tuple[np.ndarray, np.ndarray]:
    """The phone of each label frame: frame ``i`` takes the segment ``[start, end)`` holding time
    ``(i + 0.5) / rate``.

    Args:
        starts, ends, phones: from :func:`read_phn`.
        num_frames: frames of the label sequence.
        rate: label frames per second (Hz).
        outside: phone of frames outside every segment, or None to drop them.

    Returns:
        ``(frame phones str array (T,), kept bool (T,))``; dropped frames have phone ``""`` and ``kept``
        False.
    """
    t = (np.arange(num_frames) + 0.5) / rate
    seg = np.searchsorted(ends, t, side="right")  # first segment ending after t
    inside = seg < len(ends)
    inside[inside] = starts[seg[inside]] <= t[inside]
    fill = "" if outside is None else outside
    out = np.full(num_frames, fill, dtype=np.result_type(phones.dtype, np.asarray(fill).dtype))
    out[inside] = phones[seg[inside]]
    return out, inside if outside is None else np.ones(num_frames, dtype=bool)


def cluster_quality(phones: np.ndarray, clusters: np.ndarray, num_phones: int | None = None,
                    num_clusters: int | None = None) -> dict[str, float | int]:
    """Phone purity, cluster purity and PNMI of frame-level phone ids against cluster ids (module docstring).

    Args:
        phones: int ``(N,)`` phone id of each frame, in ``0..num_phones-1``.
        clusters: int ``(N,)`` cluster of each frame, in ``0..num_clusters-1``.
        num_phones, num_clusters: sizes of the id ranges (default: largest id + 1).

    Returns:
        ``{"phone_purity", "cluster_purity", "pnmi", "mutual_info" (nats), "phone_entropy" (nats),
        "cluster_entropy" (nats), "num_frames", "num_phones_seen", "num_clusters_used"}``.

    Raises:
        ValueError: empty or differently sized inputs, or ids out of range.
    """
    phones = np.asarray(phones, dtype=np.int64)
    clusters = np.asarray(clusters, dtype=np.int64)
    if phones.shape != clusters.shape or phones.ndim != 1 or phones.size == 0:
        raise ValueError(f"phones {phones.shape} and clusters {clusters.shape} must be equal, non-empty 1-D")
    ny = int(phones.max()) + 1 if num_phones is None else num_phones
    nz = int(clusters.max()) + 1 if num_clusters is None else num_clusters
    if phones.min() < 0 or phones.max() >= ny or clusters.min() < 0 or clusters.max() >= nz:
        raise ValueError(f"ids out of range: phones in [{phones.min()}, {phones.max()}] (num_phones={ny}), "
                         f"clusters in [{clusters.min()}, {clusters.max()}] (num_clusters={nz})")
    counts = np.bincount(phones * nz + clusters, minlength=ny * nz).reshape(ny, nz).astype(np.float64)
    p = counts / counts.sum()
    py, pz = p.sum(1), p.sum(0)

    def entropy(q: np.ndarray) -> float:
        q = q[q > 0]
        return float(-(q * np.log(q)).sum())

    nonzero = p > 0
    mi = float((p[nonzero] * np.log(p[nonzero] / np.outer(py, pz)[nonzero])).sum())
    hy = entropy(py)
    return {
        "phone_purity": float(p.max(0).sum()),
        "cluster_purity": float(p.max(1).sum()),
        "pnmi": mi / hy if hy > 0 else 0.0,
        "mutual_info": mi,
        "phone_entropy": hy,
        "cluster_entropy": entropy(pz),
        "num_frames": int(phones.size),
        "num_phones_seen": int((py > 0).sum()),
        "num_clusters_used": int((pz > 0).sum()),
    }


def label_quality(km_path: str | os.PathLike, data_dir: str | os.PathLike, outside: str | None = SILENCE
                  ) -> dict[str, Any]:
    """:func:`cluster_quality` of a label file against the ``.phn`` alignments of its data dir.

    Args:
        km_path: ``<data-dir>/<name>.km`` with its ``.km.json`` (label rate, K).
        data_dir: the data dir (its ``wav.scp`` locates each utterance's ``.phn``).
        outside: phone of frames outside every segment, or None to drop them.

    Returns:
        :func:`cluster_quality`'s dict plus ``"num_classes"`` (K), ``"label_rate"``, ``"features"``,
        ``"num_utts"``, ``"labels"`` (the label file), ``"outside"``.

    Raises:
        PhoneAlignmentError: an utterance of the labels not in the data dir or without wav, a ``.phn``
            missing (utterance and path named) or malformed, a data dir utterance without labels, or a
            label above K-1.
        avsr.clustering.labels.LabelError, avsr.data.datadir.DataDirError: bad label file or data dir.
    """
    info = read_label_meta(km_path)
    labels = read_labels(km_path)
    utts = {u.utt_id: u for u in read_datadir(data_dir, require_text=False)}
    missing = sorted(set(utts) - set(labels))
    if missing:
        raise PhoneAlignmentError(f"{km_path}: no labels for utterance '{missing[0]}' of {data_dir} "
                                  f"({len(missing)} in all)")
    frame_ph, frame_z = [], []
    for utt_id, z in labels.items():
        u = utts.get(utt_id)
        if u is None or u.wav is None:
            raise PhoneAlignmentError(f"{km_path}: utterance '{utt_id}' has no wav in {data_dir}, so no .phn")
        wav = Path(u.wav)
        phn = wav.with_name(wav.stem + ".phn") if wav.suffix == ".wav" else wav.with_name(wav.name + ".phn")
        if not phn.is_file():
            raise PhoneAlignmentError(f"utterance '{utt_id}': phone alignment {phn} not found")
        ph, kept = frame_phones(*read_phn(phn), len(z), info["label_rate"], outside)
        frame_ph.append(ph[kept])
        frame_z.append(z.numpy()[kept])
    names, phone_ids = np.unique(np.concatenate(frame_ph), return_inverse=True)
    clusters = np.concatenate(frame_z)
    if clusters.size and clusters.max() >= info["num_classes"]:
        raise PhoneAlignmentError(
            f"{km_path}: label {int(clusters.max())} >= num_classes {info['num_classes']}"
        )
    result = cluster_quality(phone_ids, clusters, len(names), info["num_classes"])
    return {**result, "num_classes": info["num_classes"], "label_rate": info["label_rate"],
            "features": info["features"], "num_utts": len(labels), "labels": str(km_path),
            "outside": outside if outside is not None else "dropped"}


def results_header() -> str:
    """Header (two lines) of the RESULTS.md table of :func:`results_row`."""
    return ("| labels | features | K | rate (Hz) | frames | phone purity | cluster purity | PNMI |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|")


def results_row(result: dict[str, Any]) -> str:
    """One RESULTS.md table row of a :func:`label_quality` result."""
    return (f"| {result['labels']} | {result['features']} | {result['num_classes']} | "
            f"{result['label_rate']} | {result['num_frames']} | {result['phone_purity']:.4f} | "
            f"{result['cluster_purity']:.4f} | {result['pnmi']:.4f} |")


def quality_report(paths: list[Path]) -> str:
    """A markdown section with one table row per :func:`label_quality` result JSON (in the given order): the
    section the recipe adds to RESULTS.md (``avsr-cluster-quality --report``).

    Raises:
        FileNotFoundError: a JSON file is missing.
        QualityReportError: a file that is not JSON, or not a cluster quality result (the file and what it
            lacks named).
    """
    rows = []
    for path in paths:
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise QualityReportError(f"{path}: not a cluster quality result (not JSON: {e})") from e
        missing = [k for k in RESULT_KEYS if not isinstance(result, dict) or k not in result]
        if missing:
            raise QualityReportError(f"{path}: not a cluster quality result (no {', '.join(missing)})")
        wrong = [k for k in RESULT_KEYS[2:]
                 if isinstance(result[k], bool) or not isinstance(result[k], (int, float))]
        if wrong:
            raise QualityReportError(
                f"{path}: not a cluster quality result ({', '.join(wrong)}: not numbers)")
        rows.append(results_row(result))
    return ("## Cluster quality\n\nPhone purity, cluster purity and PNMI of the pretraining targets against "
            "the festival phone alignments (HuBERT, Hsu et al. 2021, Sec. IV-D), on the training set.\n\n"
            + results_header() + "\n" + "\n".join(rows) + "\n")
