"""Pictures of a mouth-ROI track for the demo page: a strip of frames (PNG) and the track as an animated GIF,
both as ``data:`` URLs that a page shows in an ``<img>`` and a script can decode."""

from __future__ import annotations

import base64
import io
import math

import numpy as np
import torch
from PIL import Image

__all__ = ["roi_preview", "data_url"]

#: frames per second of the model's video input (the ROI track's rate)
FPS = 25.0


def data_url(image: Image.Image, fmt: str, **save_args: object) -> str:
    """``image`` encoded as ``fmt`` (``"PNG"``, ``"GIF"``) in a ``data:image/<fmt>;base64,...`` URL."""
    buf = io.BytesIO()
    image.save(buf, format=fmt, **save_args)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def roi_preview(frames: torch.Tensor | np.ndarray, strip_frames: int = 8, gif_frames: int = 100,
                fps: float = FPS) -> dict[str, object]:
    """A strip and an animation of a mouth-ROI track.

    Args:
        frames: ``(T, H, W)`` uint8 gray ROI frames (the model's video input before its 88x88 crop).
        strip_frames: frames in the strip, evenly spaced over the track (all of them when it has fewer).
        gif_frames: the most frames of the GIF: a longer track shows every n-th frame, each shown n times
            as long, so that the animation keeps the track's speed.
        fps: the track's frame rate.

    Returns:
        ``{"num_frames", "fps", "size": [H, W], "strip": PNG data URL, "strip_times": [s, ...] (the time of
        each strip frame), "gif": GIF data URL}``.

    Raises:
        ValueError: not a non-empty ``(T, H, W)`` track.
    """
    track = frames.numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    if track.ndim != 3 or track.shape[0] == 0:
        raise ValueError(f"expected ROI frames (T, H, W), got shape {tuple(track.shape)}")
    track = track.astype(np.uint8, copy=False)
    n = track.shape[0]
    picks = np.unique(np.linspace(0, n - 1, min(strip_frames, n)).round().astype(int))
    strip = Image.fromarray(np.concatenate([track[i] for i in picks], axis=1))
    step = max(1, math.ceil(n / gif_frames))
    images = [Image.fromarray(track[i]) for i in range(0, n, step)]
    gif = data_url(images[0], "GIF", save_all=True, append_images=images[1:], loop=0,
                   duration=round(1000 * step / fps))
    return {"num_frames": int(n), "fps": fps, "size": [int(track.shape[1]), int(track.shape[2])],
            "strip": data_url(strip, "PNG"), "strip_times": [round(int(i) / fps, 2) for i in picks],
            "gif": gif}
