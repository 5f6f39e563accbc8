#!/usr/bin/env python3
"""Stage 1 of the LRS3 recipe (noise part): one long noise recording per noise type, for training and test.

AV-HuBERT's noisy conditions (``avhubert/preparation/musan_prepare.py``, ``lrs3_noise.py``,
``noise_manifest.py``; Shi et al., "Robust Self-Supervised Audio-Visual Speech Recognition", 2022) use
four noise types: MUSAN ``babble`` (each clip the mean of 30 MUSAN speech recordings), ``music`` and
``noise`` (natural noise), and LRS3 ``speech`` (the first 20 s of training utterances of at least 20 s).
MUSAN files are split 80/10/10 into train/valid/test (music and noise after a random shuffle), the LRS3
speech clips 60/20/20; training uses all four types, each test condition one type at an SNR.

Here every type becomes two 16 kHz mono wavs cut from disjoint source files, the form
:class:`avsr.data.noise.NoiseSource` reads (a segment per utterance, chosen from its id at test time):
``<out>/<type>_test.wav`` (the 10 % test share) and ``<type>_train.wav`` (the 80 % training share), each
at most ``--seconds`` long, every source clip scaled to -26 dBFS RMS (peak below 0 dBFS); and
``all_train.wav``, the training parts of all types one after the other (the training noise of AV-HuBERT's
noisy fine-tuning).

Sources: ``--musan DIR`` in MUSAN's layout, ``<DIR>/{babble,music,noise}/**/*.wav`` (any rate, resampled;
without ``babble/`` but with ``speech/``, babble is mixed from ``speech/`` as ``musan_prepare.py`` does), and
``--speech-list`` (written by ``local/prepare_lrs3.py``): LRS3 training utterances for ``speech``.
``<out>/noise.json`` records what was used; a run with the same options and outputs present does nothing.

Usage: ``local/prepare_noise.py --out corpus/noise [--musan /data/musan] [--speech-list
corpus/local/speech_noise.list] [--seconds 600] [--speech-min-seconds 20] [--seed 0]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
from pathlib import Path

import av
import torch

from avsr.data.media import MediaError, read_audio_track, write_wav

logger = logging.getLogger("prepare_noise")

SAMPLE_RATE = 16000
MUSAN_TYPES = ("babble", "music", "noise")
LEVEL_RMS = 10 ** (-26 / 20)
#: MUSAN speech recordings averaged into one babble clip (``musan_prepare.py``: ``num_per_mixture``)
BABBLE_TALKERS = 30


def normalise(wav: torch.Tensor) -> torch.Tensor:
    """``wav`` (N,) scaled to -26 dBFS RMS, less if its peak would pass 0.99; silence stays silence."""
    rms = float(wav.pow(2).mean().sqrt()) if wav.numel() else 0.0
    if rms == 0.0:
        return wav
    gain = min(LEVEL_RMS / rms, 0.99 / float(wav.abs().max()))
    return wav * gain


def split_files(files: list[Path], seed: int) -> tuple[list[Path], list[Path]]:
    """(train, test) shares of ``files`` after a seeded shuffle: the first 10 % (at least one) test, the
    next 10 % validation (unused here), the rest train; with a single file both shares use it."""
    files = sorted(files)
    random.Random(seed).shuffle(files)
    if len(files) == 1:
        logger.warning("only one file (%s): train and test noise share it", files[0])
        return files, files
    n_test = max(1, len(files) // 10)
    n_valid = len(files) // 10 if len(files) - n_test - len(files) // 10 >= 1 else 0
    return files[n_test + n_valid :], files[:n_test]


def concat_clips(clips, seconds: float) -> tuple[torch.Tensor, int]:
    """Normalised clips (an iterable of (N,) tensors) one after the other up to ``seconds``; returns the wav
    and the number of clips used."""
    limit = int(seconds * SAMPLE_RATE)
    parts, total, used = [], 0, 0
    for clip in clips:
        if total >= limit:
            break
        clip = normalise(clip)[: limit - total]
        parts.append(clip)
        total += clip.numel()
        used += 1
    return (torch.cat(parts) if parts else torch.zeros(0)), used


def _read_all(files: list[Path]):
    for f in files:
        yield read_audio_track(f, SAMPLE_RATE)


def babble_clips(speech_files: list[Path], seed: int, talkers: int = BABBLE_TALKERS):
    """Endless babble: each clip the mean of ``talkers`` random speech recordings cut to the shortest."""
    rng = random.Random(seed)
    if len(speech_files) < talkers:
        logger.warning("babble from %d speech files (fewer than %d talkers)", len(speech_files), talkers)
    while True:
        chosen = rng.sample(speech_files, min(talkers, len(speech_files)))
        wavs = [read_audio_track(f, SAMPLE_RATE) for f in chosen]
        n = min(w.numel() for w in wavs)
        yield torch.stack([w[:n] for w in wavs]).mean(0)


def musan_sources(musan: Path, seed: int) -> dict[str, tuple]:
    """Per MUSAN type found: (train clips iterator factory, test clips iterator factory, description)."""
    out = {}
    for kind in MUSAN_TYPES:
        files = sorted((musan / kind).rglob("*.wav")) if (musan / kind).is_dir() else []
        if files:
            train, test = split_files(files, seed)
            out[kind] = (
                lambda f=train: _read_all(f),
                lambda f=test: _read_all(f),
                f"{len(train)} train / {len(test)} test files of {musan / kind}",
            )
        elif kind == "babble" and (musan / "speech").is_dir():
            speech = sorted((musan / "speech").rglob("*.wav"))
            if speech:
                train, test = split_files(speech, seed)
                out[kind] = (
                    lambda f=train: babble_clips(f, seed),
                    lambda f=test: babble_clips(f, seed + 1),
                    f"mixes of {BABBLE_TALKERS} of {len(train)} train / {len(test)} test files of "
                    f"{musan / 'speech'}",
                )
    return out


def _duration(path: Path) -> float:
    with av.open(str(path)) as container:
        return float(container.duration or 0) / 1e6


def speech_clips(list_file: Path, min_seconds: float):
    """LRS3 speech noise: the first ``min_seconds`` of every listed utterance lasting at least that long."""
    for lineno, line in enumerate(list_file.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if len(fields) != 4:
            raise ValueError(
                f"{list_file}:{lineno}: expected '<src> <start> <end> <duration|?>', got {line!r}"
            )
        src, start, end = Path(fields[0]), float(fields[1]), float(fields[2])
        try:
            duration = float(fields[3]) if fields[3] != "?" else _duration(src) - start
            if duration < min_seconds or (end >= 0 and end - start < min_seconds):
                continue
            wav = read_audio_track(src, SAMPLE_RATE)
        except (MediaError, av.error.FFmpegError) as exc:
            logger.warning("speech noise: skipping %s (%s)", src, exc)
            continue
        clip = wav[int(start * SAMPLE_RATE) : int((start + min_seconds) * SAMPLE_RATE)]
        if clip.numel() >= int(min_seconds * SAMPLE_RATE):
            yield clip


def split_stream(clips):
    """Deal a clip stream into (train, test) lists lazily: clip ``i`` goes to test when ``i % 4 == 3``
    (60/20 train/test as ``lrs3_noise.py``, its 20 % validation share dropped)."""
    train, test = [], []
    for i, clip in enumerate(clips):
        (test if i % 4 == 3 else train).append(clip)
        yield train, test


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see the module docstring). Returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="noise directory (e.g. corpus/noise)")
    p.add_argument("--musan", type=Path, default=None, help="MUSAN-layout directory: {babble,music,noise}/")
    p.add_argument("--speech-list", type=Path, default=None, help="LRS3 speech-noise candidates")
    p.add_argument("--seconds", type=float, default=600.0, help="length of each noise file (s)")
    p.add_argument(
        "--speech-min-seconds",
        type=float,
        default=20.0,
        help="LRS3 speech noise: utterances at least this long, their first so many seconds",
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.musan is not None and not args.musan.is_dir():
        print(f"prepare_noise: error: --musan directory not found: {args.musan}", file=sys.stderr)
        return 1
    options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    record = args.out / "noise.json"
    if record.is_file():
        done = json.loads(record.read_text())
        if done.get("options") == options and all((args.out / f).is_file() for f in done.get("files", [])):
            logger.info("noise already prepared in %s", args.out)
            return 0
    args.out.mkdir(parents=True, exist_ok=True)
    written: dict[str, dict] = {}
    train_parts = []
    sources = musan_sources(args.musan, args.seed) if args.musan is not None else {}
    for kind, (train_clips, test_clips, desc) in sources.items():
        test, n_test = concat_clips(test_clips(), args.seconds)
        train, n_train = concat_clips(train_clips(), args.seconds)
        written[kind] = {"source": desc, "test_clips": n_test, "train_clips": n_train}
        for name, wav in ((f"{kind}_test.wav", test), (f"{kind}_train.wav", train)):
            write_wav(args.out / name, wav)
        train_parts.append(train)
    if args.speech_list is not None:
        if not args.speech_list.is_file():
            print(f"prepare_noise: error: --speech-list not found: {args.speech_list}", file=sys.stderr)
            return 1
        limit = int(args.seconds * SAMPLE_RATE)
        train, test = [], []
        for train, test in split_stream(speech_clips(args.speech_list, args.speech_min_seconds)):
            if sum(c.numel() for c in test) >= limit and sum(c.numel() for c in train) >= limit:
                break
        if not test:
            logger.warning(
                "no LRS3 utterance of %g s or more in %s: no speech noise",
                args.speech_min_seconds,
                args.speech_list,
            )
        else:
            test_wav, n_test = concat_clips(test, args.seconds)
            train_wav, n_train = concat_clips(train or test, args.seconds)
            write_wav(args.out / "speech_test.wav", test_wav)
            write_wav(args.out / "speech_train.wav", train_wav)
            train_parts.append(train_wav)
            written["speech"] = {
                "source": f"LRS3 utterances of {args.speech_list}",
                "test_clips": n_test,
                "train_clips": n_train,
            }
    files = [f"{k}_{s}.wav" for k in written for s in ("train", "test")]
    if written:
        write_wav(args.out / "all_train.wav", torch.cat(train_parts))
        files.append("all_train.wav")
    else:
        logger.warning(
            "no noise found (give --musan with babble/, music/, noise/ or speech/, or a --speech-list "
            "with utterances of %g s or more): only clean conditions",
            args.speech_min_seconds,
        )
    for kind, info in written.items():
        logger.info(
            "%s: %s (%d test clips, %d train clips)",
            kind,
            info["source"],
            info["test_clips"],
            info["train_clips"],
        )
    tmp = record.with_name(".noise.json.tmp")
    tmp.write_text(json.dumps({"options": options, "types": written, "files": files}, indent=2) + "\n")
    os.replace(tmp, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
