"""The ``avsr`` command: one entry point whose subcommands are the tools of :mod:`avsr.bin`.

``avsr transcribe VIDEO.mp4 --checkpoint exp/x`` runs ``python -m avsr.bin.transcribe VIDEO.mp4 --checkpoint
exp/x``; every subcommand passes its arguments unchanged to that tool's ``main(argv)``, so ``avsr
<subcommand> --help`` shows the tool's own help. A subcommand is a name in :data:`SUBCOMMANDS` mapped to a
module with a ``main(argv: list[str] | None) -> int | None``; the module is imported only when its
subcommand runs, so ``avsr --help`` is fast and a tool's optional dependencies (MediaPipe, matplotlib) are
needed only by that tool. Adding a tool is adding one line to the table.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["SUBCOMMANDS", "main"]

#: subcommand -> (module, one-line description)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "transcribe": ("avsr.bin.transcribe", "raw face videos -> transcripts with word timings"),
    "synthgrid": ("avsr.bin.synthgrid", "generate the SynthGRID corpus"),
    "preprocess-roi": ("avsr.bin.preprocess_roi", "raw face videos -> mouth ROI mp4 + 16 kHz wav"),
    "prepare-data": ("avsr.bin.prepare_data", "corpus layout -> Kaldi data dirs"),
    "subset-data": ("avsr.bin.subset_data", "a random subset of a data dir"),
    "edge-test": ("avsr.bin.edge_sets", "a test data dir with other silences at the edges"),
    "lip-sets": ("avsr.bin.lip_sets", "test data dirs with other lips: another utterance's, frozen, a photo"),
    "tokenizer": ("avsr.bin.tokenizer", "train the sentencepiece tokenizer"),
    "dump-features": ("avsr.bin.dump_features", "features for k-means clustering"),
    "kmeans": ("avsr.bin.kmeans", "fit / apply k-means cluster labels"),
    "cluster-quality": ("avsr.bin.cluster_quality", "cluster purity against phone alignments"),
    "train": ("avsr.bin.train", "train or pretrain a model"),
    "decode": ("avsr.bin.decode", "decode a test set under every modality and noise condition"),
    "score": ("avsr.bin.score", "WER tables, results.json and plot"),
    "convert": ("avsr.bin.convert", "official AV-HuBERT checkpoint -> avsr checkpoint"),
    "demo": ("avsr.bin.demo", "a local web page: upload or record audio/video, see the transcripts"),
}


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = [
        "usage: avsr <subcommand> [arguments]   (avsr <subcommand> --help for its options; avsr --version)",
        "",
        "subcommands:",
    ]
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``avsr <subcommand> [arguments]``; returns the exit status (2 for an unknown subcommand).

    Raises:
        SystemExit: from the tool's argument parser (``--help``, bad options), as when it runs alone.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from avsr import __version__

        print(f"avsr {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"avsr: unknown subcommand {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    status = module.main(rest)
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
