"""Test videos of a real face: scikit-image's astronaut photo, moved, occluded, or speaking a SynthGRID mouth.

The ROI preprocessing (:mod:`avsr.data.roi`) must be tested on a real face, without any download. The photo
``skimage.data.astronaut()`` (Eileen Collins, NASA, public domain; 512x512 RGB) ships with scikit-image. A
square around the face is resized to the video size (224x224 by default, the size of LRS3's videos), and
every frame moves it by a similarity transform (head motion: shift, zoom, roll), so the ground-truth mouth
position in every frame is known. :func:`composite_mouth_video` blends a rendered SynthGRID mouth ROI into the
mouth of the photo, so that a face video "says" a SynthGRID utterance: its ROI, cut out again by the
preprocessing, should look like the rendered one (the LRS3-like fixture rests on this).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from avsr.data.media import read_video, read_wav, write_av_video
from avsr.data.roi import STABLE_POINTS, mean_face

__all__ = [
    "ASTRONAUT_MOUTH",
    "ASTRONAUT_EYE_CORNERS",
    "ASTRONAUT_STABLE_POINTS",
    "FaceVideo",
    "astronaut_face",
    "head_motion",
    "astronaut_video",
    "composite_mouth_video",
    "write_face_utterance",
]

# measured once on skimage.data.astronaut() (512x512) with avsr.data.roi's iBUG-68 points from MediaPipe's
# face mesh (pixel centres at integers), checked by tests/test_roi.py: the mean of the lip points 48-67 (the
# centre of the mouth ROI), the outer eye corners (36, 45) and the alignment's points 33, 36, 39, 42, 45
ASTRONAUT_MOUTH = (222.96, 144.57)
ASTRONAUT_EYE_CORNERS = ((194.15, 100.44), (256.21, 103.58))
ASTRONAUT_STABLE_POINTS = (
    (223.48, 133.43),
    (194.15, 100.44),
    (213.32, 103.15),
    (236.94, 104.27),
    (256.21, 103.58),
)
_CROP = (135, 35, 180)  # the square of the photo seen at rest: left, top, side (pixels)
_CANVAS = (75, 0, 300)  # the larger square frames are sampled from (room for head motion): left, top, side
# photo pixels (x0, y0, x1, y1) an occluder covers: the whole face, or forehead to nose tip (mouth visible)
_OCCLUDERS = {"face": (165.0, 55.0, 285.0, 195.0), "eyes": (165.0, 55.0, 285.0, 128.0)}
# the rendered SynthGRID mouth at rest is this far below the ROI centre (render.py: cy = size / 2 + 4)
_MOUTH_DROP = 4.5
_LIP_RGB = (212.0, 147.0, 142.0)  # median colour of the astronaut's lips (photo pixels with R - G > 60)
# soft elliptical mask of a composited mouth ROI, in ROI pixels: centre x, y, half axes x, y
_MASK = (47.5, 54.0, 40.0, 27.0)


@dataclass
class FaceVideo:
    """A synthetic face video and its ground truth.

    Attributes:
        frames: uint8 ``(T, H, W, 3)`` RGB.
        mouth: float64 ``(T, 2)`` mouth centre (x, y) in frame pixels (the mean of the lip landmarks of the
            photo, moved with the head).
        transforms: float64 ``(T, 2, 3)`` maps from the face at rest (:func:`astronaut_face`) to the frame.
        occluded: bool ``(T,)`` frames whose face is covered.
    """

    frames: np.ndarray
    mouth: np.ndarray
    transforms: np.ndarray
    occluded: np.ndarray


def _photo_to_face(points: np.ndarray, size: int) -> np.ndarray:
    """Photo pixel coordinates -> coordinates in the face image at rest (the ``_CROP`` square resized)."""
    left, top, side = _CROP
    return (np.asarray(points, dtype=np.float64) - (left, top) + 0.5) * (size / side) - 0.5


def _canvas_to_face(size: int) -> np.ndarray:
    """``(2, 3)`` affine map from ``_CANVAS`` pixels to the face image at rest of height/width ``size``."""
    factor = size / _CROP[2]
    offset = (np.array(_CANVAS[:2]) - _CROP[:2] + 0.5) * factor - 0.5
    return np.array([[factor, 0.0, offset[0]], [0.0, factor, offset[1]]])


def _canvas() -> np.ndarray:
    """uint8 ``(S, S, 3)``: the ``_CANVAS`` square of ``skimage.data.astronaut()``."""
    try:
        from skimage.data import astronaut
    except ImportError as exc:
        raise ImportError("the face test videos need scikit-image: pip install 'avsr[video]'") from exc
    left, top, side = _CANVAS
    return np.ascontiguousarray(astronaut()[top : top + side, left : left + side])


def _warp_rgb(frames: torch.Tensor, transforms: np.ndarray, size: int, chunk: int = 64) -> np.ndarray:
    """RGB frames seen through per-frame affine maps: bilinear, the border pixels repeated outside.

    Args:
        frames: uint8 ``(T, H, W, 3)`` (may be an expanded view of one image).
        transforms: float ``(T, 2, 3)`` maps from source pixels to output pixels (pixel centres at integers).
        size: output height and width.  chunk: frames warped at once (bounds the float copies).

    Returns:
        uint8 ``(T, size, size, 3)``.
    """
    num_frames, height, width = frames.shape[:3]
    transforms = torch.as_tensor(np.asarray(transforms, dtype=np.float64))
    linear_inv = torch.linalg.inv(transforms[:, :, :2])  # output pixel -> source pixel
    shift_inv = -(linear_inv @ transforms[:, :, 2:])[..., 0]
    ys, xs = torch.meshgrid(
        torch.arange(size, dtype=torch.float64), torch.arange(size, dtype=torch.float64), indexing="ij"
    )
    pixels = torch.stack([xs, ys], dim=-1).reshape(-1, 2)  # (size * size, 2) as x, y
    to_unit = torch.tensor([2.0 / width, 2.0 / height], dtype=torch.float64)  # grid_sample's [-1, 1]
    out = torch.empty(num_frames, size, size, 3, dtype=torch.uint8)
    for start in range(0, num_frames, chunk):
        stop = min(start + chunk, num_frames)
        src = pixels @ linear_inv[start:stop].transpose(1, 2) + shift_inv[start:stop, None, :]
        grid = ((src + 0.5) * to_unit - 1).reshape(stop - start, size, size, 2).float()
        image = frames[start:stop].permute(0, 3, 1, 2).float()
        warped = F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=False)
        out[start:stop] = warped.permute(0, 2, 3, 1).round_().clamp_(0, 255).to(torch.uint8)
    return out.numpy()


def _photo_to_roi() -> np.ndarray:
    """``(2, 2)`` linear part (scale and roll) of the similarity that aligns the photo's face with the mean
    face, as the ROI step fits it on :data:`ASTRONAUT_STABLE_POINTS`: ROI pixels per photo pixel."""
    from skimage.transform import estimate_transform

    target = mean_face()[list(STABLE_POINTS)]
    return estimate_transform("similarity", np.array(ASTRONAUT_STABLE_POINTS), target).params[:2, :2]


def astronaut_face(size: int = 224) -> tuple[np.ndarray, np.ndarray, float]:
    """The face of ``skimage.data.astronaut()`` at rest: a square around the face resized to ``size``.

    Returns:
        ``(image, mouth, eye_distance)``: uint8 ``(size, size, 3)`` RGB, float64 ``(2,)`` mouth centre (x, y)
        in pixels, and the distance of the outer eye corners in pixels.

    Raises:
        ImportError: scikit-image is not installed (``pip install 'avsr[video]'``).
    """
    image = _warp_rgb(torch.from_numpy(_canvas())[None], _canvas_to_face(size)[None], size)[0]
    eyes = _photo_to_face(ASTRONAUT_EYE_CORNERS, size)
    return image, _photo_to_face(ASTRONAUT_MOUTH, size), float(np.linalg.norm(eyes[1] - eyes[0]))


def head_motion(
    num_frames: int,
    seed: int = 0,
    shift: float = 6.0,
    scale: float = 0.06,
    rotation: float = 6.0,
    fps: float = 25.0,
) -> dict[str, np.ndarray]:
    """Smooth random head motion: sums of slow sinusoids (0.2-0.8 Hz) with random phases.

    Args:
        num_frames: T.  seed: random seed.  shift: amplitude in pixels.  scale: relative zoom amplitude.
        rotation: roll amplitude in degrees.  fps: frame rate (for the frequencies).

    Returns:
        keyword arguments of :func:`astronaut_video` / :func:`composite_mouth_video`: ``shifts`` float
        ``(T, 2)`` pixels, ``scales`` ``(T,)`` factors, ``rotations`` ``(T,)`` degrees.
    """
    rng = np.random.default_rng(seed)
    t = np.arange(num_frames)[:, None] / fps
    freq, phase = rng.uniform(0.2, 0.8, size=(1, 4)), rng.uniform(0, 2 * np.pi, size=(1, 4))
    wave = np.sin(2 * np.pi * freq * t + phase)  # (T, 4)
    return {
        "shifts": shift * wave[:, :2],
        "scales": 1 + scale * wave[:, 2],
        "rotations": rotation * wave[:, 3],
    }


def _motion_transforms(
    num_frames: int,
    size: int,
    shifts: np.ndarray | None,
    scales: np.ndarray | None,
    rotations: np.ndarray | None,
) -> np.ndarray:
    """``(T, 2, 3)`` similarity maps about the image centre: ``p' = s R (p - c) + c + shift``."""
    shifts = np.zeros((num_frames, 2)) if shifts is None else np.asarray(shifts, dtype=np.float64)
    scales = np.ones(num_frames) if scales is None else np.asarray(scales, dtype=np.float64)
    angles = (
        np.zeros(num_frames) if rotations is None else np.deg2rad(np.asarray(rotations, dtype=np.float64))
    )
    if shifts.shape != (num_frames, 2) or scales.shape != (num_frames,) or angles.shape != (num_frames,):
        raise ValueError(
            f"head motion must have shifts (T, 2), scales (T,), rotations (T,) with T = {num_frames}, got "
            f"{shifts.shape}, {scales.shape}, {angles.shape}"
        )
    cos, sin = scales * np.cos(angles), scales * np.sin(angles)
    linear = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], axis=1)  # (T, 2, 2)
    centre = np.full(2, (size - 1) / 2)
    offset = centre + shifts - linear @ centre
    return np.concatenate([linear, offset[..., None]], axis=2)


def _luma(rgb: torch.Tensor) -> torch.Tensor:
    """ITU-R BT.601 luma of RGB values ``(..., 3)`` -> ``(..., 1)``."""
    return (rgb * torch.tensor([0.299, 0.587, 0.114])).sum(dim=-1, keepdim=True)


def _move(
    canvas: torch.Tensor, transforms: np.ndarray, size: int, occluded_frames, occluder: str
) -> FaceVideo:
    """Frames of the moving face: ``canvas`` (uint8 ``(T, S, S, 3)``, ``_CANVAS`` pixels, may be an
    expanded view) seen through ``transforms`` (face at rest -> frame), ``occluded_frames`` covered."""
    num_frames = transforms.shape[0]
    to_face = _canvas_to_face(size)
    full = transforms[:, :, :2] @ to_face  # (T, 2, 3): canvas -> frame
    full[:, :, 2] += transforms[:, :, 2]
    frames = _warp_rgb(canvas, full, size)
    mouth = transforms[:, :, :2] @ _photo_to_face(ASTRONAUT_MOUTH, size) + transforms[:, :, 2]
    occluded = np.zeros(num_frames, dtype=bool)
    occluded[list(occluded_frames)] = True
    x0, y0, x1, y1 = _OCCLUDERS[occluder]
    corners = _photo_to_face(np.array([[x0, y0], [x1, y0], [x0, y1], [x1, y1]]), size)
    for index in np.flatnonzero(occluded):
        moved = corners @ transforms[index, :, :2].T + transforms[index, :, 2]
        lo = np.clip(np.floor(moved.min(axis=0)).astype(int), 0, size)
        hi = np.clip(np.ceil(moved.max(axis=0)).astype(int) + 1, 0, size)
        frames[index, lo[1] : hi[1], lo[0] : hi[0]] = 128
    return FaceVideo(frames, mouth, transforms, occluded)


def astronaut_video(
    num_frames: int,
    shifts: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    rotations: np.ndarray | None = None,
    occluded_frames: tuple[int, ...] | list[int] = (),
    occluder: str = "face",
    size: int = 224,
) -> FaceVideo:
    """A video of the astronaut's face moving by a similarity transform per frame.

    Args:
        num_frames: T.
        shifts: float ``(T, 2)`` translation in pixels (default none).  scales: ``(T,)`` zoom about the image
            centre (default 1).  rotations: ``(T,)`` roll in degrees (default 0); see :func:`head_motion`.
        occluded_frames: frames whose face is covered by a mid-gray rectangle.
        occluder: what the rectangle covers: ``"face"`` (all of it) or ``"eyes"`` (forehead to nose tip:
            the face detector fails, the mouth stays visible).
        size: frame height and width in pixels.

    Returns:
        a :class:`FaceVideo` (frames uint8 ``(T, size, size, 3)``).

    Raises:
        ValueError: motion arrays of the wrong shape, unknown occluder.  ImportError: no scikit-image.
    """
    if occluder not in _OCCLUDERS:
        raise ValueError(f"occluder must be one of {sorted(_OCCLUDERS)}, got {occluder!r}")
    transforms = _motion_transforms(num_frames, size, shifts, scales, rotations)
    canvas = torch.from_numpy(_canvas())[None].expand(num_frames, -1, -1, -1)
    return _move(canvas, transforms, size, occluded_frames, occluder)


def composite_mouth_video(
    roi_frames: np.ndarray | torch.Tensor,
    shifts: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    rotations: np.ndarray | None = None,
    size: int = 224,
) -> FaceVideo:
    """The astronaut's face speaking with a rendered mouth: each ROI frame blended into the photo's mouth.

    The ROI (``avsr.corpora.synthgrid`` renders its mouth 4 px below the centre, about half the width) is
    mapped onto the photo by the inverse of the similarity with which the ROI step aligns this face to the
    mean face (:func:`avsr.data.roi.alignment_transforms` on :data:`ASTRONAUT_STABLE_POINTS`: 1.26 ROI pixels
    per photo pixel, 3.2 degrees of roll), its mouth on the photo's mouth, tinted (gray times the photo's
    skin RGB / the ROI's skin gray, going to the photo's lip colour for darker gray levels) and blended
    through a soft elliptical mask that covers the photo's lips; then the face moves as in
    :func:`astronaut_video`. So the ROI cut back out of this video is about the input ROI: same scale and
    orientation, the mouth centred (so about 4 px higher), up to the landmark fit.

    Args:
        roi_frames: uint8 ``(T, 96, 96)`` gray mouth ROIs (a SynthGRID ``<utt>.mp4`` read by
            :func:`media.read_video`).
        shifts, scales, rotations: head motion as in :func:`astronaut_video`.
        size: frame height and width in pixels.

    Returns:
        a :class:`FaceVideo` (frames uint8 ``(T, size, size, 3)``).

    Raises:
        ValueError: ``roi_frames`` not uint8 ``(T, R, R)``, or motion arrays of the wrong shape.
    """
    roi = torch.as_tensor(np.asarray(roi_frames))
    if roi.dtype != torch.uint8 or roi.ndim != 3 or roi.shape[0] == 0 or roi.shape[1] != roi.shape[2]:
        raise ValueError(
            f"roi_frames must be uint8 (T, R, R) with T >= 1, got {roi.dtype} {tuple(roi.shape)}"
        )
    num_frames, roi_size = roi.shape[0], roi.shape[1]
    transforms = _motion_transforms(num_frames, size, shifts, scales, rotations)
    canvas = torch.from_numpy(_canvas())
    mouth = np.array(ASTRONAUT_MOUTH) - _CANVAS[:2]  # canvas pixels
    to_roi = torch.as_tensor(_photo_to_roi())  # ROI pixels per canvas pixel (scale and roll)
    scale = float(torch.linalg.det(to_roi).sqrt())
    # the box of canvas pixels the mask can reach; ROI coordinates of its pixels, the mask and the ROI there
    cx, cy, ax, ay = (v * roi_size / 96 for v in _MASK)
    centre = torch.tensor([(roi_size - 1) / 2, (roi_size - 1) / 2 + _MOUTH_DROP * roi_size / 96])
    reach = (1.5 * max(ax, ay) + float(torch.linalg.norm(torch.tensor([cx, cy]) - centre))) / scale
    x0, y0 = (np.floor(mouth - reach)).astype(int)
    x1, y1 = (np.ceil(mouth + reach)).astype(int) + 1
    py, px = torch.meshgrid(
        torch.arange(y0, y1, dtype=torch.float64) - mouth[1],
        torch.arange(x0, x1, dtype=torch.float64) - mouth[0],
        indexing="ij",
    )
    qx = to_roi[0, 0] * px + to_roi[0, 1] * py + centre[0]
    qy = to_roi[1, 0] * px + to_roi[1, 1] * py + centre[1]
    radius = torch.sqrt(((qx - cx) / ax) ** 2 + ((qy - cy) / ay) ** 2)
    ramp = ((1.0 - radius) / 0.3).clamp(0, 1)
    alpha = (ramp * ramp * (3 - 2 * ramp)).float()[..., None]  # smoothstep: 1 inside 0.7 of the ellipse
    grid = torch.stack([(2 * qx + 1) / roi_size - 1, (2 * qy + 1) / roi_size - 1], dim=-1).float()
    grid = grid[None].expand(num_frames, -1, -1, -1)
    mouth_gray = F.grid_sample(roi[:, None].float(), grid, mode="bilinear", align_corners=False)[:, 0]
    patch = canvas[y0:y1, x0:x1].float()  # (h, w, 3)
    skin_rgb = patch[(radius > 1.0) & (radius < 1.4)].median(dim=0).values  # (3,): the cheeks around the mask
    skin_gray = mouth_gray[:, (radius > 0.75) & (radius < 1.0)].median().clamp(min=1.0)
    # colour per gray level: the cheeks' for skin, going to the photo's lip colour for darker (lips, mouth)
    lip = torch.tensor(_LIP_RGB)
    # lips are about 0.6 of the skin's gray in the render
    darker = ((0.85 * skin_gray - mouth_gray) / (0.25 * skin_gray)).clamp(0, 1)[..., None]
    hue = (1 - darker) * skin_rgb + darker * lip * (_luma(skin_rgb) / _luma(lip))  # RGB with the skin's luma
    tinted = mouth_gray[..., None] / skin_gray * hue  # (T, h, w, 3): ROI skin -> the photo's skin
    frames = canvas[None].repeat(num_frames, 1, 1, 1)
    frames[:, y0:y1, x0:x1] = (patch * (1 - alpha) + tinted * alpha).round().clamp(0, 255).to(torch.uint8)
    return _move(frames, transforms, size, (), "face")


def write_face_utterance(
    roi_mp4: str | os.PathLike,
    wav: str | os.PathLike,
    dst_mp4: str | os.PathLike,
    seed: int = 0,
    motion: float = 1.0,
    size: int = 224,
) -> FaceVideo:
    """Write an LRS3-like raw utterance: the astronaut saying a SynthGRID utterance, with its audio.

    Args:
        roi_mp4: the utterance's rendered ROI (96x96 gray 25 fps mp4).  wav: its 16 kHz mono wav.
        dst_mp4: the face video to write (H.264 + AAC, 25 fps, atomically; its directory must exist).
        seed: seed of the head motion.  motion: head motion strength (1: shifts of 6 px, zoom 6 %, roll 6
            degrees; 0: none).
        size: frame height and width in pixels.

    Returns:
        the :class:`FaceVideo` written (with its ground truth).

    Raises:
        avsr.data.media.MediaError: an input is unreadable or the output cannot be written (names the file).
    """
    roi = read_video(roi_mp4)
    audio = read_wav(wav)
    kwargs = head_motion(roi.shape[0], seed, 6.0 * motion, 0.06 * motion, 6.0 * motion)
    video = composite_mouth_video(roi, size=size, **kwargs)
    write_av_video(dst_mp4, video.frames, audio)
    return video
