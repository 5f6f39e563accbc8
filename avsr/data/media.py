"""Reading and writing the preprocessed media of an utterance: 16 kHz mono wav and 96x96 gray 25 fps mp4.

The layout follows AV-HuBERT's preprocessed LRS3 (``avhubert/preparation``): one 16 kHz mono 16-bit PCM
``.wav`` and one H.264 ``.mp4`` of the grayscale mouth region (stored as yuv420p) per utterance, 640 audio
samples per video frame. Wav files go through ``soundfile``, mp4 files through PyAV (``av``). Writers are
atomic: they write a temporary file beside the target and ``os.replace`` it, so an interrupted run never
leaves a half-written file under the final name. Every error is a :class:`MediaError` naming the file.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import soundfile
import torch

from avsr.fileio import atomic_path

__all__ = [
    "MediaError",
    "read_wav",
    "write_wav",
    "pcm16_round_trip",
    "read_video",
    "write_video",
    "video_fps",
    "VideoCheck",
    "check_video",
    "read_audio_track",
    "read_video_rgb",
    "write_av_video",
]


class MediaError(ValueError):
    """A media file is missing, corrupt or not in the expected format; the message names the file."""


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
    try:
        with atomic_path(path) as tmp:
            soundfile.write(str(tmp), wav, sample_rate, subtype="PCM_16", format="WAV")
    except Exception as exc:
        raise MediaError(f"cannot write wav file {path}: {exc}") from exc


def pcm16_round_trip(wav: torch.Tensor, sample_rate: int = 16000) -> torch.Tensor:
    """The waveform as :func:`write_wav` stores it and :func:`read_wav` reads it back (16-bit PCM through
    libsndfile, values clipped to [-1, 1]), computed in memory: what a recording gives after the ROI stage
    wrote its wav.

    Args:
        wav: ``(N,)`` float waveform.  sample_rate: written in the (in-memory) header, in Hz.

    Returns:
        ``torch.float32`` ``(N,)``.

    Raises:
        MediaError: not a finite 1-d waveform.
    """
    data = wav.detach().cpu().numpy() if isinstance(wav, torch.Tensor) else np.asarray(wav)
    if data.ndim != 1 or not np.all(np.isfinite(data)):
        raise MediaError(f"pcm16_round_trip: expected a finite 1-d waveform, got shape {data.shape}")
    buffer = io.BytesIO()
    soundfile.write(buffer, np.clip(data, -1.0, 1.0).astype(np.float32), sample_rate, subtype="PCM_16",
                    format="WAV")
    buffer.seek(0)
    out, _ = soundfile.read(buffer, dtype="float32")
    return torch.from_numpy(np.ascontiguousarray(out))


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


_SMALL_FRAME_PIXELS = 160 * 160  # read_video decodes frames up to this size single-threaded


@contextlib.contextmanager
def _video_stream(path: Path) -> Iterator[tuple[av.container.InputContainer, av.video.stream.VideoStream]]:
    """``(container, first video stream)`` of an existing file; any FFmpeg error inside the ``with`` block
    becomes a :class:`MediaError` naming the file."""
    _check_exists(path, "video")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError(f"video file {path} has no video stream")
            yield container, container.streams.video[0]
    except MediaError:
        raise
    except Exception as exc:  # av.error.FFmpegError and friends
        raise MediaError(f"cannot read video file {path}: {exc}") from exc


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
    with _video_stream(path) as (container, stream):
        if stream.codec_context.width * stream.codec_context.height <= _SMALL_FRAME_PIXELS:
            # ROI-sized frames decode 2-3x faster on the calling thread than with FFmpeg's frame threads
            stream.thread_type = "NONE"
            stream.codec_context.thread_count = 1
        frames = [_gray(frame) for frame in container.decode(stream)]
    if not frames:
        raise MediaError(f"video file {path} has no decodable frame")
    return torch.from_numpy(np.stack(frames))


@dataclass(frozen=True)
class VideoCheck:
    """What :func:`check_video` found: frame size in pixels, average frame rate (frames/s), the number of
    frames the container declares (0 when it declares none) and the number that decode."""

    width: int
    height: int
    fps: float
    declared_frames: int
    decoded_frames: int


def check_video(path: str | os.PathLike) -> VideoCheck:
    """Decode every frame of the first video stream of a file (without converting them) to check that it is
    readable to its last frame.

    Raises:
        MediaError: the file is missing, cannot be opened or decoded, or has no video stream.
    """
    with _video_stream(Path(path)) as (container, stream):
        stream.thread_type = "NONE"
        stream.codec_context.thread_count = 1
        decoded = sum(1 for _ in container.decode(stream))
        return VideoCheck(stream.codec_context.width, stream.codec_context.height,
                          float(stream.average_rate or 0.0), int(stream.frames or 0), decoded)


def video_fps(path: str | os.PathLike) -> float:
    """The average frame rate (frames per second) of the first video stream of a file.

    Raises:
        MediaError: the file is missing, unreadable or has no video stream.
    """
    path = Path(path)
    with _video_stream(path) as (_, stream):
        rate = stream.average_rate
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
    try:
        with atomic_path(path) as tmp, av.open(str(tmp), mode="w", format="mp4") as container:
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
    except Exception as exc:
        raise MediaError(f"cannot write video file {path}: {exc}") from exc


# --- raw audio-visual recordings (any container): the input of the mouth ROI preprocessing ---------------


def read_audio_track(path: str | os.PathLike, sample_rate: int = 16000) -> torch.Tensor:
    """Decode the first audio stream of any container (mp4, mkv, wav, ...) as mono at ``sample_rate``.

    As AV-HuBERT's LRS3 preparation (``ffmpeg -i x.mp4 -ac 1 -ar 16000 x.wav``), the audio is resampled by
    FFmpeg's libswresample (PyAV's ``AudioResampler``); the channels are then averaged (the level of a
    centred source is kept, where ``-ac 1`` would raise it by 3 dB; LRS3 and VoxCeleb2 are mono anyway).

    Args:
        path: the media file.
        sample_rate: output sampling rate in Hz.

    Returns:
        ``torch.float32`` tensor ``(num_samples,)`` in about [-1, 1].

    Raises:
        MediaError: the file is missing, cannot be decoded, has no audio stream or no audio sample.
    """
    path = Path(path)
    _check_exists(path, "media")
    chunks = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise MediaError(f"media file {path} has no audio stream")
            resampler = av.AudioResampler(format="fltp", rate=sample_rate)  # planar, input channels kept
            for frame in container.decode(audio=0):
                frame.pts = None  # let the resampler count samples (some containers have gaps in pts)
                chunks += [f.to_ndarray().mean(axis=0) for f in resampler.resample(frame)]
            chunks += [f.to_ndarray().mean(axis=0) for f in resampler.resample(None)]
    except MediaError:
        raise
    except Exception as exc:  # av.error.FFmpegError and friends
        raise MediaError(f"cannot read the audio of {path}: {exc}") from exc
    wav = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, dtype=np.float32)
    if wav.size == 0:
        raise MediaError(f"media file {path} has no decodable audio sample")
    return torch.from_numpy(wav)


def _nearest_frames(times: np.ndarray, fps: float, duration: float) -> np.ndarray:
    """Indices of the source frames shown at ``0, 1/fps, 2/fps, ...`` (nearest presentation time).

    Args:
        times: float ``(N,)`` increasing presentation times in seconds, ``times[0] = 0``.
        fps: output frame rate.  duration: length of the source in seconds (last time + frame duration).

    Returns:
        int64 ``(round(duration * fps),)`` (at least one) indices into ``times``; ties go to the earlier one.
    """
    count = max(1, int(round(duration * fps)))
    slots = np.arange(count) / fps
    right = np.clip(np.searchsorted(times, slots, side="left"), 1, len(times) - 1) if len(times) > 1 else None
    if right is None:
        return np.zeros(count, dtype=np.int64)
    left = right - 1
    take_right = np.abs(times[right] - slots) < np.abs(slots - times[left])
    return np.where(take_right, right, left).astype(np.int64)


def read_video_rgb(path: str | os.PathLike, fps: float = 25.0) -> tuple[torch.Tensor, float]:
    """Decode the first video stream of a file as RGB frames resampled to ``fps`` by timestamp.

    Output frame ``k`` is the source frame whose presentation time is nearest to ``k / fps`` (times counted
    from the first frame), as FFmpeg's ``fps`` filter does; the output has ``round(duration * fps)``
    frames, the duration being the source's (last frame time + one source frame). So a 30 fps or a
    29.97 fps recording becomes 25 fps of the same duration (some frames dropped), a 25 fps one is kept
    frame for frame. Frames without a timestamp are placed at ``index / average_rate``.

    Args:
        path: a video file PyAV/FFmpeg can decode (LRS3 / VoxCeleb2 mp4, ...).
        fps: output frame rate in frames per second.

    Returns:
        ``(frames, source_fps)``: ``torch.uint8`` ``(T, H, W, 3)`` RGB and the stream's average frame rate.

    Raises:
        MediaError: the file is missing, cannot be decoded, has no video stream or no frame.
    """
    path = Path(path)
    _check_exists(path, "video")
    frames, times = [], []
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError(f"video file {path} has no video stream")
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or fps)
            for index, frame in enumerate(container.decode(video=0)):
                times.append(frame.time if frame.time is not None else index / rate)
                frames.append(frame.to_ndarray(format="rgb24"))
    except MediaError:
        raise
    except Exception as exc:  # av.error.FFmpegError and friends
        raise MediaError(f"cannot read video file {path}: {exc}") from exc
    if not frames:
        raise MediaError(f"video file {path} has no decodable frame")
    order = np.argsort(np.asarray(times), kind="stable")  # presentation order (decoders give it already)
    times = np.asarray(times, dtype=np.float64)[order]
    times -= times[0]
    frame_duration = float(np.median(np.diff(times))) if len(times) > 1 else 1.0 / rate
    if frame_duration <= 0:
        frame_duration = 1.0 / rate
    keep = _nearest_frames(times, fps, times[-1] + frame_duration)
    return torch.from_numpy(np.stack([frames[order[i]] for i in keep])), rate


def write_av_video(
    path: str | os.PathLike,
    frames: torch.Tensor | np.ndarray,
    wav: torch.Tensor | np.ndarray | None = None,
    fps: int | Fraction = 25,
    sample_rate: int = 16000,
    crf: int = 23,
    preset: str = "veryfast",
) -> None:
    """Write an H.264 (yuv420p) + AAC (mono) mp4, atomically (temporary file + ``os.replace``).

    This makes raw-looking audio-visual recordings (LRS3-like test fixtures) for the ROI preprocessing;
    the preprocessed corpus itself is written by :func:`write_video` and :func:`write_wav`.

    Args:
        path: the target ``.mp4``; its directory must exist.
        frames: ``uint8`` RGB ``(T, H, W, 3)`` or gray ``(T, H, W)``, ``T >= 1``, even ``H`` and ``W``.
        wav: ``(num_samples,)`` float waveform in [-1, 1] at ``sample_rate`` (clipped), or None for a
            file without audio stream.
        fps: video frame rate in frames per second (a ``Fraction`` for NTSC rates: ``Fraction(30000, 1001)``).
        sample_rate: audio sampling rate in Hz.
        crf, preset: x264 constant rate factor and speed preset.

    Raises:
        MediaError: bad shapes or dtypes, non-finite audio, or the file cannot be written.
    """
    path = Path(path)
    if isinstance(frames, torch.Tensor):
        frames = frames.detach().cpu().numpy()
    frames = np.asarray(frames)
    if frames.ndim == 3:
        frames = np.repeat(frames[..., None], 3, axis=3)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] == 0:
        raise MediaError(
            f"cannot write video file {path}: expected uint8 frames (T, H, W, 3) or (T, H, W) with T >= 1, "
            f"got {frames.dtype} {frames.shape}"
        )
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise MediaError(f"cannot write video file {path}: height and width must be even, got {frames.shape}")
    if wav is not None:
        if isinstance(wav, torch.Tensor):
            wav = wav.detach().cpu().numpy()
        wav = np.asarray(wav, dtype=np.float32)
        if wav.ndim != 1 or wav.size == 0 or not np.all(np.isfinite(wav)):
            raise MediaError(f"cannot write video file {path}: audio must be a finite non-empty 1-d waveform")
        wav = np.clip(wav, -1.0, 1.0)
    try:
        with atomic_path(path) as tmp, av.open(str(tmp), mode="w", format="mp4") as container:
            video = container.add_stream("libx264", rate=fps)
            video.width, video.height, video.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
            video.options = {"crf": str(crf), "preset": preset, "threads": "1", "x264-params": "mbtree=0"}
            audio = None
            if wav is not None:
                audio = container.add_stream("aac", rate=sample_rate, layout="mono")
            for index, image in enumerate(frames):
                frame = av.VideoFrame.from_ndarray(image, format="rgb24")
                frame.pts = index
                container.mux(video.encode(frame))
            container.mux(video.encode(None))
            if audio is not None:
                block = 1024  # AAC frame size
                for start in range(0, wav.shape[0], block):
                    chunk = wav[start : start + block]
                    frame = av.AudioFrame.from_ndarray(chunk[None, :], format="flt", layout="mono")
                    frame.sample_rate, frame.pts = sample_rate, start
                    container.mux(audio.encode(frame))
                container.mux(audio.encode(None))
    except Exception as exc:
        raise MediaError(f"cannot write video file {path}: {exc}") from exc
