"""Mouth region of interest (ROI) of a face video: landmarks, alignment, 96x96 gray crop at 25 fps.

The steps follow the preprocessing of AV-HuBERT's LRS3 (``avhubert/preparation/align_mouth.py``) and of
Auto-AVSR (``preparation/detectors/*/video_process.py``), with MediaPipe's face mesh in place of dlib /
RetinaFace + FAN landmarks:

1. 468 face-mesh landmarks per frame (MediaPipe 0.10.14, the legacy ``solutions.face_mesh`` in video mode,
   whose models ship in the wheel: nothing is downloaded);
2. frames without a face get landmarks interpolated linearly between the nearest frames with one
   (before the first / after the last: the nearest);
3. landmarks smoothed over time by a centred moving average (Auto-AVSR's ``window_margin`` 12), then
   moved back to the frame's own mean position, so the smoothing steadies rotation and scale but does not
   lag behind head motion;
4. a similarity transform (rotation, uniform scale, translation; least squares, Umeyama 1991) maps the
   stable landmarks (eye corners, nose bridge, nose tip, below the nose: like the eyes + nose points of
   AV-HuBERT's 68-point alignment) to a fixed frontal template;
5. a 96x96 crop centred on the mean of the aligned lip landmarks, gray (ITU-R BT.601 luma), sampled in one
   batched bilinear warp (``torch.nn.functional.grid_sample``) straight from the source frame.

The result is what :mod:`avsr.data.media` reads and writes as preprocessed video: 96x96 gray at 25 fps.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from avsr.data.media import MediaError, read_audio_track, read_video_rgb, write_video, write_wav

__all__ = [
    "RoiError",
    "RoiTrack",
    "import_mediapipe",
    "STABLE_POINTS",
    "LIP_POINTS",
    "TEMPLATE",
    "detect_landmarks",
    "fill_missing",
    "smooth_landmarks",
    "similarity_transforms",
    "warp_frames",
    "extract_mouth_roi",
    "preprocess_video",
]

# face-mesh indices: outer eye corners 33 / 263, inner eye corners 133 / 362, nose bridge 168, nose tip 1,
# below the nose 2 (none of them moves when the person speaks)
STABLE_POINTS = (33, 133, 362, 263, 168, 1, 2)
# the 40 points of the outer and inner lip contours (MediaPipe's FACEMESH_LIPS)
LIP_POINTS = (
    0, 13, 14, 17, 37, 39, 40, 61, 78, 80, 81, 82, 84, 87, 88, 91, 95, 146, 178, 181,
    185, 191, 267, 269, 270, 291, 308, 310, 311, 312, 314, 317, 318, 321, 324, 375, 402, 405, 409, 415,
)  # fmt: skip
# STABLE_POINTS of MediaPipe's canonical face model (frontal, x right, y down), 10 pixels per cm: outer eye
# corners 89 px apart, a mouth at rest about 50 px wide (half the 96 px crop, as in AV-HuBERT's LRS3 ROIs)
TEMPLATE = np.array(
    [
        [-44.46, -26.64],
        [-18.56, -25.85],
        [18.56, -25.85],
        [44.46, -26.64],
        [0.0, -32.71],
        [0.0, 11.27],
        [0.0, 20.89],
    ]
)


class RoiError(ValueError):
    """A video cannot be turned into a mouth ROI; the message names the file and the reason."""


@dataclass
class RoiTrack:
    """The mouth ROI of a video and how it was cut.

    Attributes:
        frames: uint8 ``(T, S, S)`` gray mouth crops (``S`` = 96).
        detected: bool ``(T,)``, False where no face was found (landmarks interpolated there).
        mouth: float32 ``(T, 40, 2)`` lip landmarks (``LIP_POINTS``; x, y) in ROI pixels (pixel centres at
            integers), from the frame's own (unsmoothed) landmarks.
        transforms: float32 ``(T, 2, 3)`` affine maps from source-frame pixels to ROI pixels:
            ``roi_xy = A[:, :2] @ src_xy + A[:, 2]`` (a similarity per frame).
    """

    frames: np.ndarray
    detected: np.ndarray
    mouth: np.ndarray
    transforms: np.ndarray

    @property
    def num_frames(self) -> int:
        """T."""
        return int(self.frames.shape[0])

    @property
    def num_missing(self) -> int:
        """Frames without a detected face."""
        return int((~self.detected).sum())


def import_mediapipe():
    """The ``mediapipe`` module, imported on first use (an optional dependency: the ``[video]`` extra).

    Raises:
        ImportError: MediaPipe is not installed; the message says ``pip install 'avsr[video]'``.
    """
    try:
        import mediapipe
    except ImportError as exc:
        raise ImportError(
            "mouth ROI extraction needs MediaPipe: pip install 'avsr[video]' (mediapipe==0.10.14)"
        ) from exc
    return mediapipe


def detect_landmarks(
    frames_rgb: np.ndarray | torch.Tensor, name: str = "<frames>"
) -> tuple[np.ndarray, np.ndarray]:
    """Face-mesh landmarks of every frame of a video (one face, tracked from frame to frame).

    Uses ``mediapipe.solutions.face_mesh.FaceMesh(static_image_mode=False, refine_landmarks=False,
    max_num_faces=1)``: a face detector on the first frame (and whenever tracking is lost), then the
    landmark model tracks the face.

    Args:
        frames_rgb: uint8 ``(T, H, W, 3)`` RGB frames.
        name: the video's name, for error messages.

    Returns:
        ``(landmarks, detected)``: float32 ``(T, 468, 2)`` (x, y) in pixels (zeros where not detected) and
        bool ``(T,)``.

    Raises:
        ImportError: MediaPipe is not installed (the message says ``pip install 'avsr[video]'``).
        RoiError: frames are not uint8 ``(T, H, W, 3)`` with ``T >= 1``.
    """
    frames = _check_frames(frames_rgb, name)
    mediapipe = import_mediapipe()
    num_frames, height, width = frames.shape[:3]
    landmarks = np.zeros((num_frames, 468, 2), dtype=np.float32)
    detected = np.zeros(num_frames, dtype=bool)
    scale = np.array([width, height], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*GetPrototype.*", category=UserWarning)  # protobuf 4
        with mediapipe.solutions.face_mesh.FaceMesh(
            static_image_mode=False, refine_landmarks=False, max_num_faces=1
        ) as mesh:
            for index in range(num_frames):
                found = mesh.process(np.ascontiguousarray(frames[index])).multi_face_landmarks
                if found:
                    points = found[0].landmark
                    landmarks[index] = np.array([(p.x, p.y) for p in points[:468]], dtype=np.float32) * scale
                    detected[index] = True
    return landmarks, detected


def _check_frames(frames_rgb: np.ndarray | torch.Tensor, name: str) -> np.ndarray:
    if isinstance(frames_rgb, torch.Tensor):
        frames_rgb = frames_rgb.numpy()
    frames = np.asarray(frames_rgb)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] == 0:
        raise RoiError(
            f"{name}: expected uint8 RGB frames (T, H, W, 3) with T >= 1, got {frames.dtype} {frames.shape}"
        )
    return frames


def fill_missing(landmarks: np.ndarray, detected: np.ndarray) -> np.ndarray:
    """Landmarks of frames without a face, interpolated linearly in time between the nearest detected frames.

    Args:
        landmarks: float ``(T, K, 2)``.  detected: bool ``(T,)`` with at least one True.

    Returns:
        float32 ``(T, K, 2)``: detected frames unchanged, others interpolated (before the first detected
        frame: its landmarks; after the last: its landmarks).

    Raises:
        ValueError: no frame is detected.
    """
    detected = np.asarray(detected, dtype=bool)
    if not detected.any():
        raise ValueError("no frame has landmarks to interpolate from")
    known = np.flatnonzero(detected)
    frames = np.arange(len(detected))
    right = np.clip(np.searchsorted(known, frames), 0, len(known) - 1)  # first detected frame >= t
    left = np.clip(right - 1, 0, len(known) - 1)
    left = np.where(known[right] == frames, right, left)
    t0, t1 = known[left], known[right]
    weight = np.where(t1 > t0, (frames - t0) / np.maximum(t1 - t0, 1), 0.0)
    weight = np.clip(weight, 0.0, 1.0)[:, None, None]
    out = (1 - weight) * landmarks[t0] + weight * landmarks[t1]
    return out.astype(np.float32)


def smooth_landmarks(landmarks: np.ndarray, window: int = 12) -> np.ndarray:
    """Temporal smoothing of landmarks that keeps each frame's mean position (Auto-AVSR's ``window_margin``).

    Frame ``t`` gets the mean of frames ``t - h .. t + h`` with ``h = min(window // 2, t, T - 1 - t)`` (a
    centred window that shrinks near the ends), shifted so that its mean over the points equals frame
    ``t``'s: shape, rotation and scale are smoothed, the position follows the head without lag.

    Args:
        landmarks: float ``(T, K, 2)``.  window: window length in frames (0 or 1: no smoothing).

    Returns:
        float32 ``(T, K, 2)``.
    """
    landmarks = np.asarray(landmarks, dtype=np.float64)
    num_frames = landmarks.shape[0]
    if window < 2 or num_frames < 3:
        return landmarks.astype(np.float32)
    t = np.arange(num_frames)
    half = np.minimum(np.minimum(window // 2, t), num_frames - 1 - t)
    cumsum = np.concatenate([np.zeros_like(landmarks[:1]), np.cumsum(landmarks, axis=0)])
    mean = (cumsum[t + half + 1] - cumsum[t - half]) / (2 * half + 1)[:, None, None]
    mean += landmarks.mean(axis=1, keepdims=True) - mean.mean(axis=1, keepdims=True)
    return mean.astype(np.float32)


def similarity_transforms(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Least-squares similarity transforms (Umeyama 1991, without reflection) mapping ``src`` onto ``dst``.

    Args:
        src: float ``(T, K, 2)`` points per frame.  dst: float ``(K, 2)`` target points (``K >= 2``).

    Returns:
        float64 ``(T, 2, 3)``: ``A`` with ``dst ~ A[:, :2] @ src + A[:, 2]``, ``A[:, :2] = s R``.
    """
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    src_mean, dst_mean = src.mean(axis=1), dst.mean(axis=0)  # (T, 2), (2,)
    z = (src[..., 0] - src_mean[:, None, 0]) + 1j * (src[..., 1] - src_mean[:, None, 1])  # (T, K)
    w = (dst[:, 0] - dst_mean[0]) + 1j * (dst[:, 1] - dst_mean[1])  # (K,)
    # in complex numbers the best s * exp(i theta) is <z, w> / <z, z>
    coef = (np.conj(z) * w).sum(axis=1) / np.maximum((np.abs(z) ** 2).sum(axis=1), 1e-12)  # (T,)
    a, b = coef.real, coef.imag
    linear = np.stack([np.stack([a, -b], axis=-1), np.stack([b, a], axis=-1)], axis=1)  # (T, 2, 2)
    shift = dst_mean[None] - np.einsum("tij,tj->ti", linear, src_mean)
    return np.concatenate([linear, shift[..., None]], axis=2)


def _apply(transforms: np.ndarray, points: np.ndarray) -> np.ndarray:
    """``(T, 2, 3)`` affine maps applied to ``(T, K, 2)`` points."""
    return np.einsum("tij,tkj->tki", transforms[:, :, :2], points) + transforms[:, None, :, 2]


def warp_frames(
    frames: np.ndarray | torch.Tensor,
    transforms: np.ndarray,
    out_size: int | tuple[int, int] = 96,
    gray: bool = True,
    chunk: int = 64,
) -> np.ndarray:
    """Frames sampled through per-frame affine maps (bilinear; outside the frame the border pixels repeat).

    Args:
        frames: uint8 ``(T, H, W, 3)`` RGB (a tensor may be an expanded view of one image).
        transforms: float ``(T, 2, 3)`` maps from source pixels to output pixels (pixel centres at integers).
        out_size: output ``(height, width)``, or one number for a square.
        gray: return gray = 0.299 R + 0.587 G + 0.114 B (ITU-R BT.601, as OpenCV's RGB2GRAY) instead of RGB.
        chunk: frames warped at once (bounds the memory of the float copies).

    Returns:
        uint8 ``(T, h, w)`` if ``gray`` else ``(T, h, w, 3)``.
    """
    frames = frames if isinstance(frames, torch.Tensor) else torch.from_numpy(np.asarray(frames))
    num_frames, height, width = frames.shape[:3]
    out_h, out_w = (out_size, out_size) if isinstance(out_size, int) else out_size
    transforms = torch.as_tensor(np.asarray(transforms, dtype=np.float64))
    # inverse maps: output pixel -> source pixel, then to grid_sample's [-1, 1] (align_corners=False)
    linear_inv = torch.linalg.inv(transforms[:, :, :2])  # (T, 2, 2)
    shift_inv = -(linear_inv @ transforms[:, :, 2:])[..., 0]  # (T, 2)
    ys, xs = torch.meshgrid(
        torch.arange(out_h, dtype=torch.float64), torch.arange(out_w, dtype=torch.float64), indexing="ij"
    )
    pixels = torch.stack([xs, ys], dim=-1).reshape(-1, 2)  # (h*w, 2) as x, y
    to_unit = torch.tensor([2.0 / width, 2.0 / height], dtype=torch.float64)
    weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    out = torch.empty(num_frames, out_h, out_w, *(() if gray else (3,)), dtype=torch.uint8)
    for start in range(0, num_frames, chunk):
        stop = min(start + chunk, num_frames)
        src = pixels @ linear_inv[start:stop].transpose(1, 2) + shift_inv[start:stop, None, :]  # (t, h*w, 2)
        grid = ((src + 0.5) * to_unit - 1).reshape(stop - start, out_h, out_w, 2).float()
        image = frames[start:stop].permute(0, 3, 1, 2).float()
        if gray:
            image = (image * weights).sum(dim=1, keepdim=True)
        warped = F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=False)
        warped = warped[:, 0] if gray else warped.permute(0, 2, 3, 1)
        out[start:stop] = warped.round_().clamp_(0, 255).to(torch.uint8)
    return out.numpy()


def extract_mouth_roi(
    frames_rgb: np.ndarray | torch.Tensor,
    size: int = 96,
    smooth_window: int = 12,
    name: str = "<frames>",
) -> RoiTrack:
    """The mouth ROI of a face video (see the module docstring for the steps).

    Args:
        frames_rgb: uint8 ``(T, H, W, 3)`` RGB frames, normally at 25 fps (:func:`media.read_video_rgb`).
        size: ROI height and width in pixels (96 as AV-HuBERT's preprocessed LRS3).
        smooth_window: landmark smoothing window in frames (12 as Auto-AVSR).
        name: the video's name, for error messages.

    Returns:
        a :class:`RoiTrack` of ``T`` frames.

    Raises:
        RoiError: bad frames, or no face in any frame.
        ImportError: MediaPipe is not installed.
    """
    frames = _check_frames(frames_rgb, name)
    landmarks, detected = detect_landmarks(frames, name)
    if not detected.any():
        raise RoiError(f"{name}: no face found in any of its {len(detected)} frames")
    landmarks = fill_missing(landmarks, detected)
    smooth = smooth_landmarks(landmarks, smooth_window)
    to_template = similarity_transforms(smooth[:, STABLE_POINTS], TEMPLATE)
    centre = _apply(to_template, smooth[:, LIP_POINTS]).mean(axis=1)  # (T, 2) mouth centre, template coords
    transforms = to_template.copy()
    transforms[:, :, 2] += (size - 1) / 2 - centre  # template -> ROI: the mouth centre at the ROI centre
    crops = warp_frames(frames, transforms, size, gray=True)
    mouth = _apply(transforms, landmarks[:, LIP_POINTS]).astype(np.float32)
    return RoiTrack(crops, detected, mouth, transforms.astype(np.float32))


def preprocess_video(
    src: str | os.PathLike,
    dst_mp4: str | os.PathLike,
    dst_wav: str | os.PathLike | None = None,
    size: int = 96,
    smooth_window: int = 12,
    fps: float = 25.0,
    sample_rate: int = 16000,
    start_s: float = 0.0,
    end_s: float | None = None,
) -> dict:
    """Preprocess one raw face video into the corpus format: ROI mp4 (96x96 gray, 25 fps) + 16 kHz mono wav.

    The video is resampled to ``fps`` (:func:`media.read_video_rgb`), the ROI written with
    :func:`media.write_video`; the audio track is downmixed and resampled (:func:`media.read_audio_track`),
    zero-padded or cut to exactly ``sample_rate / fps`` samples per video frame (640, as the SynthGRID corpus
    and the data dirs assume) and written with :func:`media.write_wav`. The wav is written before the mp4
    and each atomically, so an existing mp4 next to an existing wav means a complete utterance. With
    ``start_s`` / ``end_s`` only that part of the recording is kept (AV-HuBERT's ``trim_video_frame`` and
    ``trim_audio`` for the pieces of long LRS3 ``pretrain`` clips): frames ``round(start_s * fps)`` up to
    ``round(end_s * fps)`` (excluded) of the 25 fps video and the audio from the first kept frame on.

    Args:
        src: the raw video (any container FFmpeg reads).
        dst_mp4: the ROI mp4 to write.  dst_wav: the wav to write, or None to ignore the audio.
        size, smooth_window: see :func:`extract_mouth_roi`.
        fps: video frame rate of the output.  sample_rate: audio rate of the output in Hz.
        start_s, end_s: the part of the recording to keep, in seconds (``end_s`` None or < 0: to the end).

    Returns:
        stats: ``{"frames": T, "frames_without_face": n, "seconds": T / fps, "source_fps": f,
        "audio_padded_s": zeros added where the audio ends before the video (with ``dst_wav``),
        "processing_fps": T / wall time}``.

    Raises:
        RoiError: the video is missing or unreadable, has no face, or (with ``dst_wav``) has no audio track,
            the segment is empty, or an output cannot be written; the message names ``src``.
        ImportError: MediaPipe is not installed.
    """
    start = time.perf_counter()
    src = Path(src)
    try:
        wav = read_audio_track(src, sample_rate) if dst_wav is not None else None
        frames, source_fps = read_video_rgb(src, fps)
    except MediaError as exc:
        raise RoiError(str(exc)) from exc
    first = max(0, int(round(start_s * fps)))
    last = frames.shape[0] if end_s is None or end_s < 0 else min(frames.shape[0], int(round(end_s * fps)))
    if last <= first:
        raise RoiError(
            f"{src}: the segment {start_s:.3f}-{end_s} s holds no frame (the video has "
            f"{frames.shape[0]} frames at {fps:g} fps)"
        )
    frames = frames[first:last]
    if wav is not None:
        wav = wav[int(round(first * sample_rate / fps)) :]
    track = extract_mouth_roi(frames, size, smooth_window, name=str(src))
    stats = {
        "frames": track.num_frames,
        "frames_without_face": track.num_missing,
        "seconds": track.num_frames / fps,
        "source_fps": source_fps,
    }
    try:
        if wav is not None:
            num_samples = int(round(track.num_frames * sample_rate / fps))
            stats["audio_padded_s"] = max(0, num_samples - wav.shape[0]) / sample_rate
            aligned = torch.zeros(num_samples)
            aligned[: min(num_samples, wav.shape[0])] = wav[:num_samples]
            write_wav(dst_wav, aligned, sample_rate)
        write_video(dst_mp4, track.frames, fps=int(round(fps)))
    except MediaError as exc:
        raise RoiError(f"{src}: {exc}") from exc
    stats["processing_fps"] = track.num_frames / max(time.perf_counter() - start, 1e-9)
    return stats
