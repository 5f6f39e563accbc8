"""Dump the features of a data dir for k-means: MFCC (first iteration) or an encoder layer (later ones).

Writes shard ``rank`` of ``nshard`` (all shards, one after the other, when ``--rank`` is not given) as
``<feat-dir>/<split>_<rank>_<nshard>.{npy,len,json}`` (see :mod:`avsr.clustering.shards`); a finished shard of
the same features is skipped, so an interrupted run can be started again. Features are for k-means only.

- ``--feature mfcc``: 39-dim MFCC + deltas at 100 Hz from the wav (HuBERT's first iteration).
- ``--feature layer --checkpoint CKPT --layer L``: output of transformer layer L of the checkpoint's encoder
  at 25 Hz (``encoder_embed_dim`` dims), from both streams (``--modality audiovisual``, AV-HuBERT's choice)
  or one; utterances are batched (``--batch-frames`` padded 25 Hz frames per batch).

Usage::

    python -m avsr.bin.dump_features --data-dir data/train --feat-dir exp/kmeans/mfcc --feature mfcc
    python -m avsr.bin.dump_features --data-dir data/train --feat-dir exp/kmeans/iter2 --feature layer \\
        --checkpoint exp/pretrain_iter1/valid.best.pt --layer 6 --nshard 4 --rank 0 --device cuda
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from avsr.bin import setup_logging
from avsr.bin.runner import tool
from avsr.clustering.extract import MfccExtractor, layer_extractor
from avsr.clustering.shards import dump_data_dir
from avsr.modalities import MODALITIES

logger = logging.getLogger("avsr.dump_features")


@tool("avsr-dump-features")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True, type=Path, help="Kaldi-style data dir (wav.scp, video.scp)")
    p.add_argument("--feat-dir", required=True, type=Path, help="output directory of the feature shards")
    p.add_argument("--split", help="file name prefix of the shards (default: the data dir's name)")
    p.add_argument("--feature", required=True, choices=["mfcc", "layer"])
    p.add_argument("--checkpoint", type=Path, help="checkpoint whose encoder gives the layer features")
    p.add_argument("--layer", type=int, help="transformer layer (1..encoder_layers) for --feature layer")
    p.add_argument("--modality", default="audiovisual", choices=MODALITIES,
                   help="streams the encoder sees (default: audiovisual)")
    p.add_argument("--nshard", type=int, default=1, help="number of shards (default: 1)")
    p.add_argument("--rank", type=int, help="write only this shard (default: all shards)")
    p.add_argument("--batch-frames", type=int, default=1000,
                   help="padded 25 Hz frames per encoder batch (default: 1000)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--overwrite", action="store_true", help="recompute finished shards")
    args = p.parse_args(argv)
    setup_logging()

    if args.feature == "layer":
        if args.checkpoint is None or args.layer is None:
            p.error("--feature layer needs --checkpoint and --layer")
        extractor = layer_extractor(args.checkpoint, args.layer, args.modality, args.device,
                                    args.batch_frames)
    else:
        if args.checkpoint is not None or args.layer is not None:
            p.error("--checkpoint and --layer are for --feature layer")
        extractor = MfccExtractor()
    num_utts = dump_data_dir(args.data_dir, extractor, args.feat_dir, args.split, args.nshard, args.rank,
                             args.overwrite)
    logger.info("%s: %s features of %d utterances in %s (%s_*_%d)", args.data_dir, extractor.description,
                num_utts, args.feat_dir, args.split or args.data_dir.name, args.nshard)


if __name__ == "__main__":
    sys.exit(main())
