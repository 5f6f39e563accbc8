"""The checks of a corpus in AV-HuBERT's preprocessed layout, and the data dirs made of the utterances that
pass them -- what ``avsr-prepare-data`` runs (:mod:`avsr.bin.prepare_data` for the options).

The corpus layout is ``<corpus>/<split>/<speaker>/<utt>.{wav,mp4,txt}`` (16 kHz mono wav, 96x96 25 fps
mouth-ROI mp4, one-line transcript), as written by SynthGRID and by the ROI preprocessing of real videos
(:mod:`avsr.data.roi_jobs`). :func:`scan_split` finds a split's utterances (ids ``<speaker>_<utt>`` unless
``<utt>`` already starts with the speaker id); :func:`check_utterance` checks one: its wav, mp4 and txt all
exist; the wav is readable, mono and at 16 kHz (or is resampled into a copy), with no NaN or infinite
sample; the mp4 decodes to its last frame, at 25 fps and ``roi_size`` pixels square; audio and video last
the same within ``max_frame_diff`` 25 fps frames; the transcript is not empty and is UTF-8 text.
:func:`prepare_split` writes the data dir of the good ones and lists the bad ones with the reason in
``bad_utts``.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import soundfile as sf
from tqdm import tqdm

from avsr.data.datadir import DataDirError, Utterance, write_datadir, write_kaldi_map
from avsr.data.media import MediaError, check_video, read_audio_track, write_wav
from avsr.features import SAMPLES_PER_FRAME

__all__ = ["SAMPLE_RATE", "FPS", "scan_split", "check_utterance", "prepare_split"]

logger = logging.getLogger("avsr.prepare_data")

#: the sample rate (Hz) and frame rate (frames per second) of the corpus layout
SAMPLE_RATE = 16000
FPS = 25.0


def scan_split(split_dir: Path) -> tuple[list[Utterance], dict[str, str]]:
    """The utterances of one split directory of the corpus layout, and those whose files are incomplete.

    Returns:
        ``(utterances, bad)``: utterances with their three files (``num_frames`` from the wav's length, or
        None when the wav cannot be read -- :func:`check_utterance` then says why), and utterance id ->
        reason for those missing a file or with an empty or non-UTF-8 transcript.

    Raises:
        DataDirError: the split directory is missing or holds no utterance at all.
    """
    if not split_dir.is_dir():
        raise DataDirError(f"corpus split not found: {split_dir}")
    utts, bad = [], {}
    stems = sorted({p.with_suffix("") for ext in ("wav", "mp4", "txt") for p in split_dir.glob(f"*/*.{ext}")})
    for stem in stems:
        spk = stem.parent.name
        utt_id = stem.name if stem.name.startswith(spk) else f"{spk}_{stem.name}"
        wav, mp4, txt = (stem.with_suffix(f".{e}") for e in ("wav", "mp4", "txt"))
        missing = [p.name for p in (wav, mp4, txt) if not p.is_file()]
        if missing:
            bad[utt_id] = f"{', '.join(missing)} missing next to {stem}.*"
            continue
        raw = txt.read_bytes()
        try:
            text = " ".join(raw.decode("utf-8").split()).upper()
        except UnicodeDecodeError as e:
            bad[utt_id] = (f"{txt}: transcript is not UTF-8 text (byte 0x{raw[e.start]:02x} at byte "
                           f"{e.start + 1}); convert it to UTF-8")
            continue
        if not text:
            bad[utt_id] = f"{txt}: empty transcript"
            continue
        try:
            num_frames = math.ceil(sf.info(str(wav)).frames / SAMPLES_PER_FRAME)
        except Exception:  # unreadable: check_utterance gives the reason
            num_frames = None
        utts.append(Utterance(utt_id=utt_id, speaker=spk, wav=str(wav.resolve()), video=str(mp4.resolve()),
                              text=text, num_frames=num_frames))
    if not utts and not bad:
        raise DataDirError(f"no utterances (<speaker>/<utt>.wav, .mp4, .txt) under {split_dir}")
    return utts, bad


def check_utterance(utt: Utterance, roi_size: int = 96, max_frame_diff: int = 2,
                    resample_to: Path | None = None) -> tuple[Utterance, str | None]:
    """Check one utterance's files (see the module docstring).

    Args:
        utt: the utterance (``wav``, ``video``, ``text``).
        roi_size: the expected width and height of the video in pixels.
        max_frame_diff: the largest accepted difference between audio (samples / 640) and video frames.
        resample_to: a directory for 16 kHz mono copies of wavs at other rates or with several channels
            (None: such wavs are bad).

    Returns:
        ``(utterance, reason)``: the utterance (``wav`` pointing at the copy when one was written,
        ``num_frames`` set) and None, or the reason it is bad (naming the file).
    """
    wav = Path(utt.wav)
    try:
        info = sf.info(str(wav))
    except Exception as exc:
        return utt, f"{wav}: unreadable wav ({' '.join(str(exc).split())})"
    samples = None
    if info.samplerate != SAMPLE_RATE or info.channels != 1:
        what = f"{wav}: {info.samplerate} Hz, {info.channels} channel(s); 16000 Hz mono expected"
        if resample_to is None:
            return utt, f"{what} (prepare_data --resample-audio writes 16 kHz mono copies)"
        try:
            samples = read_audio_track(wav, SAMPLE_RATE).numpy()
        except MediaError as exc:
            return utt, str(exc)
    elif info.subtype in ("FLOAT", "DOUBLE"):
        samples, _ = sf.read(str(wav), dtype="float32")
    if samples is not None and not np.all(np.isfinite(samples)):
        return utt, f"{wav}: NaN or infinite samples"
    num_samples = info.frames if samples is None else len(samples)
    if num_samples == 0:
        return utt, f"{wav}: no audio sample"
    try:
        video = check_video(utt.video)
    except MediaError as exc:
        return utt, str(exc)
    if video.declared_frames and video.decoded_frames < video.declared_frames:
        return utt, (f"{utt.video}: only {video.decoded_frames} of its {video.declared_frames} frames decode "
                     "(truncated?)")
    if abs(video.fps - FPS) > 0.01:
        return utt, f"{utt.video}: {video.fps:g} fps, 25 fps expected"
    if (video.width, video.height) != (roi_size, roi_size):
        return utt, f"{utt.video}: {video.width}x{video.height} pixels, {roi_size}x{roi_size} expected"
    audio_frames = num_samples / SAMPLES_PER_FRAME
    if abs(audio_frames - video.decoded_frames) > max_frame_diff:
        return utt, (f"audio {wav} lasts {num_samples / SAMPLE_RATE:.3f} s ({audio_frames:.1f} frames) but "
                     f"video {utt.video} has {video.decoded_frames} frames "
                     f"({video.decoded_frames / FPS:.3f} s); tolerance {max_frame_diff} frames")
    converted = (info.samplerate, info.channels) != (SAMPLE_RATE, 1)
    if samples is not None and resample_to is not None and converted:
        copy = resample_to / f"{utt.utt_id}.wav"
        write_wav(copy, samples)
        utt.extra["resampled_from"] = f"{wav} ({info.samplerate} Hz, {info.channels} channel(s))"
        utt.wav = str(copy.resolve())
    utt.num_frames = math.ceil(num_samples / SAMPLES_PER_FRAME)
    return utt, None


def _check(args: tuple) -> tuple[Utterance, str | None]:
    """:func:`check_utterance` of one tuple of arguments (for ``ProcessPoolExecutor.map``)."""
    return check_utterance(*args)


def prepare_split(split_dir: Path, out: Path, nj: int = 1, roi_size: int = 96, max_frame_diff: int = 2,
                  resample_audio: bool = False, strict: bool = False, progress: bool = True
                  ) -> dict[str, int]:
    """Scan, check and write one split's data dir (and its ``bad_utts``; see the module docstring).

    Returns:
        ``{"utts": kept, "bad": left out, "resampled": wavs copied at 16 kHz}``.

    Raises:
        DataDirError: the split is missing or empty; with ``strict``, any bad utterance (the count and the
            first one named); every utterance bad.
    """
    utts, bad = scan_split(split_dir)
    resample_to = out / "audio_16k" if resample_audio else None
    if resample_to is not None:
        resample_to.mkdir(parents=True, exist_ok=True)
    jobs = [(u, roi_size, max_frame_diff, resample_to) for u in utts]
    desc = f"check {split_dir.name}"
    if nj > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(nj) as pool:
            checked = list(tqdm(pool.map(_check, jobs, chunksize=16), total=len(jobs), desc=desc,
                                disable=not progress, mininterval=2.0))
    else:
        checked = [_check(j) for j in tqdm(jobs, desc=desc, disable=not progress, mininterval=2.0)]
    good = [u for u, reason in checked if reason is None]
    bad.update({u.utt_id: reason for u, reason in checked if reason is not None})
    if bad:
        first = sorted(bad)[0]
        if strict:
            raise DataDirError(f"{split_dir}: {len(bad)} bad utterance(s), e.g. '{first}': {bad[first]}")
        if not good:
            raise DataDirError(f"{split_dir}: every utterance is bad, e.g. '{first}': {bad[first]}")
    write_datadir(out, good)
    bad_file = out / "bad_utts"
    if bad:
        write_kaldi_map(bad_file, bad)
        logger.warning("%s: %d bad utterance(s) left out, listed with the reason in %s", out, len(bad),
                       bad_file)
    else:
        bad_file.unlink(missing_ok=True)
    resampled = sum("resampled_from" in u.extra for u in good)
    if resampled:
        logger.info("%s: %d wav(s) resampled to 16 kHz mono into %s", out, resampled, resample_to)
    return {"utts": len(good), "bad": len(bad), "resampled": resampled}
