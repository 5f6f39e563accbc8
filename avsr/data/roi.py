"""Mouth region of interest (ROI) of a face video, cut exactly as AV-HuBERT cuts LRS3 and VoxCeleb2.

The geometry is that of ``avhubert/preparation/align_mouth.py`` (facebookresearch/av_hubert, based on
``preprocessing/crop_mouth_from_video.py`` of mpc001/Lipreading_using_Temporal_Convolutional_Networks; the
current Auto-AVSR preparation differs: a centred window, 8 points, OpenCV's LMedS fit and warp), step by
step:

1. 68 landmarks per frame in the iBUG / dlib convention (jaw 0-16, brows 17-26, nose 27-35, eyes 36-47,
   outer lips 48-59, inner lips 60-67), pixel coordinates with pixel centres at integers. Given (the
   original's ``detect_landmark.py`` pickles, :func:`load_landmarks`) or found by MediaPipe's face mesh
   (:func:`detect_landmarks68`, table :data:`MESH_TO_IBUG68`);
2. frames without landmarks interpolated as ``landmarks_interpolate``: linearly between the nearest frames
   with landmarks, the first / last ones copied before / after (:func:`interpolate_landmarks`);
3. with ``margin = min(T, 12)``, frame ``t`` is aligned by the similarity transform (least squares, Umeyama
   1991: scikit-image's ``estimate_transform('similarity')``) from the mean of the landmarks of frames
   ``t .. t + margin - 1`` at points 33, 36, 39, 42, 45 (nose bottom, eye corners) to the same points of
   the "20 words" mean face in a 256x256 frame; the last ``margin - 1`` frames reuse the transform of frame
   ``T - margin`` (the original's queue) (:func:`alignment_transforms`);
4. the frame is warped into that 256x256 frame (``skimage.transform.warp``: bilinear, outside = 0, output
   clipped to the frame's range, ``* 255`` then truncated to uint8), and a 96x96 patch is cut around the
   mean of the frame's own lip landmarks 48-67 moved by the same transform: rows ``round(cy) - 48 ..
   round(cy) + 48`` (round half to even), the centre first moved to 48 / 256 - 48 where the patch would
   leave the frame (``cut_patch``; its "too much bias" checks come after that move and so never fire: the
   original always clamps, and so does this module, counting the frames in :attr:`RoiTrack.clamped`)
   (:func:`crop_origins`);
5. gray as OpenCV's ``COLOR_BGR2GRAY`` of the uint8 patch: ``(9798 R + 19235 G + 3735 B + 16384) >> 15``
   (:func:`rgb_to_gray`: OpenCV 4.x's constants; equal to the installed OpenCV 5.1 on all 2^24 colours).

Only the 96x96 output pixels are computed (:func:`sample_crops`): batched gathers over a few frames at a
time (small batches keep the samples in cache: fastest), in float64 with scikit-image's own bilinear
formula, coordinate map and clipping, so the crops are bit for bit those of ``warp`` + ``cut_patch`` +
OpenCV given the same landmarks (tests/test_roi.py checks it against scikit-image and OpenCV). The original
then stores the colour patch as H.264 and converts it to gray when loading; here the gray patch is stored
(96x96 gray 25 fps mp4, :mod:`avsr.data.media`).
"""

from __future__ import annotations

import importlib.resources
import io
import os
import pickle
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from avsr.data.media import MediaError, read_audio_aligned, read_video_frames, write_video, write_wav

__all__ = [
    "RoiError",
    "RoiTrack",
    "REFERENCE_SIZE",
    "STABLE_POINTS",
    "MOUTH_POINTS",
    "MESH_TO_IBUG68",
    "import_mediapipe",
    "import_skimage",
    "mean_face",
    "detect_landmarks68",
    "mesh_to_landmarks68",
    "load_landmarks",
    "interpolate_landmarks",
    "alignment_transforms",
    "crop_origins",
    "sample_crops",
    "rgb_to_gray",
    "extract_mouth_roi",
    "preprocess_video",
]

#: height and width of the mean face's frame, into which every video frame is aligned (``STD_SIZE``)
REFERENCE_SIZE = 256
#: iBUG-68 points the alignment is fitted on (``stablePntsIDs``): nose bottom centre, the four eye corners
STABLE_POINTS = (33, 36, 39, 42, 45)
#: iBUG-68 lip points whose mean is the centre of the crop (``--start-idx 48 --stop-idx 68``)
MOUTH_POINTS = tuple(range(48, 68))

#: MediaPipe face-mesh point(s) for each iBUG-68 point: the mean of the listed mesh points. Chosen on
#: MediaPipe's canonical (neutral, frontal) face model and checked on ``skimage.data.astronaut()``:
#: eye corners and lid points on the eye contours (33/133, 362/263: the corners themselves); the nose
#: bottom 33 is mesh 2 (subnasale, the lowest midline point of the nose); lip points on the lip contours at
#: the arc-length fractions of the iBUG markup (measured on the mean face: e.g. 49 at 0.37 of the way from
#: corner 48 to 51, between mesh 40 (0.28) and 39 (0.48), hence their mean); the jaw on the face oval (a
#: contour on the face surface, not the image silhouette that dlib's jaw follows: only approximate).
#: Check: a similarity fitted on all 68 points to the mean face leaves mean residuals (256x256-frame px)
#: jaw 4.9, brows 3.4, nose 1.9, eyes 3.1, outer lips 2.7, inner lips 2.8 on the canonical model, and
#: 7.5, 6.7, 4.5, 5.1, 4.8, 4.2 on the (smiling, not frontal) astronaut; fitted on the 5 stable points, the
#: eye corners of the canonical model are 1.0 px from the mean face's, the astronaut's 2.2 px. An overlay of
#: the numbered points on the astronaut (MediaPipe's normalised coordinates times the image size, minus 0.5)
#: puts every point on its feature.
MESH_TO_IBUG68: tuple[tuple[int, ...], ...] = (
    # jaw 0-16: from the right ear (image left) round the chin (8) to the left ear
    (127,), (234,), (93,), (132,), (58,), (136,), (150,), (176,), (152,),
    (400,), (379,), (365,), (288,), (361,), (323,), (454,), (356,),
    # brows 17-21 (image left, outer to inner), 22-26 (inner to outer): upper brow contours
    (70,), (63,), (105,), (66,), (107,), (336,), (296,), (334,), (293,), (300,),
    # nose 27-30 bridge to tip, 31-35 bottom from image left to right (33: subnasale)
    (168, 6), (197,), (5,), (4, 1), (240,), (97,), (2,), (326,), (460,),
    # eyes 36-41 (image left: outer corner, upper lid x2, inner corner, lower lid x2), 42-47 (image right:
    # inner corner, upper lid x2, outer corner, lower lid x2)
    (33,), (160,), (158,), (133,), (153,), (144,), (362,), (385,), (387,), (263,), (373,), (380,),
    # outer lips 48-59: left corner, upper lip to the right corner (54), lower lip back
    (61,), (39, 40), (37,), (0,), (267,), (269, 270), (291,), (321, 405), (314,), (17,), (84,), (91, 181),
    # inner lips 60-67: left corner, upper inner lip to the right corner (64), lower inner lip back
    (78,), (81, 82), (13,), (311, 312), (308,), (317,), (14,), (87,),
)  # fmt: skip


class RoiError(ValueError):
    """A video cannot be turned into a mouth ROI; the message names the file and the reason."""


@dataclass
class RoiTrack:
    """The mouth ROI of a video and how it was cut.

    Attributes:
        frames: uint8 ``(T, S, S)`` gray mouth crops (``S`` = 96).
        detected: bool ``(T,)``, False where the frame had no landmarks (interpolated there).
        landmarks: float64 ``(T, 68, 2)`` iBUG-68 landmarks (x, y) in source-frame pixels (pixel centres at
            integers) after interpolation: the landmarks the crop was computed from.
        mouth: float64 ``(T, 20, 2)`` lip landmarks 48-67 of each frame in ROI pixels.
        transforms: float64 ``(T, 2, 3)`` affine maps from source-frame pixels to ROI pixels,
            ``roi_xy = A[:, :2] @ src_xy + A[:, 2]``: the similarity into the 256x256 mean-face frame, then
            the crop's offset.
        clamped: bool ``(T,)``, True where the crop window was moved back inside the 256x256 frame.
    """

    frames: np.ndarray
    detected: np.ndarray
    landmarks: np.ndarray
    mouth: np.ndarray
    transforms: np.ndarray
    clamped: np.ndarray

    @property
    def num_frames(self) -> int:
        """T."""
        return int(self.frames.shape[0])

    @property
    def num_missing(self) -> int:
        """Frames without landmarks of their own."""
        return int((~self.detected).sum())


@lru_cache(maxsize=1)
def _mean_face() -> np.ndarray:
    data = (importlib.resources.files("avsr.data") / "assets" / "20words_mean_face.npy").read_bytes()
    face = np.load(io.BytesIO(data), allow_pickle=False)
    if face.shape != (68, 2):
        raise RuntimeError(f"avsr/data/assets/20words_mean_face.npy: expected (68, 2), got {face.shape}")
    face.setflags(write=False)
    return face


def mean_face() -> np.ndarray:
    """The "20 words" mean face: float64 ``(68, 2)`` iBUG-68 points (x, y) in a 256x256 frame.

    The target of the alignment of AV-HuBERT / Auto-AVSR (``20words_mean_face.npy`` of
    mpc001/Lipreading_using_Temporal_Convolutional_Networks), shipped as package data
    ``avsr/data/assets/20words_mean_face.npy``. Outer eye corners 74.2 px apart, mouth corners 45.0 px.
    """
    return _mean_face().copy()


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


def import_skimage():
    """``skimage.transform``, imported on first use (the ``[video]`` extra).

    Raises:
        ImportError: scikit-image is not installed; the message says ``pip install 'avsr[video]'``.
    """
    try:
        from skimage import transform
    except ImportError as exc:
        raise ImportError("mouth ROI extraction needs scikit-image: pip install 'avsr[video]'") from exc
    return transform


def _check_frames(frames_rgb: np.ndarray | torch.Tensor, name: str) -> np.ndarray:
    if isinstance(frames_rgb, torch.Tensor):
        frames_rgb = frames_rgb.numpy()
    frames = np.asarray(frames_rgb)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] == 0:
        raise RoiError(
            f"{name}: expected uint8 RGB frames (T, H, W, 3) with T >= 1, got {frames.dtype} {frames.shape}"
        )
    return frames


def mesh_to_landmarks68(mesh: np.ndarray) -> np.ndarray:
    """iBUG-68 landmarks from MediaPipe face-mesh landmarks (:data:`MESH_TO_IBUG68`).

    Args:
        mesh: float ``(..., 468, 2)`` (or more points: the first 468 are used) face-mesh points (x, y).

    Returns:
        float64 ``(..., 68, 2)``: each point the mean of its mesh points.
    """
    mesh = np.asarray(mesh, dtype=np.float64)
    first = np.array([p[0] for p in MESH_TO_IBUG68])
    second = np.array([p[-1] for p in MESH_TO_IBUG68])
    return (mesh[..., first, :] + mesh[..., second, :]) / 2  # (x + x) / 2 == x for single points


def detect_landmarks68(
    frames_rgb: np.ndarray | torch.Tensor, name: str = "<frames>"
) -> tuple[np.ndarray, np.ndarray]:
    """iBUG-68 landmarks of every frame of a video from MediaPipe's face mesh (one face, tracked).

    Runs ``mediapipe.solutions.face_mesh.FaceMesh(static_image_mode=False, refine_landmarks=False,
    max_num_faces=1)`` (a face detector on the first frame and whenever tracking is lost, then the landmark
    model tracks the face; the models ship in the mediapipe 0.10.14 wheel) and maps its 468 points to the
    68-point convention of dlib / AV-HuBERT with :func:`mesh_to_landmarks68`. MediaPipe's normalised
    coordinates span the image's edges, so pixel-centre coordinates are ``x * W - 0.5``, ``y * H - 0.5``.

    Args:
        frames_rgb: uint8 ``(T, H, W, 3)`` RGB frames.
        name: the video's name, for error messages.

    Returns:
        ``(landmarks, detected)``: float32 ``(T, 68, 2)`` (x, y) in pixels with pixel centres at integers
        (NaN where no face was found) and bool ``(T,)``.

    Raises:
        ImportError: MediaPipe is not installed (the message says ``pip install 'avsr[video]'``).
        RoiError: frames are not uint8 ``(T, H, W, 3)`` with ``T >= 1``.
    """
    frames = _check_frames(frames_rgb, name)
    mediapipe = import_mediapipe()
    num_frames, height, width = frames.shape[:3]
    landmarks = np.full((num_frames, 68, 2), np.nan, dtype=np.float32)
    detected = np.zeros(num_frames, dtype=bool)
    scale = np.array([width, height], dtype=np.float64)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*GetPrototype.*", category=UserWarning)  # protobuf 4
        with mediapipe.solutions.face_mesh.FaceMesh(
            static_image_mode=False, refine_landmarks=False, max_num_faces=1
        ) as mesh:
            for index in range(num_frames):
                found = mesh.process(np.ascontiguousarray(frames[index])).multi_face_landmarks
                if found:
                    points = np.array([(p.x, p.y) for p in found[0].landmark[:468]]) * scale - 0.5
                    landmarks[index] = mesh_to_landmarks68(points)
                    detected[index] = True
    return landmarks, detected


class _ForbiddenGlobal(pickle.UnpicklingError):
    """A landmark pickle names a global that is not a numpy array constructor."""


class _LandmarkUnpickler(pickle.Unpickler):
    """Unpickles lists of numpy arrays and ``None``, nothing else (no code runs, no module is imported)."""

    def find_class(self, module: str, name: str):
        found = _allowed_globals().get(f"{module}.{name}")
        if found is None:
            raise _ForbiddenGlobal(f"global '{module}.{name}' is not allowed in a landmark file")
        return found


@lru_cache(maxsize=1)
def _allowed_globals() -> dict:
    """numpy's array / dtype / scalar constructors under the names numpy 1.x and 2.x pickle them with."""
    core = np._core if hasattr(np, "_core") else np.core  # type: ignore[attr-defined]
    allowed = {"numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype, "_codecs.encode": _latin1_encode}
    for prefix in ("numpy.core", "numpy._core"):
        allowed[f"{prefix}.multiarray._reconstruct"] = core.multiarray._reconstruct
        allowed[f"{prefix}.multiarray.scalar"] = core.multiarray.scalar
        allowed[f"{prefix}.numeric._frombuffer"] = core.numeric._frombuffer
    dtypes = getattr(np, "dtypes", None)
    for name in dir(dtypes) if dtypes is not None else ():
        if name.endswith("DType") and isinstance(getattr(dtypes, name), type):
            allowed[f"numpy.dtypes.{name}"] = getattr(dtypes, name)
    return allowed


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes; only latin-1 text -> bytes."""
    if not isinstance(text, str) or encoding != "latin1":
        raise _ForbiddenGlobal("_codecs.encode is only allowed on latin1 text")
    return text.encode("latin1")


def load_landmarks(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Landmarks of a video from a file: AV-HuBERT's ``detect_landmark.py`` pickle or a ``.npy`` array.

    A pickle (any other suffix than ``.npy``) holds a list with, per frame, a ``(68, 2)`` array (dlib's
    int32 pixel coordinates) or ``None``; it is read with an unpickler that only builds numpy arrays, lists
    and ``None``, so a crafted file cannot run code. A ``.npy`` holds a ``(T, 68, 2)`` float array with NaN
    rows for frames without landmarks (read without pickle).

    Returns:
        ``(landmarks, detected)``: ``(T, 68, 2)`` (x, y) pixels, float64 for integer input (exact) or the
        file's float dtype (the original's arithmetic follows the input's dtype), NaN where missing; and
        bool ``(T,)``.

    Raises:
        RoiError: the file is missing, unreadable, not a landmark file (wrong structure or shapes), or a
            pickle that refers to anything but numpy arrays (the message names the file and the global).
    """
    path = Path(path)
    if not path.is_file():
        raise RoiError(f"landmark file not found: {path}")
    try:
        if path.suffix == ".npy":
            data = np.load(path, allow_pickle=False)
        else:
            with open(path, "rb") as f:
                data = _LandmarkUnpickler(f, encoding="latin1").load()
    except _ForbiddenGlobal as exc:
        raise RoiError(f"{path}: refusing to read this landmark pickle: {exc}") from exc
    except Exception as exc:  # truncated / corrupt files: EOFError, ValueError, ...
        raise RoiError(f"{path}: cannot read landmarks ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, (np.ndarray, list, tuple)):
        raise RoiError(f"{path}: expected a list of (68, 2) arrays or None, not {type(data).__name__}")
    return _given_landmarks(data, str(path))


def _stack_frames(frames: list | tuple, name: str) -> np.ndarray:
    """``(T, 68, 2)`` from a list of ``(68, 2)`` arrays / ``None``: NaN rows for ``None``, float64 for integer
    arrays (exact), else the arrays' common float dtype (the original's arithmetic follows it)."""
    given = [f for f in frames if f is not None]
    if not all(
        isinstance(f, np.ndarray) and f.shape == (68, 2) and np.issubdtype(f.dtype, np.number) for f in given
    ):
        raise RoiError(f"{name}: every frame's landmarks must be None or a numeric (68, 2) array")
    dtype = np.result_type(*given) if given else np.float64
    dtype = dtype if np.issubdtype(dtype, np.floating) else np.float64
    landmarks = np.full((len(frames), 68, 2), np.nan, dtype=dtype)
    for index, frame in enumerate(frames):
        if frame is not None:
            landmarks[index] = frame
    return landmarks


def interpolate_landmarks(landmarks: np.ndarray, detected: np.ndarray | None = None) -> np.ndarray:
    """Landmarks of frames without any, filled as AV-HuBERT's ``landmarks_interpolate``.

    Between two frames ``a < b`` with landmarks, frame ``a + i`` gets ``L[a] + (i / (b - a)) * (L[b] -
    L[a])`` (the original's arithmetic, in the input's float dtype); frames before the first / after the
    last frame with landmarks get a copy of it.

    Args:
        landmarks: float ``(T, K, 2)``.  detected: bool ``(T,)`` frames that have landmarks (default: the
            frames without NaN).

    Returns:
        ``(T, K, 2)`` in the input's float dtype (float64 for integer input).

    Raises:
        ValueError: no frame has landmarks.
    """
    landmarks = np.asarray(landmarks)
    if not np.issubdtype(landmarks.dtype, np.floating):
        landmarks = landmarks.astype(np.float64)
    if detected is None:
        detected = np.isfinite(landmarks).all(axis=(1, 2))
    known = np.flatnonzero(np.asarray(detected, dtype=bool))
    if not len(known):
        raise ValueError("no frame has landmarks to interpolate from")
    out = landmarks.copy()
    frames = np.arange(len(landmarks))
    nxt = np.searchsorted(known, frames)  # index in `known` of the first frame >= t
    inside = (nxt > 0) & (nxt < len(known)) & ~np.isin(frames, known)
    t = frames[inside]
    start, stop = known[nxt[inside] - 1], known[nxt[inside]]
    weight = ((t - start) / (stop - start)).astype(landmarks.dtype)[:, None, None]  # Python-float division
    out[t] = landmarks[start] + weight * (landmarks[stop] - landmarks[start])
    out[: known[0]] = landmarks[known[0]]
    out[known[-1] + 1 :] = landmarks[known[-1]]
    return out


def alignment_transforms(landmarks: np.ndarray, window_margin: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Per-frame similarity transforms into the mean face's 256x256 frame (``crop_patch`` of align_mouth.py).

    With ``margin = min(T, window_margin)``, frame ``t`` uses the transform fitted (scikit-image's
    ``estimate_transform('similarity')``, Umeyama's least squares) from the mean of ``landmarks[s : s +
    margin]`` at :data:`STABLE_POINTS`, ``s = min(t, T - margin)``, to the mean face's same points.

    Args:
        landmarks: float ``(T, 68, 2)`` without gaps (:func:`interpolate_landmarks`).
        window_margin: the smoothing window in frames (``--window-margin``, 12).

    Returns:
        ``(forward, inverse)``: float64 ``(T, 3, 3)`` homogeneous matrices, source pixels -> 256x256 frame
        (scikit-image's ``params``) and back (``tform.inverse.params``, what ``warp`` samples with).

    Raises:
        ValueError: ``window_margin < 1``, or a degenerate fit (all stable points at one place).
        ImportError: scikit-image is not installed.
    """
    if window_margin < 1:
        raise ValueError(f"window_margin must be >= 1, got {window_margin}")
    transform = import_skimage()
    num_frames = len(landmarks)
    margin = min(num_frames, window_margin)
    starts = np.arange(num_frames - margin + 1)
    # the mean over the window as np.mean(list of frames, axis=0) computes it: summed frame after frame
    total = landmarks[starts]
    for k in range(1, margin):
        total = total + landmarks[starts + k]
    smooth = total / margin
    target = _mean_face()[list(STABLE_POINTS)]
    forward = np.empty((len(starts), 3, 3))
    inverse = np.empty((len(starts), 3, 3))
    for index in starts:
        tform = transform.estimate_transform("similarity", smooth[index][list(STABLE_POINTS)], target)
        if not tform or not np.isfinite(tform.params).all():
            raise ValueError(f"no similarity transform for frames {index}..{index + margin - 1}: {tform}")
        forward[index], inverse[index] = tform.params, tform.inverse.params
    reuse = np.minimum(np.arange(num_frames), num_frames - margin)
    return forward[reuse], inverse[reuse]


def crop_origins(
    landmarks: np.ndarray, forward: np.ndarray, size: int = 96
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each frame's crop lies in the 256x256 frame (``cut_patch`` of align_mouth.py).

    The centre is the mean of the frame's lip points 48-67 moved by its transform; where the crop would
    leave the 256x256 frame the centre is moved to ``size / 2`` or ``256 - size / 2`` (the original always
    does so: its "too much bias" checks come after the move and cannot fire). The crop is rows
    ``round(cy) - size / 2 .. round(cy) + size / 2`` (Python's round, half to even), columns alike.

    Args:
        landmarks: float ``(T, 68, 2)`` source-frame landmarks (interpolated, not smoothed).
        forward: float64 ``(T, 3, 3)`` source -> 256x256 frame (:func:`alignment_transforms`).
        size: crop height and width (even).

    Returns:
        ``(origins, mouth, clamped)``: int64 ``(T, 2)`` top-left (row, column) of the crops, float64
        ``(T, 20, 2)`` lip points in the 256x256 frame, bool ``(T,)`` frames whose centre was moved.
    """
    half = size // 2
    origins = np.empty((len(landmarks), 2), dtype=np.int64)
    mouth = np.empty((len(landmarks), len(MOUTH_POINTS), 2))
    clamped = np.zeros(len(landmarks), dtype=bool)
    for t in range(len(landmarks)):
        # as skimage's SimilarityTransform.__call__: homogeneous points @ params.T
        moved = np.hstack((landmarks[t], np.ones((len(landmarks[t]), 1)))) @ forward[t].T
        moved = moved[:, :-1] / moved[:, -1][:, None]
        mouth[t] = moved[MOUTH_POINTS[0] : MOUTH_POINTS[-1] + 1]
        cx, cy = np.mean(mouth[t], axis=0)
        # cut_patch's tests, in its order and form
        if cy - half < 0:
            cy, clamped[t] = half, True
        if cx - half < 0:
            cx, clamped[t] = half, True
        if cy + half > REFERENCE_SIZE:
            cy, clamped[t] = REFERENCE_SIZE - half, True
        if cx + half > REFERENCE_SIZE:
            cx, clamped[t] = REFERENCE_SIZE - half, True
        origins[t] = (int(round(cy) - half), int(round(cx) - half))
    return origins, mouth, clamped


def sample_crops(
    frames: np.ndarray | torch.Tensor,
    inverse: np.ndarray,
    origins: np.ndarray,
    size: int = 96,
    chunk: int = 2,
) -> np.ndarray:
    """The ``size`` x ``size`` patches at ``origins`` of the frames warped into the 256x256 frame.

    Equal, bit for bit, to ``(skimage.transform.warp(frame, inverse_map=tform.inverse, output_shape=(256,
    256)) * 255).astype('uint8')[r:r + size, c:c + size]`` with ``warp``'s defaults (bilinear, constant 0
    outside, output clipped to the frame's value range), but only the patch's pixels are computed, for all
    frames in one batched gather: output pixel (row r, column c) samples the source at x = M00 c + M01 r +
    M02, y = M10 c + M11 r + M12 (``M`` = inverse) with scikit-image's formula (minr = floor(y), maxr =
    ceil(y), dr = y - minr, top = (1 - dc) tl + dc tr, bottom = (1 - dc) bl + dc br, out = (1 - dr) top +
    dr bottom), pixel values u8 * (1 / 255) as ``img_as_float``, all in float64.

    Args:
        frames: uint8 ``(T, H, W, C)`` (any channel order: channels are independent).
        inverse: float64 ``(T, 3, 3)`` maps 256x256-frame pixels -> source pixels.
        origins: int ``(T, 2)`` top-left (row, column) of each patch in the 256x256 frame.
        size: patch height and width.  chunk: frames computed at once (small: the samples stay in cache).

    Returns:
        uint8 ``(T, size, size, C)``.
    """
    frames = frames.numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    num_frames, height, width, channels = frames.shape
    inverse = np.asarray(inverse, dtype=np.float64)
    origins = np.asarray(origins, dtype=np.int64)
    # warp's clip: to [min, max] of the frame, where min becomes the cval 0 when some pixel of the 256x256
    # output has no source pixel at all (its value is 0 then); those pixels include a corner of the output
    # whenever there are any, since the source pixels reachable from (-1, H) x (-1, W) form a convex set
    corner = np.array([0.0, 255.0])
    cx, cy = _source_coords(inverse, corner[None, :, None], corner[None, None, :])  # (T, 2, 2)
    empty = ((cy <= -1) | (cy >= height) | (cx <= -1) | (cx >= width)).any(axis=(1, 2))
    low = np.where(empty, 0.0, frames.min(axis=(1, 2, 3)) * (1.0 / 255))
    high = frames.max(axis=(1, 2, 3)) * (1.0 / 255)
    steps = np.arange(size, dtype=np.float64)
    out = np.empty((channels, num_frames, size, size), dtype=np.uint8)
    # channel planes of a chunk of frames with a border of zeros (warp's constant outside value)
    planes = np.zeros((channels, chunk, height + 2, width + 2), dtype=np.uint8)
    for start in range(0, num_frames, chunk):
        stop = min(start + chunk, num_frames)
        count = stop - start
        planes[:, :count, 1:-1, 1:-1] = frames[start:stop].transpose(3, 0, 1, 2)
        rows = origins[start:stop, 0, None, None] + steps[None, :, None]  # (t, S, 1)
        cols = origins[start:stop, 1, None, None] + steps[None, None, :]  # (t, 1, S)
        x, y = _source_coords(inverse[start:stop], rows, cols)  # (t, S, S)
        minr, minc = np.floor(y), np.floor(x)
        dr, dc = y - minr, x - minc
        # rows / columns in the padded frames: any outside the frame land on the border of zeros
        r0, r1 = ((np.clip(v, -1, height) + 1).astype(np.int64) * (width + 2) for v in (minr, np.ceil(y)))
        c0, c1 = ((np.clip(v, -1, width) + 1).astype(np.int64) for v in (minc, np.ceil(x)))
        base = np.arange(count)[:, None, None] * ((height + 2) * (width + 2))
        index = np.stack([base + r0 + c0, base + r0 + c1, base + r1 + c0, base + r1 + c1])  # (4, t, S, S)
        low_t, high_t = low[start:stop, None, None], high[start:stop, None, None]
        for channel in range(channels):
            values = planes[channel].reshape(-1).take(index).astype(np.float64)
            values *= 1.0 / 255  # img_as_float
            tl, tr, bl, br = values  # top = (1 - dc) tl + dc tr, ... computed in place
            tl *= 1 - dc
            tr *= dc
            tl += tr
            bl *= 1 - dc
            br *= dc
            bl += br
            tl *= 1 - dr
            bl *= dr
            tl += bl
            np.clip(tl, low_t, high_t, out=tl)
            tl *= 255
            out[channel, start:stop] = tl  # float -> uint8 truncates, as astype('uint8')
    return out.transpose(1, 2, 3, 0)


def _source_coords(matrix: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` source coordinates of output pixels as scikit-image's ``_warp_fast`` computes them:
    ``x = M[0, 0] * col + M[0, 1] * row + M[0, 2]`` (in this order), ``y`` alike; ``matrix`` ``(T, 3, 3)``,
    ``rows`` / ``cols`` broadcast against ``(T, ...)``."""
    shape = (-1,) + (1,) * (max(rows.ndim, cols.ndim) - 1)
    m = [[matrix[:, i, j].reshape(shape) for j in range(3)] for i in range(2)]
    x = m[0][0] * cols + m[0][1] * rows + m[0][2]
    y = m[1][0] * cols + m[1][1] * rows + m[1][2]
    return x, y


def rgb_to_gray(rgb: np.ndarray | torch.Tensor) -> np.ndarray:
    """Gray of uint8 RGB exactly as OpenCV's ``cvtColor(bgr, COLOR_BGR2GRAY)``: ``(9798 R + 19235 G + 3735 B
    + 16384) >> 15``, the ITU-R BT.601 weights 0.299, 0.587, 0.114 in 15-bit fixed point, rounded (OpenCV
    4.x and 5.x, ``color_rgb.simd.hpp``; OpenCV 3 used 14 bits: 4899, 9617, 1868, which differs on 0.3 % of
    the colours by one gray level).

    Args:
        rgb: uint8 ``(..., 3)`` in R, G, B order.

    Returns:
        uint8 ``(...)``.
    """
    rgb = rgb.numpy() if isinstance(rgb, torch.Tensor) else np.asarray(rgb)
    gray = rgb[..., 0].astype(np.uint32) * 9798  # at most 255 * 32768 + 16384: fits in 32 bits
    gray += rgb[..., 1].astype(np.uint32) * 19235
    gray += rgb[..., 2].astype(np.uint32) * 3735
    gray += 16384
    gray >>= 15
    return gray.astype(np.uint8)


def extract_mouth_roi(
    frames_rgb: np.ndarray | torch.Tensor,
    landmarks: np.ndarray | list | None = None,
    size: int = 96,
    smooth_window: int = 12,
    name: str = "<frames>",
) -> RoiTrack:
    """The mouth ROI of a face video, as AV-HuBERT's ``align_mouth.py`` (see the module docstring).

    Args:
        frames_rgb: uint8 ``(T, H, W, 3)`` RGB frames, normally at 25 fps (:func:`media.read_video_frames`).
        landmarks: iBUG-68 landmarks of the frames, float ``(T, 68, 2)`` (x, y) pixels with NaN rows, or a
            list of ``(68, 2)`` arrays / ``None`` (frames without a face), as :func:`load_landmarks` reads
            them; if longer than the video an error, if shorter only its first frames are cut (as the
            original, which stops at the last landmark). None: :func:`detect_landmarks68`.
        size: ROI height and width in pixels (even; 96 as AV-HuBERT's preprocessed LRS3).
        smooth_window: the alignment's smoothing window in frames (the original's ``--window-margin`` 12).
        name: the video's name, for error messages.

    Returns:
        a :class:`RoiTrack` of ``T`` frames (fewer with shorter ``landmarks``).

    Raises:
        RoiError: bad frames or landmarks, no face / no landmarks in any frame, more landmarks than frames.
        ImportError: MediaPipe (when detecting) or scikit-image is not installed.
    """
    frames = _check_frames(frames_rgb, name)
    if size < 2 or size % 2 or size > REFERENCE_SIZE:
        raise RoiError(f"{name}: the ROI size must be even and at most {REFERENCE_SIZE}, got {size}")
    if landmarks is None:
        landmarks, detected = detect_landmarks68(frames, name)
        landmarks = landmarks.astype(np.float64)  # float64 arithmetic (scikit-image's fit is slow in float32)
        if not detected.any():
            raise RoiError(f"{name}: no face found in any of its {len(detected)} frames")
    else:
        landmarks, detected = _given_landmarks(landmarks, name)
        if len(landmarks) > len(frames):
            raise RoiError(f"{name}: {len(landmarks)} frames of landmarks, but {len(frames)} video frames")
        frames = frames[: len(landmarks)]
        if not detected.any():
            raise RoiError(f"{name}: no frame has landmarks (all {len(detected)} are missing)")
    landmarks = interpolate_landmarks(landmarks, detected)
    try:
        forward, inverse = alignment_transforms(landmarks, smooth_window)
    except ValueError as exc:
        raise RoiError(f"{name}: {exc}") from exc
    origins, mouth, clamped = crop_origins(landmarks, forward, size)
    crops = rgb_to_gray(sample_crops(frames, inverse, origins, size))
    transforms = forward[:, :2].copy()
    transforms[:, :, 2] -= origins[:, ::-1]  # 256x256 frame -> crop: minus (column, row) of the origin
    mouth = mouth - origins[:, None, ::-1]
    return RoiTrack(crops, detected, landmarks.astype(np.float64), mouth, transforms, clamped)


def _given_landmarks(landmarks: np.ndarray | list, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(T, 68, 2)`` float landmarks (NaN rows missing) and the frames that have them."""
    if isinstance(landmarks, (list, tuple)):
        landmarks = _stack_frames(landmarks, name)
    landmarks = np.asarray(landmarks)
    if landmarks.ndim != 3 or landmarks.shape[1:] != (68, 2) or not len(landmarks):
        raise RoiError(f"{name}: expected landmarks (T, 68, 2) with T >= 1, got {landmarks.shape}")
    if not np.issubdtype(landmarks.dtype, np.number):
        raise RoiError(f"{name}: landmarks must be numbers, got {landmarks.dtype}")
    if not np.issubdtype(landmarks.dtype, np.floating):
        landmarks = landmarks.astype(np.float64)
    return landmarks, np.isfinite(landmarks).all(axis=(1, 2))


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
    landmarks: str | os.PathLike | np.ndarray | None = None,
) -> dict:
    """Preprocess one raw face video into the corpus format: ROI mp4 (96x96 gray, 25 fps) + 16 kHz mono wav.

    The video is resampled to ``fps`` (:func:`media.read_video_frames`: its timestamps where plausible,
    its rotation applied), the ROI written with :func:`media.write_video`; the audio track is downmixed,
    resampled and aligned to the video's first frame (:func:`media.read_audio_aligned`), zero-padded or cut
    to exactly ``sample_rate / fps`` samples per video frame (640, as the SynthGRID corpus and the data dirs
    assume) and written with :func:`media.write_wav`. The wav is written before the mp4
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
        landmarks: iBUG-68 landmarks of the whole video at ``fps`` (a file for :func:`load_landmarks`, or
            an array as :func:`extract_mouth_roi` takes); a segment uses its frames. None: detected with
            MediaPipe.

    Returns:
        stats: ``{"frames": T, "frames_without_face": n, "frames_clamped": crops moved back into the
        256x256 frame, "seconds": T / fps, "source_fps": f, "audio_padded_s": zeros added where the audio
        ends before the video and "audio_cut_s": audio dropped after the video's end (with ``dst_wav``),
        "processing_fps": T / wall time}``, and what reading found: the notes of
        :attr:`media.VideoFrames.notes` (``video_timestamps_ignored``, ...) and ``audio_offset_s`` (the
        audio's start minus the video's, when not 0; with ``dst_wav``).

    Raises:
        RoiError: the video is missing or unreadable, has no face, or (with ``dst_wav``) has no audio track,
            the segment is empty, the landmarks are unreadable or do not fit the video, or an output cannot
            be written; the message names ``src`` (or the landmark file).
        ImportError: MediaPipe (without ``landmarks``) or scikit-image is not installed.
    """
    start = time.perf_counter()
    src = Path(src)
    frames, source_fps, wav, landmarks, notes = _read_source(src, dst_wav, fps, sample_rate, landmarks)
    frames, wav, landmarks = _cut_segment(src, frames, wav, landmarks, fps, sample_rate, start_s, end_s)
    track = extract_mouth_roi(frames, landmarks, size, smooth_window, name=str(src))
    stats = {
        "frames": track.num_frames,
        "frames_without_face": track.num_missing,
        "frames_clamped": int(track.clamped.sum()),
        "seconds": track.num_frames / fps,
        "source_fps": source_fps,
        **notes,
    }
    stats.update(_write_outputs(src, track.frames, wav, dst_mp4, dst_wav, fps, sample_rate))
    stats["processing_fps"] = track.num_frames / max(time.perf_counter() - start, 1e-9)
    return stats


def _read_source(
    src: Path,
    dst_wav: str | os.PathLike | None,
    fps: float,
    sample_rate: int,
    landmarks: str | os.PathLike | np.ndarray | None,
) -> tuple[np.ndarray, float, torch.Tensor | None, np.ndarray | None, dict]:
    """The frames, audio and landmarks of :func:`preprocess_video`'s source video.

    Returns:
        ``(frames, source_fps, wav, landmarks, notes)``: uint8 ``(T, H, W, 3)`` RGB frames at ``fps`` (cut to
        the frames that have landmarks, as the original), the source's frame rate, float32 ``(N,)`` mono
        audio at ``sample_rate`` aligned to the first frame (None without ``dst_wav``), float ``(T, 68, 2)``
        landmarks (NaN rows missing) or None, and the notes of the reading (:attr:`media.VideoFrames.notes`,
        ``audio_offset_s`` when not 0).

    Raises:
        RoiError: unreadable media, or more landmark frames than video frames (names ``src``).
    """
    if isinstance(landmarks, (str, os.PathLike)):
        landmarks = load_landmarks(landmarks)[0]
    try:
        video = read_video_frames(src, fps, gray=False)
        frames, source_fps, notes, wav = video.frames, video.source_fps, dict(video.notes), None
        if dst_wav is not None:
            wav, offset = read_audio_aligned(src, video.start_s, sample_rate)
            if offset:
                notes["audio_offset_s"] = round(offset, 4)
    except MediaError as exc:
        raise RoiError(str(exc)) from exc
    if landmarks is not None:
        landmarks, _ = _given_landmarks(landmarks, str(src))
        if len(landmarks) > frames.shape[0]:
            raise RoiError(
                f"{src}: {len(landmarks)} frames of landmarks for a video of {frames.shape[0]} frames at "
                f"{fps:g} fps"
            )
        frames = frames[: len(landmarks)]  # as the original: frames after the last landmark are not cut
    return frames, source_fps, wav, landmarks, notes


def _cut_segment(
    src: Path,
    frames: np.ndarray,
    wav: torch.Tensor | None,
    landmarks: np.ndarray | None,
    fps: float,
    sample_rate: int,
    start_s: float,
    end_s: float | None,
) -> tuple[np.ndarray, torch.Tensor | None, np.ndarray | None]:
    """``frames`` ``(T, H, W, 3)``, ``landmarks`` ``(T, 68, 2)`` and ``wav`` ``(N,)`` cut to the segment
    ``start_s`` .. ``end_s`` (frames ``round(start_s * fps)`` to ``round(end_s * fps)``, excluded; the audio
    from the first kept frame on); None stays None.

    Raises:
        RoiError: the segment holds no frame (names ``src``).
    """
    first = max(0, int(round(start_s * fps)))
    last = frames.shape[0] if end_s is None or end_s < 0 else min(frames.shape[0], int(round(end_s * fps)))
    if last <= first:
        raise RoiError(
            f"{src}: the segment {start_s:.3f}-{end_s} s holds no frame (the video has "
            f"{frames.shape[0]} frames at {fps:g} fps)"
        )
    frames = frames[first:last]
    if landmarks is not None:
        landmarks = landmarks[first:last]
    if wav is not None:
        wav = wav[int(round(first * sample_rate / fps)) :]
    return frames, wav, landmarks


def _write_outputs(
    src: Path,
    roi: np.ndarray,
    wav: torch.Tensor | None,
    dst_mp4: str | os.PathLike,
    dst_wav: str | os.PathLike | None,
    fps: float,
    sample_rate: int,
) -> dict:
    """Write the wav (``wav`` ``(N,)`` zero-padded or cut to ``sample_rate / fps`` samples per frame of
    ``roi``; skipped when ``wav`` is None), then the ROI mp4 (``roi``: uint8 ``(T, S, S)``), each atomically.

    Returns:
        ``{"audio_padded_s": seconds of zeros added, "audio_cut_s": seconds of audio dropped}`` with a wav,
        else ``{}``.

    Raises:
        RoiError: an output cannot be written (names ``src``).
    """
    stats = {}
    try:
        if wav is not None:
            num_samples = int(round(roi.shape[0] * sample_rate / fps))
            stats["audio_padded_s"] = max(0, num_samples - wav.shape[0]) / sample_rate
            stats["audio_cut_s"] = max(0, wav.shape[0] - num_samples) / sample_rate
            aligned = torch.zeros(num_samples)
            aligned[: min(num_samples, wav.shape[0])] = wav[:num_samples]
            write_wav(dst_wav, aligned, sample_rate)
        write_video(dst_mp4, roi, fps=int(round(fps)))
    except MediaError as exc:
        raise RoiError(f"{src}: {exc}") from exc
    return stats
