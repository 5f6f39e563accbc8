"""Make Kaldi-style data dirs from a corpus in AV-HuBERT's preprocessed layout.

The corpus layout is ``<corpus>/<split>/<speaker>/<utt>.{wav,mp4,txt}`` (16 kHz mono wav, 96x96 25 fps
mouth-ROI mp4, one-line transcript), as written by SynthGRID and by the ROI preprocessing of real videos.
For every split a data dir ``<out>/<split>`` gets ``wav.scp``, ``video.scp``, ``text``, ``utt2spk``,
``spk2utt`` and ``utt2num_frames``; utterance ids are ``<speaker>_<utt>`` unless ``<utt>`` already starts
with the speaker id.

Usage: ``python -m avsr.bin.prepare_data --corpus CORPUS --out data --splits train valid test``
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

import soundfile as sf

from avsr.bin.runner import tool
from avsr.data.datadir import DataDirError, Utterance, write_datadir
from avsr.features import SAMPLES_PER_FRAME

logger = logging.getLogger("avsr.prepare_data")


def scan_split(split_dir: Path) -> list[Utterance]:
    """The utterances of one split directory of the corpus layout.

    Raises:
        DataDirError: the directory is missing or empty, a wav has no mp4 or txt partner (or the
            reverse), a transcript is empty, or a wav is unreadable; the message names the file.
    """
    if not split_dir.is_dir():
        raise DataDirError(f"corpus split not found: {split_dir}")
    utts = []
    for wav in sorted(split_dir.glob("*/*.wav")):
        spk = wav.parent.name
        mp4, txt = wav.with_suffix(".mp4"), wav.with_suffix(".txt")
        for partner in (mp4, txt):
            if not partner.is_file():
                raise DataDirError(f"{partner} is missing (its wav {wav} exists)")
        text = " ".join(txt.read_text(encoding="utf-8").split()).upper()
        if not text:
            raise DataDirError(f"{txt}: empty transcript")
        try:
            num_samples = sf.info(str(wav)).frames
        except RuntimeError as e:
            raise DataDirError(f"{wav}: unreadable wav ({e})") from e
        utt_id = wav.stem if wav.stem.startswith(spk) else f"{spk}_{wav.stem}"
        utts.append(
            Utterance(
                utt_id=utt_id,
                speaker=spk,
                wav=str(wav.resolve()),
                video=str(mp4.resolve()),
                text=text,
                num_frames=math.ceil(num_samples / SAMPLES_PER_FRAME),
            )
        )
    for mp4 in sorted(split_dir.glob("*/*.mp4")):
        if not mp4.with_suffix(".wav").is_file():
            raise DataDirError(f"{mp4.with_suffix('.wav')} is missing (its video {mp4} exists)")
    if not utts:
        raise DataDirError(f"no utterances (<speaker>/<utt>.wav) under {split_dir}")
    return utts


@tool("avsr-prepare-data")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, type=Path, help="corpus root (<split>/<speaker>/<utt>.*)")
    p.add_argument("--out", required=True, type=Path, help="output root of the data dirs")
    p.add_argument("--splits", nargs="+", default=["train", "valid", "test"])
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for split in args.splits:
        utts = scan_split(args.corpus / split)
        write_datadir(args.out / split, utts)
        hours = sum(u.num_frames for u in utts) / 25 / 3600
        logger.info(
            "%s: %d utterances, %d speakers, %.2f h",
            args.out / split,
            len(utts),
            len({u.speaker for u in utts}),
            hours,
        )


if __name__ == "__main__":
    sys.exit(main())
