"""The packed frame layout in which ESPnet hands audio-visual input to ``avsr.espnet.AVHubertESPnetEncoder``.

ESPnet's data pipeline gives an encoder one float tensor ``xs_pad (B, T, D)`` with lengths ``ilens (B,)``.
One packed frame of 25 Hz holds both modalities side by side::

    xs_pad[b, t] = [ audio features (A = 104) | mouth ROI frame, row-major (S * S) ]      D = A + S * S

* audio: AV-HuBERT's 26 log mel filterbanks stacked 4 at a time (100 Hz -> 25 Hz) and layer-normalised per
  frame (:func:`avsr.features.avhubert_audio_features`), ``A = audio_feat_dim``;
* video: the uncropped S x S grayscale mouth ROI (S = 96 for AV-HuBERT-preprocessed LRS3 and SynthGRID) as
  pixel values 0..255, so that the encoder itself crops (random crop + horizontal flip in training, centre
  crop at inference, as :class:`avsr.data.dataset.AVDataset`) and normalises -- the augmentation of
  avsr's own training happens inside ESPnet too.

The ROI side is implied by ``D``: ``S = sqrt(D - A)``. Pixel values are integers, so the packed arrays can be
stored as float16 (exact for 0..2048) to halve the dump; the audio features then keep about 3 significant
digits (float16's relative rounding of ``2**-11``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from avsr.features import CROP_SIZE, crop_video, normalize_video

__all__ = ["roi_side", "pack_frames", "unpack_frames", "crop_and_normalize"]


def roi_side(input_size: int, audio_feat_dim: int = 104) -> int:
    """The ROI side ``S`` of a packed frame of ``input_size = audio_feat_dim + S * S`` values.

    Raises:
        ValueError: ``input_size - audio_feat_dim`` is not a positive square.
    """
    rest = int(input_size) - int(audio_feat_dim)
    side = math.isqrt(rest) if rest > 0 else 0
    if side < 1 or side * side != rest:
        raise ValueError(
            f"input_size {input_size} is not audio_feat_dim ({audio_feat_dim}) + S*S for a square S x S "
            "mouth "
            "ROI: the packed layout is [audio features | flattened ROI] per frame (avsr.espnet.layout)"
        )
    return side


def pack_frames(audio: torch.Tensor, video: torch.Tensor, dtype: np.dtype = np.float16) -> np.ndarray:
    """One utterance as packed frames ``(T, A + S * S)`` (the array a dump step writes per utterance).

    Args:
        audio: ``(T, A)`` float audio features at 25 Hz.
        video: ``(T, S, S)`` uint8 (or integer-valued float) mouth ROI frames, pixel values 0..255.
        dtype: numpy dtype of the result (float16 halves the size; float32 keeps the audio exact).

    Returns:
        ``(T, A + S * S)`` numpy array.

    Raises:
        ValueError: different frame counts, or a non-square ROI.
    """
    if audio.dim() != 2 or video.dim() != 3:
        raise ValueError(
            f"audio must be (T, A) and video (T, S, S), got {tuple(audio.shape)} and {tuple(video.shape)}"
        )
    if audio.shape[0] != video.shape[0]:
        raise ValueError(f"audio has {audio.shape[0]} frames and video {video.shape[0]}: both must be 25 Hz")
    if video.shape[1] != video.shape[2]:
        raise ValueError(f"the mouth ROI must be square, got {video.shape[1]}x{video.shape[2]}")
    t = audio.shape[0]
    packed = torch.cat([audio.float(), video.reshape(t, -1).float()], dim=1)
    return packed.numpy().astype(dtype)


def unpack_frames(xs_pad: torch.Tensor, audio_feat_dim: int = 104) -> tuple[torch.Tensor, torch.Tensor]:
    """Split packed frames into the two modalities.

    Args:
        xs_pad: ``(B, T, A + S * S)`` float packed frames (see the module docstring).
        audio_feat_dim: ``A``.

    Returns:
        ``audio (B, A, T)`` (channels first, :class:`avsr.encoder.AVHubertEncoder`'s layout) and
        ``video (B, T, S, S)`` raw pixel values (float, 0..255); both views of ``xs_pad`` where possible.

    Raises:
        ValueError: ``xs_pad`` not 3-D, or its last dimension not ``A + S * S``.
    """
    if xs_pad.dim() != 3:
        raise ValueError(f"xs_pad must be (B, T, D) packed frames, got shape {tuple(xs_pad.shape)}")
    b, t, d = xs_pad.shape
    side = roi_side(d, audio_feat_dim)
    audio = xs_pad[..., :audio_feat_dim].transpose(1, 2)
    video = xs_pad[..., audio_feat_dim:].reshape(b, t, side, side)
    return audio, video


def crop_and_normalize(
    video: torch.Tensor, train: bool, crop_size: int = CROP_SIZE, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Raw ROI frames ``(B, T, S, S)`` (0..255) -> the encoder's video input ``(B, 1, T, C, C)``.

    Each utterance is cropped as :func:`avsr.features.crop_video` does (``train``: one random position and a
    horizontal flip with probability 0.5 per utterance; otherwise the centre) and normalised as
    :func:`avsr.features.normalize_video` (``(x / 255 - 0.421) / 0.165``), so that ESPnet training sees what
    avsr's own data loader gives.

    Raises:
        ValueError: frames smaller than ``crop_size``.
    """
    if train:
        video = torch.stack([crop_video(v, crop_size, train=True, generator=generator) for v in video])
    else:
        video = crop_video(video.flatten(0, 1), crop_size).unflatten(0, video.shape[:2])
    return normalize_video(video)[:, None]
