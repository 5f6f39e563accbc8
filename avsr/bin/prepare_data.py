"""Make Kaldi-style data dirs from a corpus in AV-HuBERT's preprocessed layout, checking every utterance.

The corpus layout is ``<corpus>/<split>/<speaker>/<utt>.{wav,mp4,txt}`` (16 kHz mono wav, 96x96 25 fps
mouth-ROI mp4, one-line transcript), as written by SynthGRID and by the ROI preprocessing of real videos.
For every split a data dir ``<out>/<split>`` gets ``wav.scp``, ``video.scp``, ``text``, ``utt2spk``,
``spk2utt`` and ``utt2num_frames``; utterance ids are ``<speaker>_<utt>`` unless ``<utt>`` already starts
with the speaker id.

Each utterance is checked before it goes in (:func:`avsr.data.corpus_check.check_utterance`, in ``--nj``
processes): its wav, mp4 and txt all exist; the wav is readable, mono and at 16 kHz (``--resample-audio``
writes 16 kHz mono copies of other wavs into ``<out>/<split>/audio_16k/`` instead), with no NaN or infinite
sample; the mp4 decodes to its last frame, at 25 fps and ``--roi-size`` pixels square; audio and video last
the same within ``--max-frame-diff`` 25 fps frames (AV-HuBERT pads or cuts a few frames, more is an error);
the transcript is not empty and is UTF-8 text. A bad utterance is left out and listed with its reason in
``<out>/<split>/bad_utts`` (``<utt-id> <reason>``), and the count is printed; with ``--strict`` any bad
utterance is an error.

Usage: ``python -m avsr.bin.prepare_data --corpus CORPUS --out data --splits train valid test [--nj 2]``
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import tool
from avsr.data.corpus_check import prepare_split

logger = logging.getLogger("avsr.prepare_data")


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
    setup_logging()
    for split in args.splits:
        out = args.out / split
        counts = prepare_split(args.corpus / split, out, args.nj, args.roi_size, args.max_frame_diff,
                               args.resample_audio, args.strict, not args.no_progress)
        logger.info("%s: %d utterances kept, %d bad", out, counts["utts"], counts["bad"])
        print(f"{out}: {counts['utts']} utterances, {counts['bad']} bad"
              + (f" (listed in {out / 'bad_utts'})" if counts["bad"] else ""))


if __name__ == "__main__":
    sys.exit(main())
