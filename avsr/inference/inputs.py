"""The inputs of inference: items from what a caller gives, and their media read as the recipe reads them.

Per utterance (:class:`avsr.inference.types.TranscribeItem`):

* video: a path -- a preprocessed mouth ROI (a video of exactly 96x96 pixels, as AV-HuBERT's preprocessed
  LRS3) or a raw face video (anything else: the ROI stage, :func:`avsr.data.roi.preprocess_video`, runs and
  its output is read back, exactly what the recipe's ROI stage writes) -- or an array: uint8 ROI frames
  ``(T, H, W)`` with ``H, W >= 88`` (96x96 for AV-HuBERT's ROIs) at 25 fps, or uint8 RGB face frames
  ``(T, H, W, 3)`` at 25 fps (ROI extraction in memory);
* audio: a path -- a 16 kHz mono wav/flac is read as is, other rates and formats (any container FFmpeg reads)
  are decoded, downmixed and resampled to 16 kHz; the audio track of a video file is cut or zero-padded to
  its 25 fps frame count and stored as 16-bit PCM, as the ROI stage does -- or a float waveform ``(N,)`` at
  16 kHz (another ``sample_rate`` is resampled; audio recorded below 16 kHz gets a warning unless the model
  heard narrowband audio in training, :func:`warn_low_rate`; an array given without ``sample_rate`` whose
  spectrum looks band-limited to 4 kHz gets one too, :func:`high_band_db`, :func:`warn_narrowband`).

:func:`load_item` reads one item for a modality, mixes the noise of a test condition into its audio (the
segment chosen by the item's key) and finds the change of its edges (:mod:`avsr.inference.segments`).
Every error is an :class:`avsr.inference.types.InferenceError` naming the input.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from avsr.data.datadir import Utterance
from avsr.data.media import (
    MediaError,
    pcm16_round_trip,
    read_audio_aligned,
    read_audio_track,
    read_video_frames,
    read_wav,
    video_timing,
)
from avsr.data.noise import NoiseSource
from avsr.features import SAMPLES_PER_FRAME
from avsr.inference.segments import EdgeRanges, edge_change
from avsr.inference.types import (
    FPS,
    MAX_FRAME_DIFF,
    MIN_FRAMES,
    ROI_SIZE,
    SAMPLE_RATE,
    InferenceError,
    Media,
    MediaFileItem,
    TranscribeItem,
    Transcript,
)
from avsr.inference.video_cache import VersionKey, version_key

__all__ = ["collect_media", "VIDEO_SUFFIXES", "as_item", "given_modality", "noise_source", "load_item",
           "UnusableVideo", "load_video", "load_audio", "warn_low_rate", "high_band_db", "warn_narrowband",
           "NARROWBAND_FROM_HZ", "NARROWBAND_BELOW_DB"]

logger = logging.getLogger("avsr.inference")


#: an audio array taken as 16 kHz looks band-limited to 4 kHz (8 kHz audio) when its energy from this
#: frequency up (Hz) is :data:`NARROWBAND_BELOW_DB` or more below its total energy. Not 4 kHz: the resampler's
#: transition band leaves 16 kHz speech that went through 8 kHz at up to -30 dB in 4-8 kHz, while from 5 kHz
#: up it is at -58 dB or less (median -63) and full-band speech at -32 dB or more (median -26), measured on
#: 155 recordings of festival's voice databases (torchaudio's resampling, as
#: :func:`avsr.features.narrowband`).
NARROWBAND_FROM_HZ = 5000.0
#: the threshold of :data:`NARROWBAND_FROM_HZ`, in dB (white noise through 8 kHz: -53 dB).
NARROWBAND_BELOW_DB = -45.0

#: file name endings :func:`collect_media` takes from a folder.
VIDEO_SUFFIXES = (".mp4", ".mkv", ".avi", ".mov", ".webm", ".mpg", ".mpeg")


def collect_media(paths: list[Path]) -> tuple[list[Path], dict[Path, str]]:
    """The files to transcribe of paths a user gives: each file, and for a folder every video in it (names
    ending in one of :data:`VIDEO_SUFFIXES`, sorted, recursive).

    Returns:
        ``(files, bad)``: the files, and the paths that give none (no such file or folder, a folder without
        video) with the reason, a line naming the path.
    """
    files: list[Path] = []
    bad: dict[Path, str] = {}
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES and p.is_file())
            if not found:
                bad[path] = f"{path}: no video ({', '.join(VIDEO_SUFFIXES)}) in this folder"
            files += found
        elif path.is_file():
            files.append(path)
        else:
            bad[path] = f"{path}: no such file or folder"
    return files, bad


#: audio cut after a video's end is noted (``info["audio_cut_s"]``) when longer than this, in seconds: more
#: than an AAC encoder's padding of the last frame.
_CUT_NOTED_S = MAX_FRAME_DIFF / FPS


class UnusableVideo(InferenceError):
    """An item's video exists but gives no frames to decode: an unreadable file or one without a video track,
    no face for the ROI stage, no frame. :func:`load_item` decodes an audio-visual item with such a video
    from its audio alone (``info["video_fallback"]``: :attr:`reason`).

    Args:
        message: the error (names the input; may suggest another modality).
        reason: the same without the suggestion (default: ``message``).
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


def _name(source: Any) -> str:
    return str(source) if isinstance(source, (str, os.PathLike)) else f"<{type(source).__name__}>"


def _streams(path: Path) -> tuple[bool, tuple[int, int] | None]:
    """(has an audio stream, (width, height) of its video stream or None). Raises InferenceError."""
    import av

    if not path.is_file():
        raise InferenceError(f"{path}: no such file")
    try:
        with av.open(str(path)) as container:
            video = container.streams.video
            size = (video[0].codec_context.width, video[0].codec_context.height) if video else None
            return bool(container.streams.audio), size
    except Exception as exc:  # av.error.FFmpegError and friends
        raise InferenceError(f"{path}: cannot read this file as audio or video ({exc})") from exc


def _to_tensor(array: Any, what: str, key: str) -> torch.Tensor:
    if isinstance(array, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(array))
    if isinstance(array, torch.Tensor):
        return array.detach().cpu()
    raise InferenceError(
        f"{key}: {what} must be a path, a numpy array or a tensor, got {type(array).__name__}")


def _check_waveform(wav: torch.Tensor, key: str, source: str) -> torch.Tensor:
    if wav.dim() == 2 and 1 in wav.shape:
        wav = wav.reshape(-1)
    if wav.dim() != 1:
        raise InferenceError(f"{key}: the waveform {source} must be mono (N,), got shape {tuple(wav.shape)}")
    if not wav.is_floating_point():
        raise InferenceError(f"{key}: the waveform {source} must be float in [-1, 1], got {wav.dtype}")
    if wav.numel() == 0:
        raise InferenceError(f"{key}: the audio {source} is empty")
    if not bool(torch.isfinite(wav).all()):
        raise InferenceError(f"{key}: the audio {source} has NaN or infinite samples")
    return wav.to(torch.float32)


def _read_audio_file(path: Path) -> tuple[torch.Tensor, dict[str, Any]]:
    """A 16 kHz mono file as is; any other rate/format decoded, downmixed and resampled to 16 kHz."""
    import soundfile

    try:
        info = soundfile.info(str(path))
    except Exception:  # not a format libsndfile reads (mp3, mp4, ...): FFmpeg
        info = None
    if info is not None and info.samplerate == SAMPLE_RATE and info.channels == 1:
        return read_wav(path), {}
    wav = read_audio_track(path, SAMPLE_RATE)
    resampled = info is not None and info.samplerate != SAMPLE_RATE
    note = {"resampled_from_hz": info.samplerate} if resampled else {}
    return wav, note


def as_item(x: Any, index: int) -> TranscribeItem:
    """A fresh :class:`TranscribeItem` (its ``key`` filled in) from an item of ``transcribe_batch``.

    Args:
        x: a :class:`TranscribeItem`, an :class:`avsr.data.datadir.Utterance`, a mapping of its fields, or a
            path (a :class:`MediaFileItem`: the file's streams, whichever it has).
        index: its place in the list (the key ``utt<index>`` when no path names it).

    Raises:
        InferenceError: an unknown field of a mapping, or another type.
    """
    if isinstance(x, TranscribeItem):
        item = TranscribeItem(x.video, x.audio, x.key, x.num_frames, x.sample_rate)
    elif isinstance(x, Utterance):
        item = TranscribeItem(x.video, x.wav, x.utt_id, x.num_frames)
    elif isinstance(x, Mapping):
        unknown = set(x) - {"video", "audio", "key", "num_frames", "sample_rate"}
        if unknown:
            raise InferenceError(f"item {index}: unknown field(s) {sorted(unknown)}")
        item = TranscribeItem(**x)
    elif isinstance(x, (str, os.PathLike)):
        return MediaFileItem(video=x, audio=x, key=Path(x).stem)
    else:
        raise InferenceError(f"item {index}: expected a TranscribeItem, an Utterance, a mapping or a "
                             f"path, got {type(x).__name__}")
    if item.key is None:
        path = next((s for s in (item.video, item.audio) if isinstance(s, (str, os.PathLike))), None)
        item.key = Path(path).stem if path is not None else f"utt{index}"
    return item


def given_modality(item: TranscribeItem) -> str | Transcript:
    """The modality of what an item has (a :class:`MediaFileItem`: its file's streams), or a Transcript with
    the error (nothing given, an unreadable file)."""
    has_video, has_audio = item.video is not None, item.audio is not None
    if isinstance(item, MediaFileItem):
        try:
            has_audio, size = _streams(Path(item.video))
        except InferenceError as exc:
            return Transcript(key=item.key, error=str(exc))
        has_video = size is not None
    if has_video and has_audio:
        return "audiovisual"
    if has_video or has_audio:
        return "video" if has_video else "audio"
    return Transcript(key=item.key, error=f"{item.key}: neither video nor audio given")


def noise_source(noise: Any) -> NoiseSource | None:
    """The :class:`avsr.data.noise.NoiseSource` of a ``noise=`` argument (a 16 kHz wav path, a ``(N,)`` float
    waveform, a NoiseSource, or None).

    Raises:
        InferenceError: an unreadable file or a bad waveform (``noise`` named).
    """
    if noise is None or isinstance(noise, NoiseSource):
        return noise
    if isinstance(noise, (str, os.PathLike)):
        try:
            return NoiseSource(noise)
        except (MediaError, ValueError) as exc:
            raise InferenceError(f"noise {noise}: {exc}") from exc
    try:
        return NoiseSource.from_waveform(_to_tensor(noise, "noise", "noise"))
    except ValueError as exc:
        raise InferenceError(str(exc)) from exc


def _no_face(message: str, name: str, audio_available: bool) -> UnusableVideo:
    """The :class:`UnusableVideo` of a ROI stage error (its message named by ``name``; "no face" with audio
    at hand suggests the audio modality)."""
    text = message if name in message else f"{name}: {message}"
    if "no face" in message and audio_available:
        return UnusableVideo(f"{text} (its audio alone can be transcribed with the audio modality: "
                             "modality='audio')", text)
    return UnusableVideo(text)


def _video_array(item: TranscribeItem) -> tuple[torch.Tensor, dict[str, Any]]:
    """ROI frames (T, H, W) uint8 of an item's video array (RGB face frames: the ROI extracted)."""
    key = item.key
    frames = _to_tensor(item.video, "video", key)
    if frames.dtype != torch.uint8:
        raise InferenceError(f"{key}: video frames must be uint8 (0-255), got {frames.dtype}")
    if frames.dim() == 4 and frames.shape[-1] == 3:
        from avsr.data.roi import RoiError, extract_mouth_roi

        try:
            track = extract_mouth_roi(frames, name=key)
        except RoiError as exc:
            raise _no_face(str(exc), key, item.audio is not None) from exc
        return torch.from_numpy(track.frames), {"frames_without_face": track.num_missing}
    if frames.dim() != 3 or min(frames.shape[1:]) < 88:
        raise InferenceError(
            f"{key}: video frames must be ROI frames (T, H, W) with H, W >= 88 (AV-HuBERT: 96x96) or "
            f"RGB face frames (T, H, W, 3), got shape {tuple(frames.shape)}")
    if frames.shape[0] == 0:
        raise UnusableVideo(f"{key}: the video has no frame")
    return frames, {}


def load_video(item: TranscribeItem, work: Path, with_audio: bool
               ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
    """The video of an item (see the module docstring), at 25 fps: a file is read by
    :func:`avsr.data.media.read_video_frames` (every frame; its timestamps where plausible, else its nominal
    rate or 25 fps; resampled by time; upright), a ROI mp4 at 25 fps frame for frame as the recipe reads it.

    Args:
        item: the item (its ``video`` not None).
        work: where the ROI stage writes the ROI mp4 and wav of a raw face video (created when needed).
        with_audio: also return the 16 kHz wav the ROI stage writes for the same raw file (aligned to the
            video's first frame, cut or zero-padded to 640 samples per frame).

    Returns:
        ROI frames ``(T, H, W)`` uint8 at 25 fps, the ``(N,)`` float32 wav (``with_audio`` and a raw video)
        or None, and facts: ``frames_without_face``, ``audio_padded_s``, ``audio_cut_s`` (audio after the
        video's end, when above 80 ms), ``audio_offset_s`` (the audio's start minus the video's), and the
        reader's notes (``video_timestamps_ignored`` with ``video_assumed_fps``, ``video_resampled_from_fps``,
        ``video_rotated_deg``; :class:`avsr.data.media.VideoFrames`), each only when there is something to
        say.

    Raises:
        UnusableVideo: the file exists but cannot be read as video (unreadable, no video track, no decodable
            frame), the ROI stage finds no face, an array without frames.
        InferenceError: no such file, no audio track (``with_audio``), a bad array.
    """
    if not isinstance(item.video, (str, os.PathLike)):
        frames, info = _video_array(item)
        return frames, None, info
    path = Path(item.video)
    try:
        has_audio, size = _streams(path)
    except InferenceError as exc:
        if path.is_file():
            raise UnusableVideo(str(exc)) from exc
        raise
    if size is None:
        raise UnusableVideo(f"{path}: no video track, but the modality needs one (try modality='audio')",
                            f"{path}: no video track")
    if with_audio and not has_audio:
        raise InferenceError(f"{path}: no audio track, but the modality needs one (try modality='video')")
    if size == (ROI_SIZE, ROI_SIZE):  # a preprocessed mouth ROI
        try:
            video = read_video_frames(path, FPS)
        except MediaError as exc:
            raise UnusableVideo(str(exc)) from exc
        return video.frames, None, dict(video.notes)
    from avsr.data.roi import RoiError, preprocess_video

    work.mkdir(parents=True, exist_ok=True)
    mp4, wav_path = work / "roi.mp4", (work / "audio.wav" if with_audio else None)
    try:
        stats = preprocess_video(path, mp4, wav_path)
    except RoiError as exc:
        raise _no_face(str(exc), str(path), has_audio) from exc
    info = {"frames_without_face": stats.get("frames_without_face")}
    info.update((k, v) for k, v in stats.items() if v and (k.startswith("video_") or k in (
        "audio_padded_s", "audio_offset_s") or (k == "audio_cut_s" and v > _CUT_NOTED_S)))
    return (read_video_frames(mp4, FPS).frames, (read_wav(wav_path) if wav_path is not None else None),
            info)


def load_audio(item: TranscribeItem) -> tuple[torch.Tensor, dict[str, Any]]:
    """The 16 kHz waveform ``(N,)`` float32 of an item's audio (see the module docstring) and facts
    (``resampled_from_hz``; ``narrowband_db``: an array without ``sample_rate`` whose energy from
    :data:`NARROWBAND_FROM_HZ` up is that many dB below its total, at most :data:`NARROWBAND_BELOW_DB`; for
    the audio of a video file, :func:`_video_file_audio`'s).

    Raises:
        InferenceError: no such or an unreadable file, no audio track, a bad array or sample rate.
    """
    key, source = item.key, item.audio
    if not isinstance(source, (str, os.PathLike)):
        wav = _check_waveform(_to_tensor(source, "audio", key), key, "array")
        info: dict[str, Any] = {}
        if item.sample_rate is None:  # taken as 16 kHz: does it sound like it?
            db = high_band_db(wav)
            if db is not None and db <= NARROWBAND_BELOW_DB:
                info["narrowband_db"] = round(db, 1)
            return wav, info
        if not 4000 <= item.sample_rate <= 384000:
            raise InferenceError(f"{key}: sample_rate {item.sample_rate} Hz cannot be right for speech")
        if item.sample_rate != SAMPLE_RATE:
            import torchaudio

            wav = torchaudio.functional.resample(wav, item.sample_rate, SAMPLE_RATE)
            info["resampled_from_hz"] = item.sample_rate
        return wav, info
    path = Path(source)
    has_audio, size = _streams(path)
    if not has_audio:
        raise InferenceError(f"{path}: no audio track, but the modality needs one (try modality='video')")
    if size is not None:  # the audio of a video file: as the ROI stage writes it
        wav, info = _video_file_audio(path)
        return pcm16_round_trip(_check_waveform(wav, key, str(path))), info
    wav, info = _read_audio_file(path)
    return _check_waveform(wav, key, str(path)), info


def _video_file_audio(path: Path) -> tuple[torch.Tensor, dict[str, Any]]:
    """The audio track of a video file as the ROI stage writes it: aligned to the video's first frame
    (:func:`avsr.data.media.read_audio_aligned`) and cut or zero-padded to 640 samples per frame of the
    video at 25 fps (:func:`avsr.data.media.video_timing`); facts ``audio_offset_s``, ``audio_padded_s``,
    ``audio_cut_s`` (each when not 0; the cut when above 80 ms). Where the video cannot be read, or gives
    too few frames for the audio (:func:`_too_few_frames`), the whole track as decoded, with no facts.

    Returns:
        float32 ``(N,)`` at 16 kHz and the facts.

    Raises:
        MediaError: the audio cannot be decoded.
    """
    try:
        video = video_timing(path, FPS)
        wav, offset = read_audio_aligned(path, video.start_s, SAMPLE_RATE)
    except MediaError:
        return read_audio_track(path, SAMPLE_RATE), {}
    if _too_few_frames(video.num_frames, wav.numel() / SAMPLES_PER_FRAME):
        return read_audio_track(path, SAMPLE_RATE), {}
    num_samples = video.num_frames * SAMPLES_PER_FRAME
    info = {"audio_offset_s": round(offset, 4),
            "audio_padded_s": max(0, num_samples - wav.numel()) / SAMPLE_RATE,
            "audio_cut_s": max(0, wav.numel() - num_samples) / SAMPLE_RATE}
    aligned = torch.zeros(num_samples)
    n = min(num_samples, wav.numel())
    aligned[:n] = wav[:n]
    return aligned, {k: v for k, v in info.items() if v and (k != "audio_cut_s" or v > _CUT_NOTED_S)}


def _too_few_frames(num_frames: int, audio_frames: float) -> str | None:
    """Why a video of ``num_frames`` 25 fps frames cannot go with ``audio_frames`` frames (640 samples) of
    audio -- fewer than ``MIN_FRAMES``, or fewer than half the audio's -- or None when it can."""
    if num_frames >= MIN_FRAMES and num_frames >= audio_frames / 2:
        return None
    return (f"the video has {num_frames} frame(s) at 25 fps ({num_frames / FPS:.2f} s) for "
            f"{audio_frames / FPS:.2f} s of audio")


def _silent_file(item: TranscribeItem) -> bool:
    """Whether the item is a bare path (:class:`MediaFileItem`) to a file without an audio track."""
    if not isinstance(item, MediaFileItem):
        return False
    try:
        return not _streams(Path(item.audio))[0]
    except InferenceError:
        return False


def _edges_of(item: TranscribeItem, wav: torch.Tensor | None, edge_frames: EdgeRanges | None,
              source: NoiseSource | None, snr_db: float | None, info: dict[str, Any]
              ) -> tuple[int, int] | None:
    """The change of the item's edges (:func:`avsr.inference.segments.edge_change`), found in ``wav`` (the
    audio as decoded) or, for a video-only decode, in the item's audio read here with the same noise (the
    recording a user would have; a bare path to a silent video has none, as if no audio were given)."""
    if edge_frames is not None and wav is None and item.audio is not None and not _silent_file(item):
        try:
            wav, _ = load_audio(item)
        except (InferenceError, MediaError, ValueError) as exc:
            info["edges_note"] = f"edges kept: its audio could not be read ({exc})"
            return None
        if source is not None:
            wav = source.mix(wav, snr_db, key=item.key)
    return edge_change(edge_frames, wav, info)


def load_item(item: TranscribeItem, inputs: tuple[str, ...], work: Path, *,
              video_cache: Mapping[VersionKey, torch.Tensor] | None = None, source: NoiseSource | None = None,
              snr_db: float | None = None, edge_frames: EdgeRanges | None = None) -> Media:
    """The raw media of one item for ``inputs``, ready to be cut and decoded.

    Args:
        item: the item (its key set, :func:`as_item`).
        inputs: the streams the modality reads (:data:`avsr.modalities.MODALITY_INPUTS`).
        work: the item's folder for the ROI stage of a raw face video.
        video_cache: the caller's video cache: a video held there (under the key with the same change of the
            edges) is not read.
        source, snr_db: noise mixed into the audio with the segment chosen by the item's key, or None.
        edge_frames: the wanted edges; their change is found here (``Media.change``), made later.

    An audio-visual item (``inputs`` both streams) whose video cannot be used -- the file exists but cannot
    be read as video, the ROI stage finds no face (:class:`UnusableVideo`), or it has fewer than
    ``MIN_FRAMES`` frames or fewer than half the audio's 25 fps frames -- is read for its audio alone, as
    an audio-only call would read it: ``frames`` None and ``info["video_fallback"]`` the reason (the
    Transcriber then decodes it audio-only). A video file that does not exist is an error, as ever.

    Returns:
        The :class:`avsr.inference.types.Media` (``wav`` only when audio is decoded; ``frames`` None when
        cached or when the video is not used).

    Raises:
        InferenceError: a stream the modality needs is not given or unreadable (but an audio-visual item's
            video, see above), audio and video of different lengths, fewer than ``MIN_FRAMES`` frames.
    """
    key, info = item.key, {}
    need_audio, need_video = "audio" in inputs, "video" in inputs
    for stream, needed, other in (("video", need_video, "audio"), ("audio", need_audio, "video")):
        if needed and getattr(item, stream) is None:
            raise InferenceError(f"{key}: no {stream} given, but the modality needs it (try "
                                 f"modality='{other}')")
    frames = wav = None
    num_frames: int | None = None
    fallback: str | None = None  # why an audio-visual item's video is not used
    video_info: dict[str, Any] = {}
    same_file = (need_audio and need_video and isinstance(item.video, (str, os.PathLike))
                 and isinstance(item.audio, (str, os.PathLike))
                 and Path(item.video).resolve() == Path(item.audio).resolve())
    if need_video and same_file and video_cache is None:  # the ROI stage gives the file's audio too
        try:
            frames, wav, video_info = load_video(item, work, with_audio=True)
        except UnusableVideo as exc:
            fallback = exc.reason
        if wav is not None:  # the ROI stage's audio is cut to the video: the whole audio's length from that
            whole = (wav.numel() / SAMPLES_PER_FRAME
                     + FPS * (video_info.get("audio_cut_s", 0.0) - video_info.get("audio_padded_s", 0.0)))
            fallback = _too_few_frames(int(frames.shape[0]), whole)
            if fallback is not None:  # the audio read as an audio-only call reads it
                wav = None
    if need_audio and wav is None:
        wav, audio_info = load_audio(item)
        info.update(audio_info)
    if frames is not None and fallback is None:  # the video of the same file, read above
        fallback = _too_few_frames(int(frames.shape[0]), wav.numel() / SAMPLES_PER_FRAME)
        num_frames = int(frames.shape[0])
    if wav is not None and source is not None:
        wav = source.mix(wav, snr_db, key=key)
        info.update(noise=source.path, snr_db=snr_db)
    change = _edges_of(item, wav, edge_frames, source, snr_db, info)
    cache_key = version_key(key, change)
    if need_video and frames is None and fallback is None:
        if video_cache is not None and cache_key in video_cache:
            num_frames = int(video_cache[cache_key].shape[-1]) - (sum(change) if change else 0)
        else:
            try:
                frames, _, video_info = load_video(item, work, with_audio=False)
            except UnusableVideo as exc:
                if not need_audio:
                    raise
                fallback = exc.reason
            else:
                if need_audio:
                    fallback = _too_few_frames(int(frames.shape[0]), wav.numel() / SAMPLES_PER_FRAME)
                num_frames = int(frames.shape[0])
    if fallback is None:
        info.update(video_info)
    else:  # decoded audio-only, without the video's facts
        info["video_fallback"] = fallback
        frames = num_frames = None
    if wav is not None and need_audio:
        num_frames = _check_lengths(item, wav, num_frames, same_file)
    if num_frames < MIN_FRAMES:
        raise InferenceError(f"{key}: the input is {num_frames} frame(s) long ({num_frames / FPS:.2f} "
                             f"s); at least {MIN_FRAMES} frames at 25 fps are needed")
    return Media(key, wav if need_audio else None, frames, num_frames, info, change=change)


def _check_lengths(item: TranscribeItem, wav: torch.Tensor, num_frames: int | None, same_file: bool) -> int:
    """The item's length in frames: the video's, which the audio must match within ``MAX_FRAME_DIFF``
    frames (but where both come from one file), or the audio's when there is no video."""
    audio_frames = wav.numel() / SAMPLES_PER_FRAME
    if num_frames is not None and abs(audio_frames - num_frames) > MAX_FRAME_DIFF and not same_file:
        raise InferenceError(
            f"{item.key}: the audio {_name(item.audio)} lasts {wav.numel() / SAMPLE_RATE:.3f} s "
            f"({audio_frames:.1f} frames) but the video {_name(item.video)} has {num_frames} frames "
            f"at 25 fps ({num_frames / FPS:.3f} s); they must agree within {MAX_FRAME_DIFF} frames")
    return num_frames if num_frames is not None else math.ceil(wav.numel() / SAMPLES_PER_FRAME)


def warn_low_rate(results: list[Transcript], narrowband_trained: bool, log: bool = True) -> None:
    """Unless the model was trained with narrowband audio: a warning (``info["warning"]``) on each transcript
    whose audio was recorded below 16 kHz (``info["resampled_from_hz"]``), and one log line for them all
    (unless ``log`` is False: the caller reports the transcripts' warnings)."""
    if narrowband_trained:
        return
    low = [r for r in results if r.ok and r.info.get("resampled_from_hz", SAMPLE_RATE) < SAMPLE_RATE]
    for r in low:
        rate = r.info["resampled_from_hz"]
        note = (f"recorded at {rate} Hz: no frequencies above {rate // 2} Hz; a model trained on "
                "full-band audio misreads such audio, and this one was trained without narrowband_prob: "
                "expect a higher WER")
        r.info["warning"] = f"{r.info['warning']}; {note}" if r.info.get("warning") else note
    if low and log:
        lowest = min(low, key=lambda r: r.info["resampled_from_hz"])
        logger.warning("%d of %d inputs were recorded below 16 kHz (the lowest: %s at %d Hz) and have no "
                       "frequencies above half their rate; models trained on full-band audio misread "
                       "them, and this one was trained without narrowband_prob", len(low), len(results),
                       lowest.key, lowest.info["resampled_from_hz"])


def high_band_db(wav: torch.Tensor, from_hz: float = NARROWBAND_FROM_HZ) -> float | None:
    """How far the energy of a 16 kHz waveform from ``from_hz`` up lies below its total energy, in dB.

    The power spectrum is the sum over frames of a 512-point STFT (Hann window, hop 256, the mean removed;
    frames inside the waveform only, so that its abrupt ends add no splatter), 30 s at a time. 8 kHz audio
    brought to 16 kHz has nothing above 4 kHz but the resampler's leakage (see :data:`NARROWBAND_FROM_HZ`).

    Args:
        wav: ``(N,)`` float samples at 16 kHz.
        from_hz: the lower edge of the band, in Hz.

    Returns:
        ``10 log10(band energy / total energy)`` (<= 0), or None for a waveform with no energy to speak of
        (mean square below 1e-10, i.e. -100 dBFS: digital silence).
    """
    x = wav.detach().to(torch.float64).reshape(-1)
    x = x - x.mean()
    if x.numel() == 0 or float(x.pow(2).mean()) < 1e-10:
        return None
    n_fft, hop, chunk = 512, 256, 30 * SAMPLE_RATE  # chunk: a multiple of hop
    if x.numel() < n_fft:
        x = torch.nn.functional.pad(x, (0, n_fft - x.numel()))
    window = torch.hann_window(n_fft, dtype=torch.float64)
    power = torch.zeros(n_fft // 2 + 1, dtype=torch.float64)
    for start in range(0, x.numel() - n_fft + 1, chunk):  # the frames starting in [start, start + chunk)
        spec = torch.stft(x[start : start + chunk + n_fft - hop], n_fft, hop_length=hop, window=window,
                          center=False, return_complex=True)
        power += spec.abs().pow(2).sum(-1)
    freqs = torch.arange(power.numel(), dtype=torch.float64) * SAMPLE_RATE / n_fft
    ratio = float(power[freqs >= from_hz].sum() / power.sum())
    return 10 * math.log10(max(ratio, 1e-30))


def warn_narrowband(results: list[Transcript], narrowband_trained: bool, log: bool = True) -> None:
    """A warning (``info["warning"]``, and a log line naming the item unless ``log`` is False) on each
    transcript of an audio array given without ``sample_rate`` that looks band-limited to 4 kHz
    (``info["narrowband_db"]``, :func:`load_audio`): 16 kHz samples of a narrowband recording, which a model
    trained on full-band audio misreads (unless ``narrowband_trained``), or samples at another rate read as
    16 kHz ones (wrong words). Passing ``sample_rate`` says which, and silences the warning.

    The spectrum shows only the first: 8 kHz samples read as 16 kHz ones spread over 0-8 kHz (at twice the
    speed), so that :func:`high_band_db` does not tell them from full-band audio."""
    for r in results:
        if not r.ok or "narrowband_db" not in r.info:
            continue
        note = (f"the audio array has almost no energy above {NARROWBAND_FROM_HZ / 1000:g} kHz "
                f"({r.info['narrowband_db']:g} dB of its total): it looks like 8 kHz audio brought to 16 kHz"
                + ("" if narrowband_trained else " (this model was trained on full-band audio: expect a "
                   "higher WER)")
                + "; an array is read as 16 kHz unless sample_rate says otherwise: pass sample_rate=8000 if "
                "these are 8 kHz samples, sample_rate=16000 if they are 16 kHz ones")
        r.info["warning"] = f"{r.info['warning']}; {note}" if r.info.get("warning") else note
        if log:
            logger.warning("%s: %s", r.key, note)
