"""Train the sentencepiece tokenizer on the transcripts of a data dir and write the token list.

Writes ``<out>/bpe.model``, ``<out>/bpe.vocab`` and ``<out>/tokens.txt`` (ESPnet token list: ``<blank>``,
``<unk>``, the pieces, ``<sos/eos>``, one per line).

The transcripts must be UTF-8 and none empty (:func:`avsr.data.datadir.read_kaldi_map` names the line and
utterance otherwise); an empty ``--text`` is refused, and every transcript is checked to encode without
``<unk>`` once the model is trained.

See :func:`avsr.data.tokenizer.train_tokenizer`.

Usage: ``python -m avsr.bin.tokenizer --text data/train/text --out data/token_list --vocab-size 64``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import tool
from avsr.data.tokenizer import train_tokenizer


@tool("avsr-tokenizer")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", required=True, type=Path, help="Kaldi text file (<utt-id> <transcript>)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--vocab-size", type=int, default=64)
    p.add_argument("--model-type", default="unigram", choices=["unigram", "bpe", "char", "word"])
    args = p.parse_args(argv)
    setup_logging()
    train_tokenizer(args.text, args.out, args.vocab_size, args.model_type)


if __name__ == "__main__":
    sys.exit(main())
