"""Generate the SynthGRID corpus (GRID grammar, festival audio, rendered mouth ROI video).

Usage: ``python -m avsr.bin.synthgrid --out corpus/synthgrid [--num-train 1500 --num-valid 100 --num-test 200]
[--num-test-unseen-voice 300] [--train-speakers 24 --valid-speakers 4 --test-speakers 6
--test-unseen-voice-speakers 6 --babble-speakers 4] [--train-voices v1,v2,... --unseen-voices v3,...]
[--no-augment] [--num-train-accented 0 --train-accented-speakers 300] [--seed 0] [--nj 2]
[--babble-seconds 60] [--engines festival,espeak-ng,flite] [--hold-out-engines flite]
[--num-test-espeak-ng 0 --num-test-flite 0 --test-engine-speakers 6]``; ``--list-voices`` prints the voice
catalogue (markdown) and exits. Running it again on the same ``--out`` with the same options completes an
interrupted run; see :mod:`avsr.corpora.synthgrid.generate`.
"""

from __future__ import annotations

import argparse
import sys

from avsr.bin import setup_logging
from avsr.bin.runner import UsageError, tool
from avsr.corpora.synthgrid.engines import ENGINES, EngineError, catalogue_markdown
from avsr.corpora.synthgrid.festival import FestivalError
from avsr.corpora.synthgrid.generate import TRAIN_CORPORA, SynthGridConfig, generate
from avsr.corpora.synthgrid.voices import VOICES

_D = "(default %(default)s)"
#: The numeric fields of SynthGridConfig given on the command line (``--num-train`` for ``num_train``), with
#: their help, in groups: the options between the groups are of other kinds.
_SPLITS = (
    ("num_train", int, f"train utterances {_D}"),
    ("num_valid", int, f"valid utterances {_D}"),
    ("num_test", int, f"test utterances {_D}"),
    ("train_speakers", int, "default %(default)s"),
    ("valid_speakers", int, "default %(default)s"),
    ("test_speakers", int, "default %(default)s"),
    ("num_test_unseen_voice", int,
     f"utterances of test_unseen_voice, spoken by voices in no training utterance {_D}"),
    ("test_unseen_voice_speakers", int, "default %(default)s"),
)
_ACCENTED = (
    ("num_train_accented", int, "english corpus: training utterances added in the accented voices (the "
     f"non-English --train-voices), clean, by speakers of their own {_D}"),
    ("train_accented_speakers", int, f"speakers of those utterances {_D}"),
)
_ENGINE_TESTS = (
    ("num_test_espeak_ng", int,
     f"utterances of test_espeak_ng, spoken by eSpeak NG's held-out variants {_D}"),
    ("num_test_flite", int, f"utterances of test_flite, spoken by flite's held-out voice {_D}"),
    ("test_engine_speakers", int, f"speakers of each engine test split {_D}"),
    ("babble_speakers", int, f"speakers per babble file {_D}"),
    ("babble_seconds", float, "length of each babble file (0: none)"),
    ("babble_overlap", int, "talkers summed in the babble"),
    ("seed", int, f"random seed {_D}"),
    ("nuisance", float, "video nuisance strength (0: none, 1: default)"),
    ("target_jitter", float, "articulation variation"),
)


def _add_numbers(p: argparse.ArgumentParser, rows: tuple) -> None:
    """``--<field>`` options of ``(field, type, help)`` rows, defaults from :class:`SynthGridConfig`."""
    for field, kind, text in rows:
        default = getattr(SynthGridConfig, field)
        p.add_argument("--" + field.replace("_", "-"), type=kind, default=default, help=text)


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (defaults are those of :class:`SynthGridConfig`)."""
    d = SynthGridConfig()
    p = argparse.ArgumentParser(
        prog="python -m avsr.bin.synthgrid",
        description="Generate the SynthGRID audio-visual corpus (deterministic given --seed, resumable).",
    )
    p.add_argument("--out", help="corpus directory (required unless --list-voices)")
    p.add_argument("--list-voices", action="store_true",
                   help="print every voice of every engine with how it sounds (markdown) and exit")
    _add_numbers(p, _SPLITS)
    p.add_argument("--train-voices", default=",".join(d.train_voices),
                   help=f"comma-separated festival voices of train/valid (default: all but the unseen ones; "
                   f"known: {','.join(sorted(VOICES))})")
    p.add_argument("--unseen-voices", default=",".join(d.unseen_voices),
                   help="comma-separated voices of test_unseen_voice (default %(default)s)")
    p.add_argument("--train-corpus", choices=TRAIN_CORPORA, default=d.train_corpus,
                   help="english: train/valid of the three English voices, clean (the first corpora's); "
                   "voices: every --train-voices voice, wider speaker ranges, speed perturbation and "
                   "acoustic augmentation (default %(default)s)")
    p.add_argument("--no-augment", action="store_true",
                   help="no acoustic augmentation and speed perturbation of train/valid")
    _add_numbers(p, _ACCENTED)
    p.add_argument("--engines", default=",".join(d.engines),
                   help=f"comma-separated synthesisers of train/valid/training babble ({','.join(ENGINES)}) "
                   "(default %(default)s: the festival-only corpus, file for file)")
    p.add_argument("--hold-out-engines", default="",
                   help="engines left out of --engines (leave-one-engine-out: train without them; their "
                   "held-out voices speak test_espeak_ng / test_flite)")
    _add_numbers(p, _ENGINE_TESTS)
    p.add_argument("--nj", type=int, default=1, help="worker processes (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=50, help="utterances per festival process")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


@tool("avsr-synthgrid")
def main(argv: list[str] | None = None) -> int | None:
    """Entry point of ``python -m avsr.bin.synthgrid`` / ``avsr-synthgrid``; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.list_voices:
        print(catalogue_markdown(), end="")
        return 0
    if not args.out:
        raise UsageError("--out is required (the corpus directory)")
    held = [e for e in args.hold_out_engines.split(",") if e]
    unknown = [e for e in held if e not in ENGINES]
    if unknown:
        raise UsageError(f"--hold-out-engines: unknown engine(s) {unknown}; known: {list(ENGINES)}")
    setup_logging()
    config = SynthGridConfig(
        **{field: getattr(args, field) for field, _, _ in (*_SPLITS, *_ACCENTED, *_ENGINE_TESTS)},
        train_voices=tuple(v for v in args.train_voices.split(",") if v),
        unseen_voices=tuple(v for v in args.unseen_voices.split(",") if v),
        speed_factors=(1.0,) if args.no_augment else SynthGridConfig.speed_factors,
        augment=None if args.no_augment else SynthGridConfig().augment,
        train_corpus=args.train_corpus,
        engines=tuple(e for e in args.engines.split(",") if e and e not in held),
    )
    try:
        generate(args.out, config, nj=args.nj, batch_size=args.batch_size, progress=not args.no_progress)
    except (FestivalError, EngineError):
        raise  # a data/runtime error (avsr.bin.runner)
    except ValueError as exc:  # bad options, or another corpus already in --out
        raise UsageError(str(exc)) from exc
    return 0


if __name__ == "__main__":
    sys.exit(main())
