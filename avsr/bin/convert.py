"""Convert an official AV-HuBERT checkpoint (fairseq) into avsr's own checkpoint and YAML configuration.

In: a fairseq ``av_hubert`` (pretraining), ``av_hubert_seq2seq`` or ``av_hubert_ctc`` checkpoint (or an avsr
one, which is rewritten). Out:

* ``OUT.pt``: ``{"model": state_dict, "model_config": ..., "converted_from": {...}}`` -- the format the
  trainer writes, so ``AVSRModel.from_pretrained``, ``python -m avsr.bin.decode --checkpoint`` and
  fine-tuning read it; for a pretraining checkpoint the state dict is the encoder's and ``model_config`` is
  ``{"encoder_conf": ...}`` (read by ``AVHubertEncoder.from_pretrained``);
* ``OUT.yaml`` (or ``--config``): ``model_config`` as YAML (``vocab_size``, ``encoder_conf``,
  ``decoder_conf``, ``model_conf``, ``token_list``; or ``encoder_conf`` alone), usable as a model
  configuration;
* with ``--write-bpemodel PATH``: the sentencepiece model pickled inside a fine-tuned checkpoint, if any.

See :mod:`avsr.models.convert`.

Usage: ``avsr-convert large_vox_433h.pt exp/avhubert/model.pt [--bpemodel spm1000/spm_unigram1000.model]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import tool
from avsr.models.convert import convert


@tool("avsr-convert")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="official AV-HuBERT checkpoint (or an avsr one)")
    p.add_argument("output", type=Path, help="avsr checkpoint to write")
    p.add_argument("--config", type=Path, default=None,
                   help="YAML configuration to write (default: OUTPUT.yaml)")
    p.add_argument("--dict", type=Path, default=None, help="fairseq dict.txt of the target tokens")
    p.add_argument("--bpemodel", type=Path, default=None,
                   help="sentencepiece model the dictionary is built from, when the checkpoint pickles none")
    p.add_argument("--write-bpemodel", type=Path, default=None,
                   help="write the sentencepiece model pickled in the checkpoint here")
    args = p.parse_args(argv)
    setup_logging()
    convert(args.checkpoint, args.output, args.config, args.dict, args.bpemodel, args.write_bpemodel)
    print(args.output)


if __name__ == "__main__":
    sys.exit(main())
