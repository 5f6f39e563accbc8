#!/usr/bin/env python3
"""Write SynthGRID utterances as raw face videos, to try mouth-ROI extraction and ``avsr transcribe``.

Each utterance's rendered mouth ROI is composited onto the mouth of a real face photograph
(``skimage.data.astronaut()``) with small head motion, and its wav becomes the video's audio track
(:func:`avsr.data.face_video.write_face_utterance`, H.264 + AAC, 224x224, 25 fps). The transcript is copied
next to each video as ``<utt>.txt``; videos are written as ``<out>/<speaker>/<utt>.mp4``, the corpus layout,
so that ``avsr preprocess-roi --src-dir <out> --dst-dir <corpus>/<split>`` turns them back into a corpus
split for the recipe's stages. Needs the ``[video]`` extra.

Usage (from recipes/synthgrid/avsr1, after stage 1)::

    local/face_videos.py --corpus-dir corpus --split test --num 30 --out face_videos
    avsr transcribe face_videos --checkpoint exp/avsr_synthgrid_cpu --json face_videos.json
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tqdm import tqdm

from avsr.data.face_video import write_face_utterance


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", type=Path, default=Path("corpus"))
    p.add_argument("--split", default="test")
    p.add_argument("--num", type=int, default=0, help="first N utterances (sorted by id); 0: all")
    p.add_argument("--out", type=Path, required=True, help="output folder of <speaker>/<utt>.mp4 (+ .txt)")
    p.add_argument("--motion", type=float, default=1.0, help="head motion strength (0: none)")
    args = p.parse_args(argv)
    rois = sorted((args.corpus_dir / args.split).glob("*/*.mp4"), key=lambda q: q.stem)
    if not rois:
        print(f"no <speaker>/<utt>.mp4 under {args.corpus_dir / args.split}", file=sys.stderr)
        return 1
    if args.num > 0:
        rois = rois[: args.num]
    for i, roi in enumerate(tqdm(rois, desc="face videos", unit="utt")):
        dst = args.out / roi.parent.name / roi.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            write_face_utterance(roi, roi.with_suffix(".wav"), dst, seed=i, motion=args.motion)
        if roi.with_suffix(".txt").exists():
            shutil.copyfile(roi.with_suffix(".txt"), dst.with_suffix(".txt"))
    print(f"{len(rois)} face videos in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
