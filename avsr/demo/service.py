"""What the demo does with one upload, apart from HTTP: decide the modalities the files allow, transcribe
with :class:`avsr.Transcriber` and describe what the fusion and the ROI stage did.

The transcripts are the Transcriber's own (:meth:`avsr.inference.Transcriber.transcribe_batch` on the
uploaded paths, as ``avsr transcribe`` and the Python API give them): a raw face video goes through the ROI
stage once, in the first decoding that needs its video; the other modalities' decodings read the ROI mp4 that
stage wrote (the same frames a second ROI stage would give).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from avsr.inference import (
    MODALITY_INPUTS,
    InferenceError,
    TranscribeItem,
    Transcriber,
    Transcript,
    load_video,
)
from avsr.inference.inputs import as_item, given_modality

__all__ = ["DemoError", "Sources", "sources", "transcribe_upload", "ORDER"]

#: the modalities, richest first: the default is the first one the upload allows
ORDER = ("audiovisual", "video", "audio")


class DemoError(ValueError):
    """An upload or a request the demo cannot transcribe; the message is one line for the HTTP 400 answer."""


@dataclass
class Sources:
    """The media of one request: the file whose video track is used, the file whose audio track is used
    (either may be None; one file may be both) and the modalities they allow (richest first)."""

    video: Path | None
    audio: Path | None
    allowed: tuple[str, ...]


def _streams(path: Path) -> str:
    """The modality of what a file holds (``audio``, ``video`` or ``audiovisual``)."""
    found = given_modality(as_item(path, 0))
    if isinstance(found, Transcript):
        raise DemoError(found.error or f"{path}: unreadable")
    return found


def sources(video: Path | None, audio: Path | None) -> Sources:
    """The video and audio sources of an upload: the ``video`` file's video track and, when no ``audio`` file
    is given, its audio track; the ``audio`` file's audio track (its video track is not used).

    Raises:
        DemoError: no file, an unreadable file (the message names it), an ``audio`` file without audio.
    """
    if video is None and audio is None:
        raise DemoError("nothing to transcribe: upload a file as 'video' (a face or mouth video, with or "
                        "without sound) and/or 'audio'")
    video_src = audio_src = None
    if video is not None:
        held = _streams(video)
        video_src = video if "video" in MODALITY_INPUTS[held] else None
        audio_src = video if "audio" in MODALITY_INPUTS[held] else None
    if audio is not None:
        if "audio" not in MODALITY_INPUTS[_streams(audio)]:
            raise DemoError(f"{audio}: no audio track in the file given as 'audio'")
        audio_src = audio
    have = {name for name, src in (("video", video_src), ("audio", audio_src)) if src is not None}
    allowed = tuple(m for m in ORDER if set(MODALITY_INPUTS[m]) <= have)
    return Sources(video_src, audio_src, allowed)


def _result(t: Transcript) -> dict[str, Any]:
    """The answer's fields of one transcript: text, words (``[]`` without timings), modality, score, info."""
    words = [w.to_dict() for w in t.words] if t.words is not None else []
    score = t.score if math.isfinite(t.score) else None  # no hypothesis: null in JSON
    return {"text": t.text, "words": words, "modality": t.modality, "score": score,
            "duration_s": round(t.duration_s, 3), "info": dict(t.info)}


def transcribe_upload(tr: Transcriber, video: Path | None, audio: Path | None, work: Path, *,
                      modality: str | None = None, compare: bool = False, key: str = "upload"
                      ) -> dict[str, Any]:
    """Transcribe an upload; the demo's answer.

    Args:
        tr: the transcriber.
        video, audio: the uploaded files (see :func:`sources`).
        work: an empty folder for the ROI stage's files (the caller removes it).
        modality: ``audio``, ``video`` or ``audiovisual``; None: the richest the files allow.
        compare: also transcribe in every other modality the files allow (``info["modalities"]``).
        key: the utterance's name in the Transcriber's messages.

    Returns:
        ``{"text", "words", "modality", "info"}``: the transcript of ``modality`` (``"audio"`` when an
        audio-visual input's video could not be used: ``info["video_fallback"]`` says why), its word timings
        (``{"word", "start", "end", "score"}``, seconds; ``[]`` without, ``info["words_note"]`` says why) and
        ``info``: the Transcript's facts (:attr:`avsr.inference.Transcript.info`) with ``score``,
        ``duration_s``, ``allowed`` (the modalities the files allow), ``roi``
        (:func:`avsr.demo.preview.roi_preview` of the mouth track, when the video was decoded), ``fusion``
        (audio-visual decoding: the search's view weights, the single-stream views' texts it ranked with and
        the mean ``audio_gate`` and ``video_trust`` when the views were ranked; with the search's decision on
        the lips, their ``video_sync`` margin, the audio's ``audio_ctc_confidence`` and the bar the margin had
        to reach, ``video_sync_bar``, and with ``video_max_entropy`` the video-only view's
        ``video_ctc_entropy`` and its bar, ``video_entropy_bar``) and, with ``compare``,
        ``modalities``: ``{modality: {"text", "words", "modality", "score", "duration_s", "info"}}`` for each
        modality decoded, ``{"modality", "error"}`` for one that failed (the video of a face video without a
        face, ...).

    Raises:
        DemoError: no or unreadable files, a ``modality`` the files do not allow, and every error of the
            Transcriber in ``modality`` (no face, an empty input, ...), in one line.
    """
    from avsr.demo.preview import roi_preview

    src = sources(video, audio)
    if modality is not None and modality not in MODALITY_INPUTS:
        raise DemoError(f"modality must be one of {list(MODALITY_INPUTS)}, got {modality!r}")
    if not src.allowed:
        raise DemoError("the upload holds neither a usable video track nor an audio track")
    main = modality or src.allowed[0]
    if main not in src.allowed:
        has = "audio" if src.audio is not None else "video"
        raise DemoError(f"modality {main!r} needs {' and '.join(MODALITY_INPUTS[main])}, but the upload has "
                        f"{has} only")
    order = [main] + ([m for m in src.allowed if m != main] if compare else [])
    roi: Path | None = None
    done: dict[str, Transcript] = {}
    failed: dict[str, str] = {}
    for mod in order:
        inputs = MODALITY_INPUTS[mod]
        video_in = (roi or src.video) if "video" in inputs else None
        item = TranscribeItem(video=video_in, audio=src.audio, key=key)
        folder = work / mod
        try:
            (done[mod],) = tr.transcribe_batch([item], modality=mod, strict=True, progress=False,
                                               work_dir=folder, views=mod == "audiovisual")
        except InferenceError as exc:
            if mod == main:
                raise DemoError(str(exc)) from exc
            failed[mod] = str(exc)
            continue
        used_video = "video" in MODALITY_INPUTS.get(done[mod].modality, ())  # not when it fell back to audio
        if used_video and roi is None:  # the ROI stage's mp4 of a raw face video, else a ROI already
            roi = next(iter(sorted(folder.rglob("*.mp4"))), None) or src.video
    t = done[main]
    out = _result(t)
    info = out.pop("info")
    info.update(score=out.pop("score"), duration_s=out.pop("duration_s"), allowed=list(src.allowed))
    if roi is not None:
        frames, _, _ = load_video(TranscribeItem(video=roi, key=key), work / "preview", with_audio=False)
        info["roi"] = roi_preview(frames)
    fused = done.get("audiovisual")
    if fused is not None and fused.modality == "audiovisual":
        video_weight, audio_weight, audio_confidence = tr.searcher.view_weights
        info["fusion"] = {"video_weight": video_weight, "audio_weight": audio_weight,
                          "audio_confidence": audio_confidence,
                          "views": {name: v.text for name, v in (fused.views or {}).items()},
                          **{k: fused.info[k] for k in ("audio_gate", "video_trust", "video_sync",
                                                         "audio_ctc_confidence", "video_ctc_entropy")
                             if k in fused.info}}
        if tr.searcher.sync_rule is not None and "audio_ctc_confidence" in fused.info:
            bar, slope = tr.searcher.sync_rule
            info["fusion"]["video_sync_bar"] = round(bar + slope * fused.info["audio_ctc_confidence"], 4)
        if tr.searcher.video_max_entropy is not None and "video_ctc_entropy" in fused.info:
            info["fusion"]["video_entropy_bar"] = tr.searcher.video_max_entropy
    if compare:
        info["modalities"] = {m: _result(done[m]) if m in done else {"modality": m, "error": failed[m]}
                              for m in order}
    return {**out, "info": info}
