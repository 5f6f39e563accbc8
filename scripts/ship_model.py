#!/usr/bin/env python3
"""Make the shipped model ``avsr/pretrained/<name>/`` from a trained experiment directory.

Writes ``model.pt`` (the average of the experiment's best epochs, as decoding averages them: the model, its
configuration and the trainer's ``data_stats``), copies ``bpe.model`` and the decoding configuration
(``decode.yaml``), and one test utterance as the model's example (``example.wav``, ``example.mp4``: its
16 kHz audio and 96x96 mouth ROI; ``example.txt``: its transcript). ``MODEL_CARD.md`` is written by hand.

Usage (from the repository root, after the SynthGRID main job)::

    .venv/bin/python scripts/ship_model.py recipes/synthgrid/avsr1/exp/avsr_synthgrid_cpu \\
        --decode-config recipes/synthgrid/avsr1/conf/decode/default.yaml \\
        --example recipes/synthgrid/avsr1/data/test --utt te000_pgix2s_0012 --name synthgrid
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

from avsr import __version__
from avsr.checkpoint import average_state_dicts, best_checkpoints, load_checkpoint
from avsr.data.datadir import read_datadir
from avsr.fileio import atomic_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("exp_dir", type=Path)
    p.add_argument("--decode-config", type=Path, required=True)
    p.add_argument("--example", type=Path, required=True, help="a data dir holding the example utterance")
    p.add_argument("--utt", required=True, help="the example's utterance id")
    p.add_argument("--name", default="synthgrid")
    p.add_argument("--nbest", type=int, default=5)
    args = p.parse_args(argv)
    out = Path(__file__).resolve().parents[1] / "avsr" / "pretrained" / args.name
    out.mkdir(parents=True, exist_ok=True)
    paths = best_checkpoints(args.exp_dir, args.nbest)
    first = load_checkpoint(paths[0])
    state = {"model": average_state_dicts(paths), "model_config": first["model_config"],
             "data_stats": first.get("data_stats") or {}, "avsr_version": __version__,
             "averaged": [q.name for q in paths]}
    with atomic_path(out / "model.pt") as tmp:
        torch.save(state, tmp)
    shutil.copyfile(args.exp_dir / "bpe.model", out / "bpe.model")
    shutil.copyfile(args.decode_config, out / "decode.yaml")
    utt = {u.utt_id: u for u in read_datadir(args.example)}[args.utt]
    shutil.copyfile(utt.wav, out / "example.wav")
    shutil.copyfile(utt.video, out / "example.mp4")
    (out / "example.txt").write_text(utt.text + "\n")
    print(f"{out}: model.pt (average of {', '.join(q.name for q in paths)}), bpe.model, decode.yaml, example")
    return 0


if __name__ == "__main__":
    sys.exit(main())
