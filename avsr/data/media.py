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
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

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
    "PLAUSIBLE_FPS",
    "ASSUMED_FPS",
    "VideoFrames",
    "read_video_frames",
    "video_timing",
    "write_video",
    "video_fps",
    "VideoCheck",
    "check_video",
    "read_audio_track",
    "read_audio_aligned",
    "read_video_rgb",
    "write_av_video",
]

logger = logging.getLogger("avsr.media")

#: the frame rates (frames per second) that a video's timestamps, or its stream's nominal rate, may show;
#: outside this range they are taken as broken (a re-encoder that wrote every frame at about the same time).
PLAUSIBLE_FPS = (10.0, 120.0)
#: the frame rate assumed for a video whose timestamps and nominal rate are both implausible.
ASSUMED_FPS = 25.0


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
    """Decode all frames of the first video stream of a file as grayscale (the luma plane): every frame the
    decoder gives, in decode order, upright (:func:`read_video_frames` on rotation), not resampled.

    This is how training and feature extraction read the 25 fps mouth ROIs of a data dir; inference reads a
    video with :func:`read_video_frames`, which also resamples it to 25 fps by its timestamps (frame for frame
    the same frames for a 25 fps file).

    Args:
        path: a video file PyAV/FFmpeg can decode (normally a 96x96 H.264 mp4 at 25 fps).

    Returns:
        ``torch.uint8`` tensor ``(T, H, W)`` (``(T, W, H)`` for a stream rotated by a quarter turn).

    Raises:
        MediaError: the file is missing, cannot be decoded (corrupt), has no video stream or no frame.
    """
    return torch.from_numpy(np.stack(_decode(Path(path), _gray).images))


@dataclass
class _Decoded:
    """What :func:`_decode` read: the converted frames (upright; empty without conversion), each frame's
    presentation time in seconds (None where it has none), the stream's nominal rates (average, guessed from
    the codec, base; 0.0 where not stated) and the rotation applied in degrees counter-clockwise."""

    images: list[np.ndarray]
    times: list[float | None]
    rates: tuple[float, float, float]
    rotation: int


def _quarter_turns(frame: av.VideoFrame) -> int:
    """Counter-clockwise quarter turns (0-3) that show a decoded frame upright: its display matrix' rotation
    (PyAV's ``VideoFrame.rotation``, degrees counter-clockwise, as FFmpeg's ``autorotate``) rounded to a
    multiple of 90 degrees; 0 without one."""
    try:
        degrees = float(frame.rotation or 0.0)
    except Exception:  # a malformed display matrix
        return 0
    return int(round(degrees / 90.0)) % 4


def _decode(path: Path, convert: Callable[[av.VideoFrame], np.ndarray] | None) -> _Decoded:
    """Decode every frame of the first video stream of ``path`` in decode order, each converted by
    ``convert`` (None: not converted) and turned upright. Raises MediaError (no frame: names the file)."""
    with _video_stream(path) as (container, stream):
        if stream.codec_context.width * stream.codec_context.height <= _SMALL_FRAME_PIXELS:
            # ROI-sized frames decode 2-3x faster on the calling thread than with FFmpeg's frame threads
            stream.thread_type = "NONE"
            stream.codec_context.thread_count = 1
        rates = tuple(float(r) if r else 0.0 for r in (stream.average_rate, stream.guessed_rate,
                                                       stream.base_rate))
        images, times, turns = [], [], 0
        for frame in container.decode(stream):
            if not times:
                turns = _quarter_turns(frame)
            times.append(frame.time)
            if convert is not None:
                images.append(convert(frame))
    if not times:
        raise MediaError(f"video file {path} has no decodable frame")
    if turns:
        images = [np.rot90(image, turns) for image in images]
    return _Decoded(images, times, rates, 90 * turns)


def _plausible(rate: float) -> bool:
    return PLAUSIBLE_FPS[0] <= rate <= PLAUSIBLE_FPS[1]


def _timing(times: list[float | None], rates: tuple[float, float, float]
            ) -> tuple[np.ndarray, float, float, str | None]:
    """The presentation times to resample by.

    Args:
        times: each decoded frame's time in seconds (None: none), in decode order.
        rates: the stream's nominal rates (average, guessed, base; 0.0: not stated), frames/s.

    Returns:
        ``(times, source_fps, last_duration, ignored)``: float64 ``(N,)`` seconds from the first frame, the
        source's frame rate, how long the last frame is shown (s), and why the timestamps were ignored (None:
        they were used). Timestamps are used when every frame has one, they increase strictly and their
        average rate is within :data:`PLAUSIBLE_FPS`; otherwise frame ``i`` is put at ``i / rate``, the rate
        being the first plausible nominal rate, else :data:`ASSUMED_FPS`.
    """
    count, ignored = len(times), None
    nominal = next((r for r in rates if _plausible(r)), None)
    if any(t is None for t in times):
        ignored = "frames without timestamp"
    elif count > 1:
        t = np.asarray(times, dtype=np.float64)
        t -= t[0]
        steps = np.diff(t)
        if np.any(steps <= 0):
            ignored = "timestamps that do not increase"
        elif not _plausible((count - 1) / t[-1]):
            ignored = f"timestamps giving {(count - 1) / t[-1]:.4g} fps"
        else:
            source = rates[0] if _plausible(rates[0]) else (count - 1) / t[-1]
            last = steps[-1] if _plausible(1.0 / steps[-1]) else 1.0 / source
            return t, source, float(last), None
    rate = nominal or ASSUMED_FPS
    return np.arange(count, dtype=np.float64) / rate, rate, 1.0 / rate, ignored


@dataclass(frozen=True)
class VideoFrames:
    """A video read at a frame rate (:func:`read_video_frames`, :func:`video_timing`).

    Attributes:
        frames: ``torch.uint8`` ``(T, H, W)`` gray or ``(T, H, W, 3)`` RGB frames at the rate asked for,
            upright; None from :func:`video_timing`.
        num_frames: ``T``.
        source_fps: the source's frame rate in frames/s: the stream's average rate (or its timestamps'
            average rate) when its timestamps were used, else the rate assumed.
        start_s: the presentation time of its first frame in the container, in seconds (0.0 when it has none):
            what its audio is aligned to (:func:`read_audio_aligned`).
        notes: facts for a transcript's ``info``: ``video_timestamps_ignored`` (why) with
            ``video_assumed_fps`` (the rate the frames were taken at), ``video_resampled_from_fps`` (a source
            rate other than the one asked for), ``video_rotated_deg`` (the rotation applied, degrees
            counter-clockwise); empty for a plain 25 fps file.
    """

    frames: torch.Tensor | None
    num_frames: int
    source_fps: float
    start_s: float
    notes: dict[str, Any] = field(default_factory=dict)


def _resampled(path: Path, fps: float, convert: Callable[[av.VideoFrame], np.ndarray] | None,
               warn: bool) -> VideoFrames:
    decoded = _decode(path, convert)
    times, source, last, ignored = _timing(decoded.times, decoded.rates)
    keep = _nearest_frames(times, fps, times[-1] + last)
    notes: dict[str, Any] = {}
    if ignored is not None:
        notes.update(video_timestamps_ignored=ignored, video_assumed_fps=source)
        if warn:
            logger.warning("%s: video timestamps ignored (%s): its %d frames taken at %g fps", path, ignored,
                           len(times), source)
    if abs(source - fps) > 0.01:
        notes["video_resampled_from_fps"] = round(source, 3)
    if decoded.rotation:
        notes["video_rotated_deg"] = decoded.rotation
    frames = None
    if convert is not None:
        images = decoded.images
        frames = torch.from_numpy(np.stack(images if np.array_equal(keep, np.arange(len(images)))
                                           else [images[i] for i in keep]))
    start = float(decoded.times[0]) if decoded.times[0] is not None else 0.0
    return VideoFrames(frames, len(keep), float(source), start, notes)


def read_video_frames(path: str | os.PathLike, fps: float = 25.0, gray: bool = True) -> VideoFrames:
    """Decode the first video stream of a file at ``fps``, upright: how inference reads every video.

    Every frame the decoder gives is read, in decode order. The container's timestamps are used when
    plausible (every frame has one, they increase, their average rate is within :data:`PLAUSIBLE_FPS`);
    otherwise the frames are taken at the stream's nominal rate if plausible, else at :data:`ASSUMED_FPS`
    (25 fps), and one warning naming the file is logged (``notes["video_timestamps_ignored"]``). Output frame
    ``k`` is then the source frame shown at ``k / fps`` (nearest presentation time, as FFmpeg's ``fps``
    filter; :func:`_nearest_frames`) and the output has ``round(duration * fps)`` frames, the duration being
    the last frame's time plus its display time: 24, 29.97, 30, 50 or 60 fps and variable-rate recordings
    become ``fps`` of the same duration, a file at ``fps`` is kept frame for frame. A rotation in the
    stream's display matrix (a phone's portrait video) is applied in quarter turns, as FFmpeg's
    ``autorotate`` (mirroring is not). Grayscale sources and odd frame sizes are read as any other.

    Args:
        path: a video file PyAV/FFmpeg can decode.
        fps: output frame rate in frames per second.
        gray: ``(T, H, W)`` gray frames (the luma plane in full range, as :func:`read_video`); False:
            ``(T, H, W, 3)`` RGB.

    Returns:
        The :class:`VideoFrames` (``frames`` ``torch.uint8``).

    Raises:
        MediaError: the file is missing, cannot be decoded, has no video stream or no frame.
    """
    convert = _gray if gray else (lambda frame: frame.to_ndarray(format="rgb24"))
    return _resampled(Path(path), fps, convert, warn=True)


def video_timing(path: str | os.PathLike, fps: float = 25.0) -> VideoFrames:
    """What :func:`read_video_frames` finds, without converting the frames (``frames`` None) and without
    logging: the number of frames at ``fps``, the source's rate, the first frame's time and the notes.

    Raises:
        MediaError: the file is missing, cannot be decoded, has no video stream or no frame.
    """
    return _resampled(Path(path), fps, None, warn=False)


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
    return torch.from_numpy(_decode_audio(Path(path), sample_rate)[0])


def _decode_audio(path: Path, sample_rate: int) -> tuple[np.ndarray, float | None]:
    """:func:`read_audio_track`'s float32 ``(N,)`` samples and the presentation time of the first decoded
    audio frame in seconds (None: it has none). Raises MediaError."""
    _check_exists(path, "media")
    chunks, start = [], None
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise MediaError(f"media file {path} has no audio stream")
            resampler = av.AudioResampler(format="fltp", rate=sample_rate)  # planar, input channels kept
            for index, frame in enumerate(container.decode(audio=0)):
                if index == 0:
                    start = frame.time
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
    return wav, start


def read_audio_aligned(path: str | os.PathLike, video_start_s: float, sample_rate: int = 16000
                       ) -> tuple[torch.Tensor, float]:
    """The first audio stream of a video file (:func:`read_audio_track`) aligned to its video: sample ``n``
    is heard at ``video_start_s + n / sample_rate``, so that frame ``t`` of the video read at 25 fps
    (:func:`read_video_frames`, whose ``start_s`` is ``video_start_s``) goes with samples from
    ``t * sample_rate / 25`` (640 at 16 kHz).

    Audio that starts after the video gets zeros in front; audio that starts before it loses its first
    samples. The start of each stream is the presentation time of its first decoded frame (FFmpeg has already
    removed an AAC encoder's delay); audio without a timestamp is taken to start with the video.

    Args:
        path: the video file.
        video_start_s: the presentation time of the video's first frame in seconds
            (:attr:`VideoFrames.start_s`).
        sample_rate: output sampling rate in Hz.

    Returns:
        ``(wav, offset_s)``: ``torch.float32`` ``(N,)`` mono samples and the audio's start minus the video's
        in seconds (> 0: zeros put in front, < 0: samples dropped; 0.0 when less than one sample).

    Raises:
        MediaError: the file is missing, cannot be decoded, has no audio stream or no audio sample, or its
            audio ends before its video starts.
    """
    path = Path(path)
    wav, start = _decode_audio(path, sample_rate)
    offset = (start - video_start_s) if start is not None else 0.0
    shift = int(round(offset * sample_rate))
    if shift == 0:
        return torch.from_numpy(wav), 0.0
    if shift > 0:
        wav = np.concatenate([np.zeros(shift, dtype=np.float32), wav])
    elif -shift >= wav.size:
        raise MediaError(f"the audio of {path} ends before its video starts ({offset:.3f} s before it)")
    else:
        wav = wav[-shift:]
    return torch.from_numpy(np.ascontiguousarray(wav)), float(offset)


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
    """Decode the first video stream of a file as RGB frames resampled to ``fps`` by timestamp:
    :func:`read_video_frames` with ``gray=False`` (see there: plausible timestamps, nearest-frame
    resampling, rotation).

    Args:
        path: a video file PyAV/FFmpeg can decode (LRS3 / VoxCeleb2 mp4, ...).
        fps: output frame rate in frames per second.

    Returns:
        ``(frames, source_fps)``: ``torch.uint8`` ``(T, H, W, 3)`` RGB and the source's frame rate
        (:attr:`VideoFrames.source_fps`).

    Raises:
        MediaError: the file is missing, cannot be decoded, has no video stream or no frame.
    """
    video = read_video_frames(path, fps, gray=False)
    return video.frames, video.source_fps


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
