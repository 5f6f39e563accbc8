"""Transcribe face videos, mouth-ROI videos or audio files: ``<file>\\t<TRANSCRIPT>`` per input.

Each input file (a folder means every video in it, recursively) is one utterance of
:meth:`avsr.inference.Transcriber.transcribe_batch`, the path the recipe's decoding stage takes too: a raw
face video goes through the ROI stage (96x96 gray 25 fps mouth ROI + its 16 kHz audio), a 96x96 video is
taken as a ROI already, an audio file is resampled to 16 kHz; the utterances are decoded batched. With
``--json`` the results are also written as a list of ``{"file", "text", "modality", "duration_s", "noise",
"snr_db", "words", ...}``; ``words`` holds ``{"word", "start", "end", "score"}`` (seconds) from CTC forced
alignment of the hypothesis (:mod:`avsr.decode.align`) when the model has a CTC head, else null
(``words_note`` says why).

The model: ``--checkpoint`` is an experiment directory (its best ``--average-nbest`` epoch checkpoints are
averaged; the tokenizer is its ``bpe.model``), an avsr checkpoint file (tokenizer: ``--bpemodel`` or the
``bpe.model`` beside it) or an official fine-tuned AV-HuBERT checkpoint with its sentencepiece model as
``--bpemodel`` (see :mod:`avsr.compat`).

A file that cannot be transcribed (no face when the video is needed, no audio track when the audio is,
unreadable) is reported by name with the reason, and the others are still transcribed (and written to the
JSON, with an ``error`` row for each failed one); the exit status is then 1. The reasons are the
Transcriber's, with its arguments named as this tool's options (``modality='audio'`` as ``--modality audio``).

Usage: ``avsr transcribe talk.mp4 clips/ --checkpoint exp/avsr_x [--modality audiovisual] [--json out.json]
[--snr-db 0 --noise babble.wav] [--beam-size 10] [--decode-config default] [--device cuda]``
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from avsr.bin.runner import tool
from avsr.fileio import write_text_atomic
from avsr.inference import (
    DEFAULT_SEGMENT_S,
    InferenceError,
    TranscribeItem,
    Transcriber,
    Transcript,
    collect_media,
    inference_device,
    parse_edge_frames,
)
from avsr.inference.segments import MIN_SEGMENT_S
from avsr.modalities import MODALITY_INPUTS
from avsr.nn.precision import PRECISIONS
from avsr.threads import parse_threads

logger = logging.getLogger("avsr.transcribe")

def cli_message(message: str) -> str:
    """An error of :mod:`avsr.inference` with its arguments named as this tool's options
    (``modality='audio'`` -> ``--modality audio``)."""
    return re.sub(r"\bmodality='(\w+)'", r"--modality \1", message)


def _parser() -> argparse.ArgumentParser:
    """The command line of the tool (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="avsr transcribe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("inputs", nargs="+", type=Path, help="video or audio files, or folders of videos")
    p.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="experiment dir (checkpoint averaging), avsr checkpoint or official AV-HuBERT checkpoint",
    )
    p.add_argument(
        "--bpemodel", type=Path, default=None, help="sentencepiece model (default: beside the model)"
    )
    p.add_argument("--modality", default="audiovisual", choices=list(MODALITY_INPUTS))
    p.add_argument("--decode-config", default=None,
                   help="decoding YAML, a path or a shipped name (default: the model's own defaults)")
    p.add_argument("--beam-size", type=int, default=None, help="override the beam size")
    p.add_argument("--average-nbest", type=int, default=5, help="checkpoints averaged from an experiment dir")
    p.add_argument("--noise", type=Path, default=None, help="noise wav mixed into the audio (with --snr-db)")
    p.add_argument("--snr-db", type=float, default=None, help="SNR of the added noise in dB")
    p.add_argument("--json", type=Path, default=None, help="write transcripts and word timings here")
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="keep the ROI mp4 and wav of every raw face video here (default: a temporary folder)",
    )
    p.add_argument("--max-segment-s", default="auto",
                   help="cut longer inputs at pauses into pieces of at most this many seconds, decode them "
                   "batched and join them; 'auto': the model's longest training utterance if the checkpoint "
                   f"records it, else {DEFAULT_SEGMENT_S:g} s; 0: never cut (a warning for inputs longer "
                   "than the training range)")
    p.add_argument("--edge-frames", default="model",
                   help="silent 40 ms frames before and after each input's speech: 'model' (the middle half "
                   "of the model's training audio's, when its checkpoint records them), 'off', or START,END, "
                   "each a count or a range LO-HI")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                   help="encoder precision (default fp32: the same WER on every machine; auto: bf16 "
                        "where the device computes it natively)")
    p.add_argument("--num-threads", type=parse_threads, default=1,
                   help="CPU threads, or 'auto': the cores other work leaves free (avsr.threads)")
    return p


def _segment_s(p: argparse.ArgumentParser, text: str) -> float | str | None:
    """The Transcriber's ``max_segment_s`` of ``--max-segment-s``: ``"model"`` for 'auto', None for 0 or
    less (never cut), else the seconds; a usage error for anything else."""
    if text == "auto":
        return "model"
    try:
        seconds = float(text)
    except ValueError:
        p.error(f"--max-segment-s must be a number of seconds or 'auto', got {text!r}")
    if 0 < seconds < MIN_SEGMENT_S:
        p.error(f"--max-segment-s must be at least {MIN_SEGMENT_S} s (or 0: never cut), got {text!r}")
    return seconds if seconds > 0 else None


def _rows(files: list[Path], results: list[Transcript], bad: dict[Path, str], args: argparse.Namespace
          ) -> list[dict[str, Any]]:
    """Print ``<file>\\t<TRANSCRIPT>`` per transcribed file (errors to stderr); the JSON rows of all."""
    rows: list[dict[str, Any]] = [{"file": str(path), "error": reason} for path, reason in bad.items()]
    for src, result in zip(files, results):
        if not result.ok:
            error = cli_message(result.error)
            print(f"avsr-transcribe: error: {error}", file=sys.stderr)
            rows.append({"file": str(src), "error": error})
            continue
        print(f"{src}\t{result.text}", flush=True)
        row = {"file": str(src), **result.to_dict(), "noise": str(args.noise) if args.noise else None,
               "snr_db": args.snr_db}
        row.pop("key")
        rows.append(row)
    return rows


@tool("avsr-transcribe")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring). Returns the exit status."""
    p = _parser()
    args = p.parse_args(argv)
    try:
        edge_frames = parse_edge_frames(args.edge_frames)
    except ValueError as exc:
        p.error(f"--edge-frames: {exc}")
    if (args.noise is None) != (args.snr_db is None):
        p.error("--noise and --snr-db go together")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    device = inference_device(args.device, args.num_threads, source="--num-threads")
    files, bad = collect_media(args.inputs)
    for reason in bad.values():
        print(f"avsr-transcribe: error: {reason}", file=sys.stderr)
    if not files:
        raise InferenceError("nothing to transcribe: " + "; ".join(bad.values()))
    segment_s = _segment_s(p, args.max_segment_s)
    overrides = {"beam_size": args.beam_size} if args.beam_size is not None else None
    transcriber = Transcriber.from_pretrained(
        args.checkpoint, bpemodel=args.bpemodel, device=device, decode_config=args.decode_config,
        average_nbest=args.average_nbest, precision=args.precision, max_segment_s=segment_s,
        edge_frames=edge_frames, decode_overrides=overrides)
    items = [TranscribeItem(video=f, audio=f, key=f.stem) for f in files]
    results = transcriber.transcribe_batch(items, modality=args.modality, noise=args.noise,
                                           snr_db=args.snr_db, work_dir=args.work_dir)
    rows = _rows(files, results, bad, args)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.json, json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
    return 1 if bad or any(not r.ok for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
