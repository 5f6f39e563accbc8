"""Lips of another renderer: the mouth of a real face photograph, opened and closed in time with an utterance.

A model trained on one renderer's mouths has never seen a real mouth. :func:`photo_mouth` gives it one that is
not from its renderer: the 96x96 grey mouth region of a real photograph (NASA's portrait of Eileen Collins,
public domain, as scikit-image ships it in ``skimage.data.astronaut()``; cut and scaled to the mouth-ROI size
and shipped in ``avsr/data/assets/photo_mouth.npy``), whose jaw drops by as much as the utterance's own mouth
opens (:func:`mouth_openness`), the gap filled with the dark of an open mouth. Driven by the utterance
itself, it is a test of lips in sync but of another look (``test_photo_lips``); driven by another
utterance, it is video that does not say the transcript (the ``photo`` kind of
:func:`avsr.data.dataset.untrusted_video`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

__all__ = ["mouth_openness", "photo_mouth"]

#: the photograph's mouth region, (96, 96) uint8 grey
_ASSET = Path(__file__).parent / "assets" / "photo_mouth.npy"
#: the row of the photograph's mouth region between the upper teeth and the lower lip: the jaw below drops
_LIP_ROW = 46
#: the columns of the photograph's mouth (the dark gap spans them; the cheeks beside it stretch)
_MOUTH_COLS = (24, 72)
#: the grey level of the inside of an open mouth
_DARK = 40


@lru_cache(maxsize=1)
def _photo() -> torch.Tensor:
    return torch.from_numpy(np.load(_ASSET))


def mouth_openness(video: torch.Tensor) -> torch.Tensor:
    """How far the mouth of each frame of a mouth-ROI video is open, from 0 (the utterance's most closed
    frame) to 1 (its most open one).

    The height of the mouth: the rows of the ROI's central columns whose mean grey level differs from the
    frame's median by more than 12 levels (lips, teeth and the dark inside all differ from the skin), scaled
    to the utterance's range.

    Args:
        video: ``(T, H, W)`` uint8 grey mouth ROIs (the SynthGRID renderer's 96x96, or any centred ROI).

    Returns:
        ``(T,)`` float32 in [0, 1] (all 0 for a mouth that never moves).
    """
    t, h, w = video.shape
    band = video[:, h // 5 : h - h // 5, 2 * w // 5 : 3 * w // 5].float().mean(dim=2)  # (T, rows)
    background = video.reshape(t, -1).float().median(dim=1).values[:, None]
    height = ((band - background).abs() > 12).float().sum(dim=1)
    lo, hi = height.min(), height.max()
    return (height - lo) / (hi - lo) if hi > lo else torch.zeros(t)


def photo_mouth(openness: torch.Tensor, max_drop: int = 12) -> torch.Tensor:
    """Frames of the photograph's mouth whose jaw drops by ``openness * max_drop`` pixels.

    Rows above the lip line stay; rows below move down by the frame's drop; the rows opened between them are
    the dark inside of the mouth within the mouth's columns and the stretched lip line beside it.

    Args:
        openness: ``(T,)`` float in [0, 1] (:func:`mouth_openness` of an utterance).
        max_drop: the drop of a fully open mouth, in pixels of the 96x96 region.

    Returns:
        ``(T, 96, 96)`` uint8.

    Raises:
        ValueError: ``openness`` not 1-D or ``max_drop`` outside 0..40.
    """
    if openness.dim() != 1 or not 0 <= max_drop <= 40:
        raise ValueError(f"photo_mouth: openness must be (T,) and max_drop in 0..40, got shape "
                         f"{tuple(openness.shape)} and {max_drop}")
    base = _photo()
    size = base.shape[0]
    drop = (openness.float().clamp(0, 1) * max_drop).round().long()[:, None]  # (T, 1)
    rows = torch.arange(size)[None, :]  # (1, 96)
    below = rows >= _LIP_ROW + drop
    source = torch.where(below, rows - drop, rows.clamp(max=_LIP_ROW)).expand(len(drop), size)
    frames = base[source]  # (T, 96, 96): each frame's rows taken from the photograph
    gap = (rows >= _LIP_ROW) & ~below  # (T, 96)
    cols = torch.zeros(size, dtype=torch.bool)
    cols[_MOUTH_COLS[0] : _MOUTH_COLS[1]] = True
    return frames.masked_fill(gap[:, :, None] & cols[None, None, :], _DARK)
