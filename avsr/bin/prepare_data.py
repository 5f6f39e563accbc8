"""Make Kaldi-style data dirs from a corpus in AV-HuBERT's preprocessed layout, checking every utterance.

The corpus layout is ``<corpus>/<split>/<speaker>/<utt>.{wav,mp4,txt}`` (16 kHz mono wav, 96x96 25 fps
mouth-ROI mp4, one-line transcript), as written by SynthGRID and by the ROI preprocessing of real videos.
For every split a data dir ``<out>/<split>`` gets ``wav.scp``, ``video.scp``, ``text``, ``utt2spk``,
``spk2utt`` and ``utt2num_frames``; utterance ids are ``<speaker>_<utt>`` unless ``<utt>`` already starts
with the speaker id.

Each utterance is checked before it goes in (:func:`check_utterance`, in ``--nj`` processes): its wav, mp4
and txt all exist; the wav is readable, mono and at 16 kHz (``--resample-audio`` writes 16 kHz mono copies
of other wavs into ``<out>/<split>/audio_16k/`` instead), with no NaN or infinite sample; the mp4 decodes
to its last frame, at 25 fps and ``--roi-size`` pixels square; audio and video last the same within
``--max-frame-diff`` 25 fps frames (AV-HuBERT pads or cuts a few frames, more is an error); the transcript is
not empty and is UTF-8 text. A bad utterance is left out and listed with its reason in
``<out>/<split>/bad_utts`` (``<utt-id> <reason>``), and the count is printed; with ``--strict`` any bad
utterance is an error.

Usage: ``python -m avsr.bin.prepare_data --corpus CORPUS --out data --splits train valid test [--nj 2]``
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import soundfile as sf
from tqdm import tqdm

from avsr.bin.runner import tool
from avsr.data.datadir import DataDirError, Utterance, write_datadir, write_kaldi_map
from avsr.data.media import MediaError, check_video, read_audio_track, write_wav
from avsr.features import SAMPLES_PER_FRAME

logger = logging.getLogger("avsr.prepare_data")

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


@tool("avsr-prepare-data")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, type=Path, help="corpus root (<split>/<speaker>/<utt>.*)")
    p.add_argument("--out", required=True, type=Path, help="output root of the data dirs")
    p.add_argument("--splits", nargs="+", default=["train", "valid", "test"])
    p.add_argument("--nj", type=int, default=os.cpu_count() or 1, help="processes checking utterances")
    p.add_argument("--roi-size", type=int, default=96, help="expected video width and height in pixels")
    p.add_argument("--max-frame-diff", type=int, default=2,
                   help="largest audio/video length difference in 25 fps frames")
    p.add_argument("--resample-audio", action="store_true",
                   help="write 16 kHz mono copies of wavs at other rates instead of leaving them out")
    p.add_argument("--strict", action="store_true", help="any bad utterance is an error")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for split in args.splits:
        out = args.out / split
        counts = prepare_split(args.corpus / split, out, args.nj, args.roi_size, args.max_frame_diff,
                               args.resample_audio, args.strict, not args.no_progress)
        logger.info("%s: %d utterances kept, %d bad", out, counts["utts"], counts["bad"])
        print(f"{out}: {counts['utts']} utterances, {counts['bad']} bad"
              + (f" (listed in {out / 'bad_utts'})" if counts["bad"] else ""))


if __name__ == "__main__":
    sys.exit(main())
