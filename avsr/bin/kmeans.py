"""Fit k-means on dumped features, and write cluster labels for a data dir.

``fit``: ``MiniBatchKMeans`` (AV-HuBERT's ``learn_kmeans.py`` settings by default) on a random subset of the
shards ``<feat-dir>/<split>_*_*`` (``--percent`` of the utterances, as the original; ``--max-frames`` at most
so many frames), saved with joblib to ``--km`` (plus ``<km>.json``).
``apply``: the nearest centre of every frame of the shards of a data dir, written as ``<data-dir>/<name>.km``
(``<utt-id> l1 l2 ...``, one label per feature frame: 100 Hz for MFCC, 25 Hz for layer features) and
``<name>.km.json``; rerun it to redo the labels from the saved model.

Usage::

    python -m avsr.bin.kmeans fit --feat-dir exp/kmeans/mfcc --split train --km exp/kmeans/mfcc/km.joblib \\
        --n-clusters 100 --percent 0.1
    python -m avsr.bin.kmeans apply --feat-dir exp/kmeans/mfcc --split train --km exp/kmeans/mfcc/km.joblib \\
        --data-dir data/train --name km_mfcc100
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from avsr.bin import setup_logging
from avsr.bin.runner import tool
from avsr.clustering.kmeans import KMeansConfig, fit_kmeans_on_shards, write_kmeans_labels
from avsr.clustering.shards import find_shards

logger = logging.getLogger("avsr.kmeans")


#: the KMeansConfig fields of ``fit``'s options (``--max-iter`` for ``max_iter``), in the order of --help
_FIT_SETTINGS = ("seed", "init", "max_iter", "batch_size", "tol", "max_no_improvement", "n_init",
                 "reassignment_ratio")


def _fit(args: argparse.Namespace) -> None:
    """``fit``: k-means on the shards (:func:`avsr.clustering.kmeans.fit_kmeans_on_shards`)."""
    config = KMeansConfig(n_clusters=args.n_clusters, **{name: getattr(args, name) for name in _FIT_SETTINGS})
    fit_kmeans_on_shards(args.feat_dir, args.split, args.km, config, args.percent, args.max_frames,
                         verbose=args.verbose)


def _apply(args: argparse.Namespace) -> None:
    """``apply``: the labels of a data dir (:func:`avsr.clustering.kmeans.write_kmeans_labels`)."""
    shards = find_shards(args.feat_dir, args.split)
    write_kmeans_labels(shards, args.km, args.data_dir, args.name, args.device)


@tool("avsr-kmeans")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    defaults = KMeansConfig()
    fit = sub.add_parser("fit", help="fit k-means on feature shards")
    apply = sub.add_parser("apply", help="write the labels of a data dir")
    for q in (fit, apply):
        q.add_argument("--feat-dir", required=True, type=Path, help="directory of the feature shards")
        q.add_argument("--split", required=True, help="shard name prefix (<split>_<rank>_<nshard>)")
        q.add_argument("--km", required=True, type=Path, help="the k-means model file (km.joblib)")
    fit.add_argument("--n-clusters", type=int, default=defaults.n_clusters, help="K (default: %(default)s)")
    fit.add_argument("--percent", type=float, default=-1.0,
                     help="fraction of each shard's utterances to fit on; negative: all (default)")
    fit.add_argument("--max-frames", type=int, help="fit on at most this many frames (random)")
    for name in _FIT_SETTINGS:  # KMeansConfig's, with its defaults
        default = getattr(defaults, name)
        fit.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    fit.add_argument("--verbose", type=int, default=0, help="scikit-learn verbosity")
    apply.add_argument("--data-dir", required=True, type=Path, help="data dir the features were dumped from")
    apply.add_argument("--name", default="km", help="labels go to <data-dir>/<name>.km (default: km)")
    apply.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    setup_logging()
    _fit(args) if args.command == "fit" else _apply(args)


if __name__ == "__main__":
    sys.exit(main())
