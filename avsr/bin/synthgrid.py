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
import logging
import sys

from avsr.bin.runner import UsageError, tool
from avsr.corpora.synthgrid.engines import ENGINES, EngineError, catalogue_markdown
from avsr.corpora.synthgrid.festival import FestivalError
from avsr.corpora.synthgrid.generate import TRAIN_CORPORA, SynthGridConfig, generate
from avsr.corpora.synthgrid.voices import VOICES


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
    p.add_argument(
        "--num-train", type=int, default=d.num_train, help="train utterances (default %(default)s)"
    )
    p.add_argument(
        "--num-valid", type=int, default=d.num_valid, help="valid utterances (default %(default)s)"
    )
    p.add_argument("--num-test", type=int, default=d.num_test, help="test utterances (default %(default)s)")
    p.add_argument("--train-speakers", type=int, default=d.train_speakers, help="default %(default)s")
    p.add_argument("--valid-speakers", type=int, default=d.valid_speakers, help="default %(default)s")
    p.add_argument("--test-speakers", type=int, default=d.test_speakers, help="default %(default)s")
    p.add_argument("--num-test-unseen-voice", type=int, default=d.num_test_unseen_voice,
                   help="utterances of test_unseen_voice, spoken by voices in no training utterance "
                   "(default %(default)s)")
    p.add_argument("--test-unseen-voice-speakers", type=int, default=d.test_unseen_voice_speakers,
                   help="default %(default)s")
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
    p.add_argument("--num-train-accented", type=int, default=d.num_train_accented,
                   help="english corpus: training utterances added in the accented voices (the non-English "
                   "--train-voices), clean, by speakers of their own (default %(default)s)")
    p.add_argument("--train-accented-speakers", type=int, default=d.train_accented_speakers,
                   help="speakers of those utterances (default %(default)s)")
    p.add_argument("--engines", default=",".join(d.engines),
                   help=f"comma-separated synthesisers of train/valid/training babble ({','.join(ENGINES)}) "
                   "(default %(default)s: the festival-only corpus, file for file)")
    p.add_argument("--hold-out-engines", default="",
                   help="engines left out of --engines (leave-one-engine-out: train without them; their "
                   "held-out voices speak test_espeak_ng / test_flite)")
    p.add_argument("--num-test-espeak-ng", type=int, default=d.num_test_espeak_ng,
                   help="utterances of test_espeak_ng, spoken by eSpeak NG's held-out variants "
                   "(default %(default)s)")
    p.add_argument("--num-test-flite", type=int, default=d.num_test_flite,
                   help="utterances of test_flite, spoken by flite's held-out voice (default %(default)s)")
    p.add_argument("--test-engine-speakers", type=int, default=d.test_engine_speakers,
                   help="speakers of each engine test split (default %(default)s)")
    p.add_argument(
        "--babble-speakers",
        type=int,
        default=d.babble_speakers,
        help="speakers per babble file (default %(default)s)",
    )
    p.add_argument(
        "--babble-seconds", type=float, default=d.babble_seconds, help="length of each babble file (0: none)"
    )
    p.add_argument(
        "--babble-overlap", type=int, default=d.babble_overlap, help="talkers summed in the babble"
    )
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default %(default)s)")
    p.add_argument(
        "--nuisance", type=float, default=d.nuisance, help="video nuisance strength (0: none, 1: default)"
    )
    p.add_argument("--target-jitter", type=float, default=d.target_jitter, help="articulation variation")
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
    engines = tuple(e for e in args.engines.split(",") if e and e not in held)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = SynthGridConfig(
        num_train=args.num_train,
        num_valid=args.num_valid,
        num_test=args.num_test,
        train_speakers=args.train_speakers,
        valid_speakers=args.valid_speakers,
        test_speakers=args.test_speakers,
        num_test_unseen_voice=args.num_test_unseen_voice,
        test_unseen_voice_speakers=args.test_unseen_voice_speakers,
        train_voices=tuple(v for v in args.train_voices.split(",") if v),
        unseen_voices=tuple(v for v in args.unseen_voices.split(",") if v),
        speed_factors=(1.0,) if args.no_augment else SynthGridConfig.speed_factors,
        augment=None if args.no_augment else SynthGridConfig().augment,
        train_corpus=args.train_corpus,
        num_train_accented=args.num_train_accented,
        train_accented_speakers=args.train_accented_speakers,
        babble_speakers=args.babble_speakers,
        babble_seconds=args.babble_seconds,
        babble_overlap=args.babble_overlap,
        seed=args.seed,
        nuisance=args.nuisance,
        target_jitter=args.target_jitter,
        engines=engines,
        num_test_espeak_ng=args.num_test_espeak_ng,
        num_test_flite=args.num_test_flite,
        test_engine_speakers=args.test_engine_speakers,
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
