"""Speed of mouth-ROI extraction (face mesh -> 68 landmarks, AV-HuBERT's alignment and crop) on a face video.

Usage::

    python benchmarks/bench_roi.py [--frames 250] [--size 224] [--threads 1]

Builds a moving-face video from ``skimage.data.astronaut()`` (small shifts, zoom and roll per frame,
:func:`avsr.data.face_video.astronaut_video`), writes it as an H.264 mp4 with an audio track, then times

* ``detect_landmarks68`` (MediaPipe's face mesh mapped to the 68 iBUG points) on frames in memory;
* ``extract_mouth_roi`` given those landmarks: the original's geometry alone (interpolation, windowed
  similarity fits, the 96x96 crops sampled in one batched gather, gray), as with published landmarks;
* ``extract_mouth_roi`` detecting the landmarks itself (all steps);
* ``preprocess_video`` on the file (decoding at 25 fps, ROI extraction, ROI mp4 and 16 kHz wav writing).

Prints frames per second (wall clock and process CPU time) and the peak resident memory. Needs the
``[video]`` extra (mediapipe 0.10.14, scikit-image).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from avsr.data import roi  # noqa: E402
from avsr.data.face_video import astronaut_video, head_motion  # noqa: E402
from avsr.data.media import write_av_video  # noqa: E402
from avsr.nn.precision import machine_summary  # noqa: E402


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    """Run the benchmark and print the figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=250, help="video length (25 fps frames)")
    p.add_argument("--size", type=int, default=224, help="frame height and width in pixels")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args()
    print(machine_summary(getattr(args, "device", "cpu")), flush=True)  # where the figures come from
    torch.set_num_threads(args.threads)
    video = astronaut_video(args.frames, size=args.size, **head_motion(args.frames, seed=0)).frames
    frames = np.asarray(video)
    wav = 0.1 * torch.randn(args.frames * 640)
    print(f"astronaut face video: {args.frames} frames of {args.size}x{args.size} "
          f"({args.frames / 25:.1f} s), {args.threads} torch thread(s)")

    roi.extract_mouth_roi(frames[:10])  # warm-up: loads the face-mesh graph
    (landmarks, detected), w, c = _timed(lambda: roi.detect_landmarks68(frames))
    print(f"  landmarks (face mesh -> 68)   {args.frames / w:7.1f} frames/s wall, "
          f"{args.frames / c:7.1f} per CPU-s  ({int(detected.sum())}/{args.frames} frames with a face)")
    landmarks = landmarks.astype(np.float64)  # as extract_mouth_roi uses its own detections (and pickles)
    track, w, c = _timed(lambda: roi.extract_mouth_roi(frames, landmarks))
    print(f"  crop given landmarks          {args.frames / w:7.1f} frames/s wall, "
          f"{args.frames / c:7.1f} per CPU-s  ({1e3 * w / args.frames:.2f} ms per frame)")
    track, w, c = _timed(lambda: roi.extract_mouth_roi(frames))
    print(f"  extract_mouth_roi (all steps) {args.frames / w:7.1f} frames/s wall, "
          f"{args.frames / c:7.1f} per CPU-s")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "face.mp4"
        write_av_video(src, frames, wav.numpy())
        stats, w, c = _timed(lambda: roi.preprocess_video(src, Path(tmp) / "roi.mp4", Path(tmp) / "roi.wav"))
        print(f"  preprocess_video (file->file) {args.frames / w:7.1f} frames/s wall, "
              f"{args.frames / c:7.1f} per CPU-s  (real-time factor {w / (args.frames / 25):.3f}, "
              f"{stats['frames']} frames)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  ROI {tuple(track.frames.shape)}, peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
