"""Training curves: TensorBoard events and per-metric PNG plots, redrawn after every epoch.

The trainer appends one record per epoch to ``exp_dir/train_log.jsonl`` (``{"epoch", "step", "time_s",
"lr", "train": {stat: value}, "valid": {stat: value}}``). :class:`TrainingCurves` turns each record into
TensorBoard scalars (``exp_dir/tensorboard/``, tags ``train/<stat>``, ``valid/<stat>`` and ``lr``, x = epoch)
and redraws ``exp_dir/images/<stat>.png`` from the whole log -- one figure per statistic with the training and
the validation curve against the epoch, and ``lr.png``, as ESPnet's trainer draws ``exp/<name>/images/``
(``espnet2/train/reporter.py``). The statistics are whatever the model reports: for ``AVSRModel`` ``loss``,
``loss_ctc``, ``loss_att``, ``acc`` (and ``cer``/``wer`` where a model computes them), for the pretraining
model ``loss``, ``loss_masked``, ``loss_unmasked``, ``loss_features_pen``, ``acc_masked``,
``acc_unmasked``. Counters (names starting with ``n_``) are not drawn.

TensorBoard events need the ``tensorboard`` package (a requirement of avsr); without it only the PNGs are
written, with one warning. ``python -m avsr.train.curves EXP_DIR`` redraws the PNGs of a finished run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from avsr.fileio import atomic_path

__all__ = ["TrainingCurves", "read_train_log", "plot_curves"]

logger = logging.getLogger("avsr.train")


def read_train_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``train_log.jsonl`` (one JSON object per line), in file order; for an epoch that
    appears twice (a resumed run re-did it), the last record.

    Raises:
        FileNotFoundError: no such file. ValueError: a line that is not JSON (file and line named).
    """
    by_epoch: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON record ({e})") from e
            by_epoch[int(rec["epoch"])] = rec
    return [by_epoch[k] for k in sorted(by_epoch)]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _stat_names(records: list[Mapping[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for rec in records:
        for part in ("train", "valid"):
            for k, v in (rec.get(part) or {}).items():
                if not k.startswith("n_") and _finite(v):
                    names[k] = None
    return list(names)


def plot_curves(records: list[Mapping[str, Any]], out_dir: str | os.PathLike) -> list[Path]:
    """Draw ``out_dir/<stat>.png`` (train and valid against epoch) for every statistic, and ``lr.png``.

    Args:
        records: ``train_log.jsonl`` records (:func:`read_train_log`).
        out_dir: the images directory (created).

    Returns:
        The PNG files written (each replaced atomically).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    series = [(name, [("train", name), ("valid", name)]) for name in _stat_names(records)]
    series.append(("lr", [(None, "lr")]))
    for name, curves in series:
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = False
        for part, key in curves:
            points = [
                (rec["epoch"], (rec.get(part) or {}).get(key) if part else rec.get(key)) for rec in records
            ]
            points = [(e, v) for e, v in points if _finite(v)]
            if points:
                ax.plot(*zip(*points), marker="o", label=part or key)
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=80)
        plt.close(fig)
        written.append(path)
    return written


class TrainingCurves:
    """Writes the curves of one experiment directory; call :meth:`log_epoch` after each epoch's record.

    Args:
        exp_dir: the experiment directory (``train_log.jsonl`` is read from it; ``tensorboard/`` and
            ``images/`` are written into it).
    """

    def __init__(self, exp_dir: str | os.PathLike) -> None:
        self.exp_dir = Path(exp_dir)
        self._writer: Any = None
        self._no_tensorboard = False

    def _summary_writer(self) -> Any:
        if self._writer is None and not self._no_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # tensorboard is a requirement, but keep training without it
                logger.warning("no TensorBoard events (%s); the PNG curves are still drawn", e)
                self._no_tensorboard = True
                return None
            self._writer = SummaryWriter(log_dir=str(self.exp_dir / "tensorboard"))
        return self._writer

    def log_epoch(self, record: Mapping[str, Any]) -> None:
        """Add one epoch's record (the ``train_log.jsonl`` format) to TensorBoard and redraw the PNGs from
        ``exp_dir/train_log.jsonl`` (the record is expected to be in it already)."""
        writer = self._summary_writer()
        epoch = int(record["epoch"])
        if writer is not None:
            for part in ("train", "valid"):
                for k, v in (record.get(part) or {}).items():
                    if _finite(v):
                        writer.add_scalar(f"{part}/{k}", v, epoch)
            if _finite(record.get("lr")):
                writer.add_scalar("lr", record["lr"], epoch)
            writer.flush()
        log = self.exp_dir / "train_log.jsonl"
        plot_curves(read_train_log(log) if log.is_file() else [dict(record)], self.exp_dir / "images")

    def close(self) -> None:
        """Close the TensorBoard writer (events are flushed after every epoch anyway)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def main(argv: list[str] | None = None) -> int:
    """``python -m avsr.train.curves EXP_DIR``: redraw ``EXP_DIR/images/*.png`` from its train_log.jsonl."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m avsr.train.curves EXP_DIR", file=sys.stderr)
        return 2
    exp = Path(args[0])
    try:
        for path in plot_curves(read_train_log(exp / "train_log.jsonl"), exp / "images"):
            print(path)
    except (OSError, ValueError) as e:
        print(f"avsr.train.curves: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
