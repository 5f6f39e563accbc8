"""Reading and writing the preprocessed media of an utterance: 16 kHz mono wav and 96x96 gray 25 fps mp4.

The layout follows AV-HuBERT's preprocessed LRS3 (``avhubert/preparation``): one 16 kHz mono 16-bit PCM
``.wav`` and one H.264 ``.mp4`` of the grayscale mouth region (stored as yuv420p) per utterance, 640 audio
samples per video frame. Wav files go through ``soundfile``, mp4 files through PyAV (``av``). Writers are
atomic: they write a temporary file beside the target and ``os.replace`` it, so an interrupted run never
leaves a half-written file under the final name. Every error is a :class:`MediaError` naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import av
import numpy as np
import soundfile
import torch

__all__ = ["MediaError", "read_wav", "write_wav", "read_video", "write_video", "video_fps"]


class MediaError(ValueError):
    """A media file is missing, corrupt or not in the expected format; the message names the file."""


def _tmp_path(path: Path) -> Path:
    """A temporary path in the same directory as ``path`` (so that ``os.replace`` is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _check_exists(path: Path, what: str) -> None:
    if not path.is_file():
        raise MediaError(f"{what} file not found: {path}")


def read_wav(path: str | os.PathLike, sample_rate: int = 16000) -> torch.Tensor:
    """Read a mono wav file.

    Args:
        path: the wav (any format libsndfile reads: PCM 16/24/32 bit, float).
        sample_rate: the expected sampling rate in Hz; the file must have exactly this rate.

    Returns:
        ``torch.float32`` tensor ``(num_samples,)`` with values in [-1, 1].

    Raises:
        MediaError: the file is missing or unreadable (corrupt), its rate differs from ``sample_rate``
            (the message gives both), or it has more than one channel.
    """
    path = Path(path)
    _check_exists(path, "wav")
    try:
        wav, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises LibsndfileError / RuntimeError / TypeError for bad files
        raise MediaError(f"cannot read wav file {path}: {exc}") from exc
    if rate != sample_rate:
        raise MediaError(f"wav file {path} has sample rate {rate} Hz, expected {sample_rate} Hz")
    if wav.shape[1] != 1:
        raise MediaError(f"wav file {path} has {wav.shape[1]} channels, expected mono")
    return torch.from_numpy(np.ascontiguousarray(wav[:, 0]))


def write_wav(path: str | os.PathLike, wav: torch.Tensor | np.ndarray, sample_rate: int = 16000) -> None:
    """Write a mono waveform as a 16-bit PCM wav file, atomically (temporary file + ``os.replace``).

    Args:
        path: the target file; its directory must exist.
        wav: ``(num_samples,)`` float waveform in [-1, 1] (values outside are clipped), tensor or array.
        sample_rate: sampling rate in Hz written in the header.

    Raises:
        MediaError: ``wav`` is not one-dimensional or has non-finite values, or the file cannot be written.
    """
    path = Path(path)
    if isinstance(wav, torch.Tensor):
        wav = wav.detach().cpu().numpy()
    wav = np.asarray(wav)
    if wav.ndim != 1:
        raise MediaError(f"cannot write wav file {path}: expected a 1-d waveform, got shape {wav.shape}")
    if np.issubdtype(wav.dtype, np.floating):
        if not np.all(np.isfinite(wav)):
            raise MediaError(f"cannot write wav file {path}: waveform has NaN or infinite values")
        wav = np.clip(wav, -1.0, 1.0).astype(np.float32)
    tmp = _tmp_path(path)
    try:
        soundfile.write(str(tmp), wav, sample_rate, subtype="PCM_16", format="WAV")
        os.replace(tmp, path)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise MediaError(f"cannot write wav file {path}: {exc}") from exc


# limited ("TV", MPEG) range luma <-> full range gray, as FFmpeg's swscale converts yuv420p <-> gray
_TO_FULL = np.clip(np.rint((np.arange(256) - 16) * (255.0 / 219.0)), 0, 255).astype(np.uint8)
_TO_LIMITED = np.rint(16 + np.arange(256) * (219.0 / 255.0)).astype(np.uint8)


def _gray(frame: av.VideoFrame) -> np.ndarray:
    """The gray image ``(H, W)`` uint8 of a decoded frame (the luma plane, converted to full range).

    For yuv420p this reads the luma plane directly (swscale's per-frame conversion is slow for small
    frames) and gives the same values as ``frame.to_ndarray(format="gray")``.
    """
    if frame.format.name == "yuv420p" and frame.width % 2 == 0 and frame.height % 2 == 0:
        luma = frame.to_ndarray()[: frame.height]
        return luma if frame.color_range == 2 else _TO_FULL[luma]  # 2 = AVCOL_RANGE_JPEG (full range)
    if frame.format.name == "yuvj420p" and frame.width % 2 == 0 and frame.height % 2 == 0:
        return frame.to_ndarray()[: frame.height]
    return frame.to_ndarray(format="gray")


def read_video(path: str | os.PathLike) -> torch.Tensor:
    """Decode all frames of the first video stream of a file as grayscale (the luma plane).

    Args:
        path: a video file PyAV/FFmpeg can decode (normally a 96x96 H.264 mp4 at 25 fps).

    Returns:
        ``torch.uint8`` tensor ``(T, H, W)``.

    Raises:
        MediaError: the file is missing, cannot be decoded (corrupt), has no video stream or no frame.
    """
    path = Path(path)
    _check_exists(path, "video")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError(f"video file {path} has no video stream")
            frames = [_gray(frame) for frame in container.decode(video=0)]
    except MediaError:
        raise
    except Exception as exc:  # av.error.FFmpegError and friends
        raise MediaError(f"cannot read video file {path}: {exc}") from exc
    if not frames:
        raise MediaError(f"video file {path} has no decodable frame")
    return torch.from_numpy(np.stack(frames))


def video_fps(path: str | os.PathLike) -> float:
    """The average frame rate (frames per second) of the first video stream of a file.

    Raises:
        MediaError: the file is missing, unreadable or has no video stream.
    """
    path = Path(path)
    _check_exists(path, "video")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError(f"video file {path} has no video stream")
            rate = container.streams.video[0].average_rate
    except MediaError:
        raise
    except Exception as exc:
        raise MediaError(f"cannot read video file {path}: {exc}") from exc
    if rate is None:
        raise MediaError(f"video file {path} does not state a frame rate")
    return float(rate)


def write_video(
    path: str | os.PathLike,
    frames: torch.Tensor | np.ndarray,
    fps: int = 25,
    crf: int = 23,
    preset: str = "veryfast",
    threads: int = 1,
) -> None:
    """Write grayscale frames as an H.264 mp4 (yuv420p), atomically (temporary file + ``os.replace``).

    The gray level becomes the luma plane, chroma is neutral; this is how AV-HuBERT's preprocessed LRS3
    stores the mouth ROIs (``ffmpeg ... -pix_fmt yuv420p``), so :func:`read_video` gives back the frames up
    to H.264 quantisation (mean absolute error of about two gray levels at ``crf`` 23, FFmpeg's default).
    The output is byte-for-byte reproducible for the same frames and options.

    Args:
        path: the target ``.mp4``; its directory must exist.
        frames: ``uint8`` ``(T, H, W)`` with ``T >= 1`` and even ``H``, ``W`` (yuv420p needs even sizes).
        fps: frame rate in frames per second.
        crf: x264 constant rate factor (0 = lossless; 23, the default, is FFmpeg's).
        preset: x264 speed preset.
        threads: encoder threads (1 suits data generation with one process per core).

    Raises:
        MediaError: bad shape or dtype, or the file cannot be written.
    """
    path = Path(path)
    if isinstance(frames, torch.Tensor):
        frames = frames.detach().cpu().numpy()
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 3 or frames.shape[0] == 0:
        raise MediaError(
            f"cannot write video file {path}: expected uint8 frames (T, H, W) with T >= 1, "
            f"got {frames.dtype} {frames.shape}"
        )
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise MediaError(f"cannot write video file {path}: height and width must be even, got {frames.shape}")
    tmp = _tmp_path(path)
    try:
        with av.open(str(tmp), mode="w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=fps)
            stream.width = frames.shape[2]
            stream.height = frames.shape[1]
            stream.pix_fmt = "yuv420p"
            # x264's macroblock-tree rate control gives run-to-run differences in the bitstream (its SIMD
            # path reads uninitialised memory); without it the same frames always give the same file
            stream.options = {
                "crf": str(crf),
                "preset": preset,
                "threads": str(threads),
                "x264-params": "mbtree=0",
            }
            chroma = np.full((frames.shape[1] // 2, frames.shape[2]), 128, dtype=np.uint8)  # U, V planes
            for index, image in enumerate(_TO_LIMITED[frames]):
                frame = av.VideoFrame.from_ndarray(np.concatenate([image, chroma]), format="yuv420p")
                frame.pts = index
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
        os.replace(tmp, path)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise MediaError(f"cannot write video file {path}: {exc}") from exc
