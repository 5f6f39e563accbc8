"""Preprocess raw face videos into mouth ROIs (96x96 gray 25 fps mp4) and 16 kHz mono wavs, in parallel.

Usage: ``python -m avsr.bin.preprocess_roi --src-dir LRS3 --dst-dir roi [--ext mp4] [--nj 4]
[--landmarks-dir LANDMARKS] [--fail-on-error]``: every ``<src-dir>/<rel>.<ext>`` gives
``<dst-dir>/<rel>.mp4`` and ``<dst-dir>/<rel>.wav``; or ``--list FILE``, one video per line: ``<src>``,
``<src> <dst.mp4>`` or ``<src> <dst.mp4> <start_s> <end_s>``. ``--landmarks-dir DIR`` reads the landmarks
in the layout of AV-HuBERT's ``detect_landmark.py`` instead of detecting them. Resumable; a video that fails
is listed in ``<dst-dir>/failed.tsv`` and the others go on: see :mod:`avsr.data.roi_jobs` (the batch job)
and :mod:`avsr.data.roi` (one video). The exit status is 0 when at least one video is done or was done
before, 1 otherwise or (with ``--fail-on-error``) when any failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import UsageError, tool
from avsr.data.roi import RoiError
from avsr.data.roi_jobs import preprocess_dir

logger = logging.getLogger("avsr.bin.preprocess_roi")


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    p = argparse.ArgumentParser(prog="python -m avsr.bin.preprocess_roi",
                                description="Cut 96x96 gray 25 fps mouth ROIs and 16 kHz mono wavs out of "
                                "raw face videos (resumable, parallel).")
    p.add_argument("--src-dir", help="root of the raw videos (their layout is kept under --dst-dir)")
    p.add_argument("--dst-dir", required=True, help="output root: <rel>.mp4 (ROI) and <rel>.wav per video")
    p.add_argument("--list", help="work list instead of every video under --src-dir; lines: <src> | "
                   "<src> <dst.mp4> | <src> <dst.mp4> <start_s> <end_s>")
    p.add_argument("--ext", default="mp4", help="comma-separated extensions under --src-dir (default mp4)")
    p.add_argument("--nj", type=int, default=1, help="worker processes (default %(default)s)")
    p.add_argument("--smooth-window", "--window-margin", dest="smooth_window", type=int, default=12,
                   help="frames whose mean landmarks align a frame (AV-HuBERT's --window-margin; default "
                   "%(default)s)")
    p.add_argument("--landmarks-dir", help="read iBUG-68 landmarks from <dir>/<video relative to "
                   "--src-dir, no suffix>.pkl (AV-HuBERT's detect_landmark.py output, or .npy) instead of "
                   "detecting them")
    p.add_argument("--fail-on-error", action="store_true", help="exit with status 1 if any video failed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


@tool("avsr-preprocess-roi")
def main(argv: list[str] | None = None) -> int | None:
    """Entry point of ``python -m avsr.bin.preprocess_roi`` and ``avsr preprocess-roi``: the exit status."""
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        exts = tuple(e.strip().lstrip(".") for e in args.ext.split(",") if e.strip())
        summary = preprocess_dir(args.dst_dir, args.src_dir, args.list, exts, args.nj, args.smooth_window,
                                 progress=not args.no_progress, landmarks_dir=args.landmarks_dir)
    except ImportError as exc:  # the [video] extra is missing: a runtime error, in one line
        print(f"avsr-preprocess-roi: error: {exc}", file=sys.stderr)
        return 1
    except RoiError:
        raise  # a data error: avsr.bin.runner prints it in one line
    except ValueError as exc:  # options that cannot be right (an empty list, a bad --ext, ...)
        raise UsageError(str(exc)) from exc
    logger.info(
        "done %d, skipped %d (already done), failed %d; %d frames (%d without a face), %.1f s, %.1f frames/s",
        summary["done"], summary["skipped"], summary["failed"], summary["frames"],
        summary["frames_without_face"], summary["seconds"], summary["fps"],
    )  # fmt: skip
    if summary["failed"]:
        logger.warning("%d videos failed, listed in %s", summary["failed"], Path(args.dst_dir) / "failed.tsv")
    if summary["done"] + summary["skipped"] == 0:
        print(f"avsr-preprocess-roi: error: no video was preprocessed (reasons in "
              f"{Path(args.dst_dir) / 'failed.tsv'})", file=sys.stderr)
        return 1
    return 1 if summary["failed"] and args.fail_on_error else 0


if __name__ == "__main__":
    sys.exit(main())
