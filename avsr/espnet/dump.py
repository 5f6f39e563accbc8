"""Dump a data dir as ESPnet training input: one packed ``.npy`` per utterance and a ``feats.scp``.

Usage::

    python -m avsr.espnet.dump --data data/test --out dump/test/clean
    python -m avsr.espnet.dump --data data/test --out dump/test/babble_0 --noise babble_test.wav --snr-db 0
    python -m avsr.espnet.dump --data data/train --out dump/train --noise babble_train.wav \\
        --noise-prob 0.3 --snr-db -5 0 5 10 20 --nj 2

For every utterance of ``--data`` (Kaldi style: ``wav.scp``, ``video.scp``, ``text``, ``utt2spk``) it reads
the 16 kHz wav and the 96x96 25 fps mouth ROI video, computes AV-HuBERT's audio features (after adding
noise, if asked) and writes ``OUT/data/<utt-id>.npy``: ``(T, 104 + S * S)`` packed frames
(:mod:`avsr.espnet.layout`; float16 by default, exact for the pixels). ``OUT`` also gets ``feats.scp``
(``<utt-id> <absolute .npy path>``, ESPnet's ``npy`` data type: ``--train_data_path_and_name_and_type
OUT/feats.scp,speech,npy``), ``text``, ``utt2spk``, ``spk2utt``, ``utt2num_frames`` and ``feats_dim``.

Noise: with ``--noise-prob 1`` (the default when ``--noise`` is given) every utterance gets noise, the segment
and the SNR (one of ``--snr-db``) a function of the utterance id -- the same noisy audio as the test
conditions of ``python -m avsr.bin.decode``. With ``--noise-prob p < 1`` (training data) each utterance gets
noise with probability ``p``, drawn once from ``--seed`` and the id: a static augmentation, unlike avsr's
trainer, which draws anew every epoch (ESPnet reads fixed features).

Existing ``.npy`` files are kept (an interrupted dump resumes). Exit status 1 with a message naming the
utterance or file on bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from avsr.data.datadir import DataDirError, read_datadir, write_kaldi_map
from avsr.data.media import MediaError, read_video, read_wav
from avsr.data.noise import NoiseSource, stable_seed
from avsr.espnet.layout import pack_frames
from avsr.features import SAMPLES_PER_FRAME, avhubert_audio_features
from avsr.fileio import atomic_path

__all__ = ["dump_utterance", "dump_datadir", "main"]


def dump_utterance(
    utt_id: str,
    wav_path: str,
    video_path: str,
    out_path: str | os.PathLike,
    noise: NoiseSource | None = None,
    snr_db: Sequence[float] = (0.0,),
    noise_prob: float = 1.0,
    seed: int = 0,
    dtype: str = "float16",
    max_frame_diff: int = 2,
) -> int:
    """Write one utterance's packed frames to ``out_path`` (``.npy``); returns its number of frames T.

    Args:
        utt_id: the utterance id (fixes the noise draw).
        wav_path: 16 kHz mono wav.
        video_path: 25 fps grayscale square ROI video (e.g. 96x96 mp4).
        out_path: the ``.npy`` file to write (atomically).
        noise: babble or other noise to add to the audio, or None.
        snr_db: SNRs in dB; the one used is a function of ``utt_id``.
        noise_prob: probability (drawn from ``seed`` and ``utt_id``) that the utterance gets noise; 1: always.
        seed: seed of that draw.
        dtype: numpy dtype of the file (``float16`` or ``float32``).
        max_frame_diff: accepted difference between audio duration and video length, in frames.

    Raises:
        avsr.data.media.MediaError: a missing or unreadable file.
        ValueError: audio and video durations disagree, or a non-square ROI.
    """
    wav = read_wav(wav_path)
    video = read_video(video_path)
    t = int(video.shape[0])
    if abs(wav.numel() / SAMPLES_PER_FRAME - t) > max_frame_diff:
        raise ValueError(
            f"utterance '{utt_id}': audio {wav_path} lasts {wav.numel() / SAMPLES_PER_FRAME:.1f} "
            f"frames but video {video_path} has {t}"
        )
    if noise is not None:
        g = torch.Generator().manual_seed(stable_seed(seed, utt_id))
        if noise_prob >= 1.0 or float(torch.rand((), generator=g)) < noise_prob:
            snr = snr_db[stable_seed(utt_id) % len(snr_db)]
            wav = noise.mix(wav, snr, key=utt_id)
    audio = avhubert_audio_features(wav, num_video_frames=t)
    packed = pack_frames(audio, video, np.dtype(dtype))
    out_path = Path(out_path)
    with atomic_path(out_path) as tmp, open(tmp, "wb") as f:
        np.save(f, packed)
    return t


def _job(args: tuple) -> tuple[str, int]:
    utt_id, wav, video, out, noise_path, snr_db, prob, seed, dtype = args
    if Path(out).is_file():
        return utt_id, int(np.load(out, mmap_mode="r").shape[0])
    noise = _noise_source(noise_path)
    return utt_id, dump_utterance(utt_id, wav, video, out, noise, snr_db, prob, seed, dtype)


_NOISE_CACHE: dict[str, NoiseSource] = {}


def _noise_source(path: str | None) -> NoiseSource | None:
    """One :class:`NoiseSource` per file and process."""
    if path is None:
        return None
    if path not in _NOISE_CACHE:
        _NOISE_CACHE[path] = NoiseSource(path)
    return _NOISE_CACHE[path]


def dump_datadir(
    data: str | os.PathLike,
    out: str | os.PathLike,
    noise: str | os.PathLike | None = None,
    snr_db: Sequence[float] = (0.0,),
    noise_prob: float = 1.0,
    seed: int = 0,
    dtype: str = "float16",
    nj: int = 1,
) -> Path:
    """Dump every utterance of the data dir ``data`` into ``out`` (see the module docstring).

    Returns:
        The path of ``out/feats.scp``.

    Raises:
        avsr.data.datadir.DataDirError: a malformed data dir, or an utterance without wav or video.
        avsr.data.media.MediaError, ValueError: as :func:`dump_utterance` (the utterance is named).
    """
    utts = read_datadir(data)
    out = Path(out).resolve()
    (out / "data").mkdir(parents=True, exist_ok=True)
    jobs = []
    for u in utts:
        if not u.wav or not u.video:
            raise DataDirError(f"{data}: utterance '{u.utt_id}' needs both wav.scp and video.scp entries")
        jobs.append(
            (
                u.utt_id,
                u.wav,
                u.video,
                str(out / "data" / f"{u.utt_id}.npy"),
                str(noise) if noise is not None else None,
                list(snr_db),
                noise_prob,
                seed,
                dtype,
            )
        )
    if nj > 1:
        with ProcessPoolExecutor(nj) as pool:
            frames = dict(pool.map(_job, jobs, chunksize=16))
    else:
        frames = dict(map(_job, jobs))
    feats_dim = int(np.load(jobs[0][3], mmap_mode="r").shape[1]) if jobs else 0
    write_kaldi_map(out / "feats.scp", {j[0]: j[3] for j in jobs})
    write_kaldi_map(out / "utt2num_frames", {k: str(v) for k, v in frames.items()})
    write_kaldi_map(out / "text", {u.utt_id: u.text or "" for u in utts})
    write_kaldi_map(out / "utt2spk", {u.utt_id: u.speaker or u.utt_id for u in utts})
    spk2utt: dict[str, list[str]] = {}
    for u in utts:
        spk2utt.setdefault(u.speaker or u.utt_id, []).append(u.utt_id)
    write_kaldi_map(out / "spk2utt", {k: " ".join(v) for k, v in spk2utt.items()})
    (out / "feats_dim").write_text(f"{feats_dim}\n", encoding="utf-8")
    return out / "feats.scp"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see the module docstring). Returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, type=Path, help="Kaldi-style data dir with wav.scp and video.scp")
    p.add_argument("--out", required=True, type=Path, help="output dir (feats.scp, data/*.npy, text, ...)")
    p.add_argument("--noise", type=Path, default=None, help="16 kHz noise wav to add to the audio")
    p.add_argument("--snr-db", type=float, nargs="+", default=[0.0], help="SNRs in dB (one per utterance)")
    p.add_argument("--noise-prob", type=float, default=1.0, help="probability that an utterance gets noise")
    p.add_argument("--seed", type=int, default=0, help="seed of the --noise-prob draw")
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    p.add_argument("--nj", type=int, default=1, help="parallel processes")
    args = p.parse_args(argv)
    if not 0.0 <= args.noise_prob <= 1.0:
        p.error(f"--noise-prob must be in [0, 1], got {args.noise_prob}")
    try:
        scp = dump_datadir(
            args.data, args.out, args.noise, args.snr_db, args.noise_prob, args.seed, args.dtype, args.nj
        )
    except (DataDirError, MediaError, ValueError, OSError) as e:
        print(f"avsr.espnet.dump: error: {e}", file=sys.stderr)
        return 1
    print(scp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
