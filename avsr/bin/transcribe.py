"""Transcribe audio files, face videos and mouth-ROI videos: one line "FILE<tab>TRANSCRIPT" per input.

Each FILE is one utterance (a folder: every video in it, recursively), decoded in the modality of what it
has: an audio file from its audio, a video with sound audio-visually, a silent video (such as a corpus's
mouth-ROI mp4) from the lips alone. --modality decodes every input in one modality instead. --audio WAV
gives a silent video its sound: with --audio each FILE must be a file, and the n-th --audio goes with the
n-th FILE (avsr transcribe a.mp4 b.mp4 --audio a.wav --audio b.wav).

A raw face video goes through the mouth-ROI stage (96x96 gray mouth crops at 25 fps and its 16 kHz audio,
as the recipe's preprocessing; needs the [video] extra), a 96x96 video is taken as a ROI already, audio is
resampled to 16 kHz; the utterances are decoded batched, by the same Transcriber as in Python and as the
recipe's decoding stage. A video with sound whose video cannot be used (no face, unreadable) is decoded from
its audio alone, with a warning.

The model: the one shipped with the package unless --checkpoint names another: an experiment directory (its
best --average-nbest epoch checkpoints averaged, its bpe.model), an avsr checkpoint (the bpe.model beside it
or --bpemodel), or an official fine-tuned AV-HuBERT checkpoint with its sentencepiece model as --bpemodel.

--json also writes the results as a list of {"file", "text", "modality", "duration_s", "noise", "snr_db",
"words", ...}; "words" holds {"word", "start", "end", "score"} (seconds) from a CTC forced alignment when the
model has a CTC head. A file that cannot be transcribed gets one line "avsr-transcribe: error: ..." naming
it and an "error" row in the JSON; the others are still transcribed, and the exit status is 1.

examples:
  avsr transcribe talk.wav talk.mp4 clips/
  avsr transcribe roi.mp4 --audio roi.wav --json words.json
  avsr transcribe talk.mp4 --checkpoint exp/avsr_x --modality video --noise babble.wav --snr-db 0
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from avsr.bin import setup_logging
from avsr.bin.runner import HelpFormatter, tool
from avsr.modalities import MODALITY_INPUTS
from avsr.pretrained import DEFAULT_MODEL
from avsr.threads import parse_threads

# Only what the command line needs is imported above: the inference library (and torch) is imported in
# main(), after the arguments are parsed, so that --help and usage errors answer at once.

logger = logging.getLogger("avsr.transcribe")

#: --precision's choices and the longest piece of --max-segment-s auto without a recorded training range,
#: written out so that --help needs no torch (tests/test_transcribe.py holds them to
#: avsr.nn.precision.PRECISIONS and avsr.inference.segments.DEFAULT_SEGMENT_S).
PRECISIONS = ("auto", "fp32", "bf16")
DEFAULT_SEGMENT_S = 15.0

def cli_message(message: str) -> str:
    """An error or warning of :mod:`avsr.inference` with its arguments named as this tool's options
    (``modality='audio'`` -> ``--modality audio``, ``max_segment_s`` -> ``--max-segment-s``)."""
    message = re.sub(r"\bmodality='(\w+)'", r"--modality \1", message)
    return re.sub(r"\b(max_segment_s|edge_frames)\b", lambda m: "--" + m.group(1).replace("_", "-"), message)


def _parser() -> argparse.ArgumentParser:
    """The command line of the tool (see the module docstring)."""
    p = argparse.ArgumentParser(prog="avsr transcribe", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("inputs", nargs="+", type=Path, metavar="FILE",
                   help="audio or video files, or folders of videos")
    p.add_argument("--audio", action="append", type=Path, default=None, metavar="WAV",
                   help="the audio of a silent video FILE (e.g. a mouth-ROI mp4 and its wav); give it once "
                   "per FILE, in the order of the FILEs")
    p.add_argument("--checkpoint", default=DEFAULT_MODEL, metavar="MODEL",
                   help="the name of a model shipped with avsr, an experiment dir (checkpoint averaging), an "
                   "avsr checkpoint or an official AV-HuBERT checkpoint")
    p.add_argument("--bpemodel", type=Path, default=None, metavar="SPM.model",
                   help="sentencepiece model (default: beside the model)")
    p.add_argument("--modality", default=None, choices=list(MODALITY_INPUTS),
                   help="decode every input in this modality (default: what each input has: audio for an "
                   "audio file, audiovisual for a video with sound or a FILE with --audio, video for a "
                   "silent video)")
    p.add_argument("--decode-config", default=None,
                   help="decoding YAML, a path or a shipped name (default: the model's own defaults)")
    p.add_argument("--beam-size", type=int, default=None, help="override the beam size")
    p.add_argument("--average-nbest", type=int, default=5, help="checkpoints averaged from an experiment dir")
    p.add_argument("--noise", type=Path, default=None, metavar="WAV",
                   help="noise wav mixed into the audio (with --snr-db)")
    p.add_argument("--snr-db", type=float, default=None, help="SNR of the added noise in dB (with --noise)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT.json",
                   help="write transcripts and word timings here")
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
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the model runs")
    p.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                   help="encoder precision (default fp32: the same WER on every machine; auto: bf16 "
                        "where the device computes it natively)")
    p.add_argument("--num-threads", type=parse_threads, default=1,
                   help="CPU threads, or 'auto': the cores other work leaves free (avsr.threads)")
    return p


def _segment_s(p: argparse.ArgumentParser, text: str) -> float | str | None:
    """The Transcriber's ``max_segment_s`` of ``--max-segment-s``: ``"model"`` for 'auto', None for 0 or
    less (never cut), else the seconds; a usage error for anything else."""
    from avsr.inference.segments import MIN_SEGMENT_S

    if text == "auto":
        return "model"
    try:
        seconds = float(text)
    except ValueError:
        p.error(f"--max-segment-s must be a number of seconds or 'auto', got {text!r}")
    if 0 < seconds < MIN_SEGMENT_S:
        p.error(f"--max-segment-s must be at least {MIN_SEGMENT_S} s (or 0: never cut), got {text!r}")
    return seconds if seconds > 0 else None


def _inputs(p: argparse.ArgumentParser, args: argparse.Namespace
            ) -> tuple[list[tuple[Path, Path | None]], dict[Path, str]]:
    """The (FILE, its --audio or None) pairs to transcribe, and the inputs that give none (no such file or
    folder, a folder without video) with the reason; a usage error for --audio given other than once per
    FILE or with a folder."""
    from avsr.inference import collect_media

    if args.audio is None:
        files, bad = collect_media(args.inputs)
        return [(f, None) for f in files], bad
    if len(args.audio) != len(args.inputs):
        p.error(f"--audio goes with each FILE in turn: {len(args.inputs)} FILE(s) but {len(args.audio)} "
                "--audio")
    folders = [str(f) for f in args.inputs if f.is_dir()]
    if folders:
        p.error(f"--audio goes with files, not folders: {', '.join(folders)}")
    _, bad = collect_media(args.inputs)
    return [(f, a) for f, a in zip(args.inputs, args.audio) if f not in bad], bad


def _message(message: str, *files: Path | None) -> str:
    """A message of the library with the options named as this tool's (:func:`cli_message`), and the first
    of ``files`` in parentheses unless it names one of them."""
    message = cli_message(message)
    named = [str(f) for f in files if f is not None]
    if named and not any(name in message for name in named):
        message = f"{message} ({named[0]})"
    return message


def _notes(result: Any, src: Path, audio: Path | None) -> list[str]:
    """The warnings of a transcript, one line each: decoded from its audio alone, a video-only input that
    keeps its edges, the Transcriber's ``info["warning"]``."""
    info, notes = result.info, []
    if "video_fallback" in info:
        notes.append(_message("its video could not be used, transcribed from its audio alone: "
                              f"{info['video_fallback']}", src, audio))
    if str(info.get("edges_note", "")).startswith("no audio"):
        notes.append(_message("a silent video keeps its silent edges (no audio to find the speech in): give "
                              "its audio with --audio WAV to decode it as the recipe does", src))
    if info.get("warning"):
        notes.append(_message(info["warning"], src, audio))
    return [f"avsr-transcribe: warning: {note}" for note in notes]


def _rows(inputs: list[tuple[Path, Path | None]], results: list[Any], bad: dict[Path, str],
          args: argparse.Namespace) -> list[dict[str, Any]]:
    """Print ``<file>\\t<TRANSCRIPT>`` per transcribed file, and one line per error or warning to stderr;
    the JSON rows of all."""
    rows: list[dict[str, Any]] = [{"file": str(path), "error": reason} for path, reason in bad.items()]
    for (src, audio), result in zip(inputs, results):
        paired = {"audio": str(audio)} if audio is not None else {}
        if not result.ok:
            error = _message(result.error, src, audio)
            print(f"avsr-transcribe: error: {error}", file=sys.stderr)
            rows.append({"file": str(src), **paired, "error": error})
            continue
        print(f"{src}\t{result.text}", flush=True)
        for line in _notes(result, src, audio):
            print(line, file=sys.stderr)
        row = {"file": str(src), **paired, **result.to_dict(),
               "noise": str(args.noise) if args.noise else None, "snr_db": args.snr_db}
        row.pop("key")
        rows.append(row)
    return rows


@tool("avsr-transcribe")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring). Returns the exit status: 0, or 1 when an input
    could not be transcribed (each reported in one line on stderr).

    Raises:
        SystemExit: usage errors (argparse's exit status 2).
        avsr.inference.InferenceError, OSError, avsr.compat.CheckpointError: no model, a bad model or
            decoding configuration (reported in one line by :func:`avsr.bin.runner.tool`).
    """
    p = _parser()
    args = p.parse_args(argv)
    if (args.noise is None) != (args.snr_db is None):
        p.error("--noise and --snr-db go together")
    from avsr.fileio import write_text_atomic
    from avsr.inference import TranscribeItem, Transcriber, inference_device, parse_edge_frames

    try:
        edge_frames = parse_edge_frames(args.edge_frames)
    except ValueError as exc:
        p.error(f"--edge-frames: {exc}")
    segment_s = _segment_s(p, args.max_segment_s)
    inputs, bad = _inputs(p, args)
    for reason in bad.values():
        print(f"avsr-transcribe: error: {reason}", file=sys.stderr)
    if not inputs:
        return 1
    setup_logging()
    device = inference_device(args.device, args.num_threads, source="--num-threads")
    overrides = {"beam_size": args.beam_size} if args.beam_size is not None else None
    transcriber = Transcriber.from_pretrained(
        args.checkpoint, bpemodel=args.bpemodel, device=device, decode_config=args.decode_config,
        average_nbest=args.average_nbest, precision=args.precision, max_segment_s=segment_s,
        edge_frames=edge_frames, decode_overrides=overrides)
    # a bare path: decoded in the modality of what the file has (Transcriber.transcribe_batch)
    items = [src if audio is None else TranscribeItem(video=src, audio=audio, key=src.stem)
             for src, audio in inputs]
    results = transcriber.transcribe_batch(items, modality=args.modality, noise=args.noise,
                                           snr_db=args.snr_db, work_dir=args.work_dir, report=False)
    rows = _rows(inputs, results, bad, args)
    failed = len(bad) + sum(not r.ok for r in results)
    if failed and len(rows) > 1:
        print(f"avsr-transcribe: {failed} of {len(rows)} inputs could not be transcribed", file=sys.stderr)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.json, json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
