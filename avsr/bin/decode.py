"""Decode a test set under every modality and noise condition (the recipe's decoding stage), with
:func:`avsr.inference.decode_dir.decode_test_set` (whose module documents the stage: outputs, resuming,
settings, missing media, the model chosen); ``--help`` prints it.

Usage: ``python -m avsr.bin.decode --exp-dir exp/x --data data/test --test-set test --decode-config
conf/decode/default.yaml [--noise-file babble.wav --snrs 10 5 0 -5] --out exp/x/decode``, or
``python -m avsr.bin.decode --checkpoint large_vox_433h.pt --bpemodel spm_unigram1000.model --data data/test
--decode-config conf/decode/avhubert_s2s.yaml --out decode``
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import UsageError, tool
from avsr.inference import decode_dir, inference_device, parse_edge_frames
from avsr.inference.decode_dir import DecodeJob, SettingsConflict, decode_test_set
from avsr.modalities import MODALITY_INPUTS
from avsr.nn.precision import PRECISIONS
from avsr.threads import parse_threads

logger = logging.getLogger("avsr.decode")


def _parser() -> argparse.ArgumentParser:
    """The command line of the tool (see the module docstring)."""
    p = argparse.ArgumentParser(description=f"{decode_dir.__doc__}\n{__doc__}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exp-dir", type=Path, default=None, help="training dir (needed without --checkpoint)")
    p.add_argument("--data", required=True, type=Path, help="test data dir")
    p.add_argument("--test-set", default=None, help="name in the results (default: data dir name)")
    p.add_argument("--decode-config", required=True, help="decoding YAML (a path or a shipped name)")
    p.add_argument("--bpemodel", type=Path, default=None, help="default: <exp-dir>/bpe.model")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="decode this checkpoint (avsr's or an official AV-HuBERT one), no averaging")
    p.add_argument("--average-nbest", type=int, default=5)
    p.add_argument("--modalities", nargs="+", default=list(MODALITY_INPUTS), choices=list(MODALITY_INPUTS))
    p.add_argument("--noise-file", type=Path, default=None)
    p.add_argument("--noise-name", default="babble")
    p.add_argument("--snrs", nargs="*", type=float, default=[10.0, 5.0, 0.0, -5.0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--batch-frames", type=int, default=3000)
    p.add_argument("--overwrite", action="store_true",
                   help="decode anew into a directory holding results made with other settings")
    p.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                   help="encoder precision (default fp32: the same WER on every machine; auto: bf16 "
                        "where the device computes it natively)")
    p.add_argument("--edge-frames", default="model",
                   help="silent 40 ms frames before and after each utterance's speech (the Transcriber's "
                   "edge_frames): 'model' (the middle half of the training audio's, when the checkpoint "
                   "records them), 'off', or START,END, each a count or a range LO-HI")
    p.add_argument("--ngpu", type=int, default=0)
    p.add_argument("--num-threads", type=parse_threads, default=1,
                   help="CPU threads (the beam search's small tensor ops run fastest on 1; run test sets in "
                   "parallel processes instead), or 'auto': the cores other work leaves free "
                   "(avsr.threads)")
    return p


@tool("avsr-decode")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = _parser()
    args = p.parse_args(argv)
    if args.exp_dir is None and args.checkpoint is None:
        p.error("give --exp-dir (checkpoint averaging) or --checkpoint")
    try:
        edge_frames = parse_edge_frames(args.edge_frames)
    except ValueError as exc:
        p.error(f"--edge-frames: {exc}")
    setup_logging()

    device = inference_device("cuda" if args.ngpu > 0 else "cpu", args.num_threads, source="--num-threads")
    bpemodel = args.bpemodel
    if bpemodel is None and args.exp_dir is not None:
        bpemodel = args.exp_dir / "bpe.model"
    job = DecodeJob(
        source=args.checkpoint if args.checkpoint is not None else args.exp_dir, bpemodel=bpemodel,
        decode_config=args.decode_config, data=args.data, out=args.out,
        test_set=args.test_set or args.data.name,
        modalities=args.modalities, noise_file=args.noise_file, noise_name=args.noise_name, snrs=args.snrs,
        average_nbest=args.average_nbest, batch_frames=args.batch_frames, precision=args.precision,
        edge_frames=edge_frames, device=device, overwrite=args.overwrite)
    try:
        root = decode_test_set(job)
    except SettingsConflict as exc:
        raise UsageError(f"{exc}: decode into another --out, or pass --overwrite") from exc
    logger.info("decoding written under %s", os.fspath(root))


if __name__ == "__main__":
    sys.exit(main())
